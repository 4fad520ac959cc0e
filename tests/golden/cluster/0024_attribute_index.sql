CREATE TABLE IF NOT EXISTS dim_keys_local ON CLUSTER `tracedash`
(
    `project_id` UInt64,
    `key` String,
    `declared_at` DateTime64(3, 'UTC'),
    `ready` UInt8,
    `removed` UInt8,
    `version` UInt64
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/dim_keys_local', '{replica}', version)
ORDER BY (project_id, key)
SETTINGS index_granularity = 8192, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS dim_keys ON CLUSTER `tracedash` AS dim_keys_local
ENGINE = Distributed('tracedash', 'tracedash', dim_keys_local, cityHash64(project_id, key));

CREATE TABLE IF NOT EXISTS span_key_values_local ON CLUSTER `tracedash`
(
    `project_id` UInt64,
    `key` LowCardinality(String),
    `start_time` DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `trace_id` FixedString(32),
    `value` String CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/span_key_values_local', '{replica}')
PARTITION BY toDate(start_time)
ORDER BY (project_id, key, value, start_time)
TTL toDateTime(start_time) + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS span_key_values ON CLUSTER `tracedash` AS span_key_values_local
ENGINE = Distributed('tracedash', 'tracedash', span_key_values_local, cityHash64(trace_id));

