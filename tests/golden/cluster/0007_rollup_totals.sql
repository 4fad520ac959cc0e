CREATE TABLE IF NOT EXISTS rollup_hour_all_local ON CLUSTER `tracedash`
(
    `project_id` UInt64,
    `bucket` DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)),
    `service` LowCardinality(String),
    `model` LowCardinality(String),
    `requests` UInt64,
    `errors` UInt64,
    `e2e_sum_ns` UInt64,
    `e2e_max_ns` UInt64,
    `input_tokens` UInt64,
    `output_tokens` UInt64,
    `cost_usd` Float64,
    `cost_requests` UInt64,
    `cost_estimated_requests` UInt64,
    `ttft_sum_ns` UInt64,
    `ttft_count` UInt64,
    `tpot_sum_ns` Float64,
    `tpot_count` UInt64,
    `network_sum_ns` UInt64,
    `preprocess_sum_ns` UInt64,
    `inference_sum_ns` UInt64,
    `postprocess_sum_ns` UInt64,
    `other_sum_ns` UInt64,
    `e2e_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `ttft_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `tpot_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `network_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `preprocess_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `inference_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `postprocess_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `other_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `version` UInt64,
    `recovered` UInt64,
    `error_spans` UInt64,
    `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)),
    `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)),
    `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rollup_hour_all_local', '{replica}', version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (project_id, bucket, service, model)
TTL bucket + toIntervalDay(400)
SETTINGS index_granularity = 32, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS rollup_hour_all ON CLUSTER `tracedash` AS rollup_hour_all_local
ENGINE = Distributed('tracedash', 'tracedash', rollup_hour_all_local, cityHash64(project_id, bucket, service, model));

CREATE TABLE IF NOT EXISTS rollup_day_all_local ON CLUSTER `tracedash`
(
    `project_id` UInt64,
    `bucket` DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)),
    `service` LowCardinality(String),
    `model` LowCardinality(String),
    `requests` UInt64,
    `errors` UInt64,
    `e2e_sum_ns` UInt64,
    `e2e_max_ns` UInt64,
    `input_tokens` UInt64,
    `output_tokens` UInt64,
    `cost_usd` Float64,
    `cost_requests` UInt64,
    `cost_estimated_requests` UInt64,
    `ttft_sum_ns` UInt64,
    `ttft_count` UInt64,
    `tpot_sum_ns` Float64,
    `tpot_count` UInt64,
    `network_sum_ns` UInt64,
    `preprocess_sum_ns` UInt64,
    `inference_sum_ns` UInt64,
    `postprocess_sum_ns` UInt64,
    `other_sum_ns` UInt64,
    `e2e_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `ttft_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `tpot_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `network_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `preprocess_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `inference_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `postprocess_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `other_hist` Map(UInt16, UInt64) CODEC(ZSTD(1)),
    `version` UInt64,
    `recovered` UInt64,
    `error_spans` UInt64,
    `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)),
    `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)),
    `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rollup_day_all_local', '{replica}', version)
PARTITION BY toYear(bucket)
ORDER BY (project_id, bucket, service, model)
TTL bucket + toIntervalDay(1830)
SETTINGS index_granularity = 32, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS rollup_day_all ON CLUSTER `tracedash` AS rollup_day_all_local
ENGINE = Distributed('tracedash', 'tracedash', rollup_day_all_local, cityHash64(project_id, bucket, service, model));

