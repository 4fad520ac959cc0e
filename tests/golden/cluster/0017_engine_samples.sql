CREATE TABLE IF NOT EXISTS engine_samples_local ON CLUSTER `tracedash`
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/engine_samples_local', '{replica}')
PARTITION BY toDate(time)
ORDER BY (project_id, metric, engine, target, model, le, time)
TTL toDateTime(time) + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS engine_samples ON CLUSTER `tracedash` AS engine_samples_local
ENGINE = Distributed('tracedash', 'tracedash', engine_samples_local, cityHash64(project_id, metric, engine, target, model, le));

