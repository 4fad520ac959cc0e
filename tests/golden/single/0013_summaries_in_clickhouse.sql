ALTER TABLE spans ADD COLUMN IF NOT EXISTS `loadtest_run_id` String DEFAULT attributes['loadtest.run_id'] CODEC(ZSTD(1));

ALTER TABLE traces ADD COLUMN IF NOT EXISTS `spans_digest` UInt64 DEFAULT 0, ADD COLUMN IF NOT EXISTS `loadtest` UInt8 DEFAULT 0;

ALTER TABLE traces_by_start ADD COLUMN IF NOT EXISTS `spans_digest` UInt64 DEFAULT 0, ADD COLUMN IF NOT EXISTS `loadtest` UInt8 DEFAULT 0;

DROP VIEW IF EXISTS traces_by_start_mv;

CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv TO traces_by_start AS SELECT `project_id`, `trace_id`, `start_time`, `e2e_ns`, `has_root`, `spans_start`, `spans_end`, `root_name`, `service`, `model`, `services`, `models`, `phases`, `status`, `error_message`, `ttft_ns`, `tpot_ns`, `input_tokens`, `output_tokens`, `cost_usd`, `cost_estimated`, `span_count`, `network_ns`, `preprocess_ns`, `inference_ns`, `postprocess_ns`, `other_ns`, `version`, `error_spans`, `model_input_tokens`, `model_output_tokens`, `model_cost_usd`, `spans_digest`, `loadtest` FROM traces;

