ALTER TABLE traces_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `error_spans` UInt32 CODEC(T64, ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE traces ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `error_spans` UInt32 CODEC(T64, ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE traces_by_start_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `error_spans` UInt32 CODEC(T64, ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE traces_by_start ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `error_spans` UInt32 CODEC(T64, ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_minute_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_minute ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_hour_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_hour ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_6h_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_6h ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_day_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_day ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_hour_all_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_hour_all ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_6h_all_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_6h_all ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_day_all_local ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

ALTER TABLE rollup_day_all ON CLUSTER `tracedash` ADD COLUMN IF NOT EXISTS `recovered` UInt64, ADD COLUMN IF NOT EXISTS `error_spans` UInt64, ADD COLUMN IF NOT EXISTS `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)), ADD COLUMN IF NOT EXISTS `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1));

DROP VIEW IF EXISTS traces_by_start_mv ON CLUSTER `tracedash`;

CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv ON CLUSTER `tracedash` TO traces_by_start_local AS SELECT `project_id`, `trace_id`, `start_time`, `e2e_ns`, `has_root`, `spans_start`, `spans_end`, `root_name`, `service`, `model`, `services`, `models`, `phases`, `status`, `error_message`, `ttft_ns`, `tpot_ns`, `input_tokens`, `output_tokens`, `cost_usd`, `cost_estimated`, `span_count`, `network_ns`, `preprocess_ns`, `inference_ns`, `postprocess_ns`, `other_ns`, `version`, `error_spans`, `model_input_tokens`, `model_output_tokens`, `model_cost_usd` FROM traces_local;

