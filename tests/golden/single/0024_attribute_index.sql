CREATE TABLE IF NOT EXISTS dim_keys
(
    `project_id` UInt64,
    `key` String,
    `declared_at` DateTime64(3, 'UTC'),
    `ready` UInt8,
    `removed` UInt8,
    `version` UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (project_id, key)
SETTINGS index_granularity = 8192, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS span_key_values
(
    `project_id` UInt64,
    `key` LowCardinality(String),
    `start_time` DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `trace_id` FixedString(32),
    `value` String CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(start_time)
ORDER BY (project_id, key, value, start_time)
TTL toDateTime(start_time) + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

