CREATE TABLE IF NOT EXISTS spans
(
    `project_id` UInt64,
    `trace_id` FixedString(32),
    `span_id` FixedString(16),
    `parent_span_id` String CODEC(ZSTD(1)),
    `name` LowCardinality(String),
    `phase` LowCardinality(String),
    `phase_fallback` UInt8,
    `cache` UInt8,
    `service` LowCardinality(String),
    `model` LowCardinality(String),
    `start_time` DateTime64(9, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `duration_ns` UInt64 CODEC(T64, ZSTD(1)),
    `status` LowCardinality(String),
    `status_message` String CODEC(ZSTD(1)),
    `ttft_ns` Nullable(UInt64) CODEC(ZSTD(1)),
    `input_tokens` Nullable(UInt32) CODEC(ZSTD(1)),
    `output_tokens` Nullable(UInt32) CODEC(ZSTD(1)),
    `cost_usd` Nullable(Float64) CODEC(ZSTD(1)),
    `attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `resource_attributes` Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    `event_times` Array(DateTime64(9, 'UTC')) CODEC(ZSTD(1)),
    `event_names` Array(LowCardinality(String)) CODEC(ZSTD(1)),
    `event_attributes` Array(Map(String, String)) CODEC(ZSTD(1)),
    `ingested_at` DateTime64(3, 'UTC') DEFAULT now64(3),
    `loadtest_run_id` String DEFAULT attributes['loadtest.run_id'] CODEC(ZSTD(1)),
    `dims` Map(LowCardinality(String), String) DEFAULT mapUpdate(mapFilter((k, v) -> v != '' AND length(v) <= 256, resource_attributes), mapFilter((k, v) -> v != '' AND length(v) <= 256, attributes)) CODEC(ZSTD(1)),
    INDEX idx_trace_id trace_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_duration duration_ns TYPE minmax GRANULARITY 4
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toDate(start_time)
ORDER BY (project_id, service, start_time, trace_id, span_id)
TTL toDateTime(start_time) + toIntervalDay(30)
SETTINGS index_granularity = 1024, min_compress_block_size = 4096, max_compress_block_size = 65536, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000, merge_selector_base = 20, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS resource_samples
(
    `project_id` UInt64,
    `time` DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    `host` LowCardinality(String),
    `gpu_index` Int16,
    `gpu_uuid` LowCardinality(String),
    `gpu_name` LowCardinality(String),
    `gpu_utilization` Nullable(Float32) CODEC(ZSTD(1)),
    `gpu_memory_used` Nullable(UInt64) CODEC(ZSTD(1)),
    `gpu_memory_total` Nullable(UInt64) CODEC(ZSTD(1)),
    `gpu_temperature` Nullable(Float32) CODEC(ZSTD(1)),
    `gpu_power_watts` Nullable(Float32) CODEC(ZSTD(1)),
    `cpu_percent` Nullable(Float32) CODEC(ZSTD(1)),
    `memory_used` Nullable(UInt64) CODEC(ZSTD(1)),
    `memory_total` Nullable(UInt64) CODEC(ZSTD(1)),
    `process_pids` Array(UInt32) CODEC(ZSTD(1)),
    `process_names` Array(String) CODEC(ZSTD(1)),
    `process_gpu_memory` Array(UInt64) CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(time)
ORDER BY (project_id, host, gpu_index, time)
TTL toDateTime(time) + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, non_replicated_deduplication_window = 10000, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

