CREATE TABLE IF NOT EXISTS engine_samples
(
    `project_id` UInt64,
    `time` DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `host` LowCardinality(String),
    `engine` LowCardinality(String),
    `target` LowCardinality(String),
    `model` LowCardinality(String),
    `metric` LowCardinality(String),
    `le` Float64,
    `value` Float64 CODEC(Gorilla, ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(time)
ORDER BY (project_id, metric, engine, target, model, le, time)
TTL toDateTime(time) + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

