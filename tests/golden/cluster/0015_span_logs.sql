CREATE TABLE IF NOT EXISTS span_logs_local ON CLUSTER `tracedash`
(
    `project_id` UInt64,
    `trace_id` FixedString(32),
    `span_id` String CODEC(ZSTD(1)),
    `time` DateTime64(9, 'UTC') CODEC(ZSTD(1)),
    `event_name` LowCardinality(String),
    `severity` LowCardinality(String),
    `body` String CODEC(ZSTD(1)),
    `attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `service` LowCardinality(String),
    `resource_attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `ingested_at` DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/span_logs_local', '{replica}')
PARTITION BY toDate(time)
ORDER BY (project_id, trace_id, time)
TTL toDateTime(time) + toIntervalDay(30)
SETTINGS index_granularity = 1024, min_compress_block_size = 4096, max_compress_block_size = 65536, ttl_only_drop_parts = 1, replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS span_logs ON CLUSTER `tracedash` AS span_logs_local
ENGINE = Distributed('tracedash', 'tracedash', span_logs_local, cityHash64(trace_id));

