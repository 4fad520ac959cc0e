CREATE TABLE IF NOT EXISTS traces
(
    `project_id` UInt64,
    `trace_id` FixedString(32),
    `start_time` DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `e2e_ns` UInt64 CODEC(T64, ZSTD(1)),
    `has_root` UInt8,
    `spans_start` DateTime64(9, 'UTC') CODEC(ZSTD(1)),
    `spans_end` DateTime64(9, 'UTC') CODEC(ZSTD(1)),
    `root_name` LowCardinality(String),
    `service` LowCardinality(String),
    `model` LowCardinality(String),
    `services` Array(LowCardinality(String)),
    `models` Array(LowCardinality(String)),
    `phases` Array(LowCardinality(String)),
    `status` LowCardinality(String),
    `error_message` String CODEC(ZSTD(1)),
    `ttft_ns` Nullable(UInt64) CODEC(ZSTD(1)),
    `tpot_ns` Nullable(Float64) CODEC(ZSTD(1)),
    `input_tokens` UInt64 CODEC(T64, ZSTD(1)),
    `output_tokens` UInt64 CODEC(T64, ZSTD(1)),
    `cost_usd` Nullable(Float64) CODEC(ZSTD(1)),
    `cost_estimated` UInt8,
    `span_count` UInt32 CODEC(T64, ZSTD(1)),
    `network_ns` UInt64 CODEC(T64, ZSTD(1)),
    `preprocess_ns` UInt64 CODEC(T64, ZSTD(1)),
    `inference_ns` UInt64 CODEC(T64, ZSTD(1)),
    `postprocess_ns` UInt64 CODEC(T64, ZSTD(1)),
    `other_ns` UInt64 CODEC(T64, ZSTD(1)),
    `version` UInt64,
    `error_spans` UInt32 CODEC(T64, ZSTD(1)),
    `model_input_tokens` Map(String, UInt64) CODEC(ZSTD(1)),
    `model_output_tokens` Map(String, UInt64) CODEC(ZSTD(1)),
    `model_cost_usd` Map(String, Float64) CODEC(ZSTD(1)),
    `spans_digest` UInt64 DEFAULT 0,
    `loadtest` UInt8 DEFAULT 0,
    `cache` UInt8,
    INDEX idx_start start_time TYPE minmax GRANULARITY 1,
    INDEX idx_service service TYPE set(256) GRANULARITY 4
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (project_id, trace_id)
TTL toDateTime(start_time) + toIntervalDay(30)
SETTINGS index_granularity = 1024, min_compress_block_size = 4096, max_compress_block_size = 65536, non_replicated_deduplication_window = 10000, merge_selector_base = 20, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

ALTER TABLE spans ADD INDEX IF NOT EXISTS idx_ingested_at ingested_at TYPE minmax GRANULARITY 1;

ALTER TABLE spans MATERIALIZE INDEX idx_ingested_at;

