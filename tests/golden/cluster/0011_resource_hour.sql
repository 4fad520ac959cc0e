CREATE TABLE IF NOT EXISTS resource_hour_local ON CLUSTER `tracedash`
(
    `project_id` UInt64,
    `bucket` DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)),
    `host` LowCardinality(String),
    `gpu_index` Int16,
    `gpu_name` SimpleAggregateFunction(anyLast, String),
    `gpu_utilization_sum` SimpleAggregateFunction(sum, Float64),
    `gpu_utilization_n` SimpleAggregateFunction(sum, UInt64),
    `gpu_temperature_sum` SimpleAggregateFunction(sum, Float64),
    `gpu_temperature_n` SimpleAggregateFunction(sum, UInt64),
    `gpu_power_watts_sum` SimpleAggregateFunction(sum, Float64),
    `gpu_power_watts_n` SimpleAggregateFunction(sum, UInt64),
    `cpu_percent_sum` SimpleAggregateFunction(sum, Float64),
    `cpu_percent_n` SimpleAggregateFunction(sum, UInt64),
    `gpu_memory_percent_max` SimpleAggregateFunction(max, Float64),
    `memory_percent_max` SimpleAggregateFunction(max, Float64),
    `process_memory` SimpleAggregateFunction(maxMap, Tuple(Array(UInt32), Array(UInt64))),
    `process_names` SimpleAggregateFunction(groupUniqArrayArray, Array(Tuple(UInt32, String)))
)
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/resource_hour_local', '{replica}')
PARTITION BY toDate(bucket)
ORDER BY (project_id, host, gpu_index, bucket)
TTL bucket + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS resource_hour ON CLUSTER `tracedash` AS resource_hour_local
ENGINE = Distributed('tracedash', 'tracedash', resource_hour_local, cityHash64(project_id, host, gpu_index));

CREATE MATERIALIZED VIEW IF NOT EXISTS resource_hour_mv ON CLUSTER `tracedash` TO resource_hour_local AS SELECT project_id, toStartOfHour(bucket) AS bucket, host, gpu_index,
    anyLast(gpu_name) AS gpu_name,
    sum(gpu_utilization_sum) AS gpu_utilization_sum, sum(gpu_utilization_n) AS gpu_utilization_n,
    sum(gpu_temperature_sum) AS gpu_temperature_sum, sum(gpu_temperature_n) AS gpu_temperature_n,
    sum(gpu_power_watts_sum) AS gpu_power_watts_sum, sum(gpu_power_watts_n) AS gpu_power_watts_n,
    sum(cpu_percent_sum) AS cpu_percent_sum, sum(cpu_percent_n) AS cpu_percent_n,
    max(gpu_memory_percent_max) AS gpu_memory_percent_max,
    max(memory_percent_max) AS memory_percent_max,
    maxMap(process_memory) AS process_memory,
    groupUniqArrayArray(process_names) AS process_names
FROM resource_minute_local
GROUP BY project_id, bucket, host, gpu_index;

INSERT INTO resource_hour SELECT project_id, toStartOfHour(bucket) AS bucket, host, gpu_index,
    anyLast(gpu_name) AS gpu_name,
    sum(gpu_utilization_sum) AS gpu_utilization_sum, sum(gpu_utilization_n) AS gpu_utilization_n,
    sum(gpu_temperature_sum) AS gpu_temperature_sum, sum(gpu_temperature_n) AS gpu_temperature_n,
    sum(gpu_power_watts_sum) AS gpu_power_watts_sum, sum(gpu_power_watts_n) AS gpu_power_watts_n,
    sum(cpu_percent_sum) AS cpu_percent_sum, sum(cpu_percent_n) AS cpu_percent_n,
    max(gpu_memory_percent_max) AS gpu_memory_percent_max,
    max(memory_percent_max) AS memory_percent_max,
    maxMap(process_memory) AS process_memory,
    groupUniqArrayArray(process_names) AS process_names
FROM resource_minute
GROUP BY project_id, bucket, host, gpu_index;

