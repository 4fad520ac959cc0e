CREATE TABLE IF NOT EXISTS scores
(
    `project_id` UInt64,
    `trace_id` FixedString(32),
    `span_id` String CODEC(ZSTD(1)),
    `name` LowCardinality(String),
    `score_id` String CODEC(ZSTD(1)),
    `data_type` LowCardinality(String),
    `value` Float64,
    `string_value` String CODEC(ZSTD(1)),
    `source` LowCardinality(String),
    `author` String CODEC(ZSTD(1)),
    `comment` String CODEC(ZSTD(1)),
    `time` DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `ingested_at` DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(ingested_at)
ORDER BY (project_id, trace_id, span_id, name, score_id)
TTL toDateTime(time) + toIntervalDay(30)
SETTINGS index_granularity = 8192, non_replicated_deduplication_window = 10000, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

