CREATE TABLE IF NOT EXISTS resource_minute_local ON CLUSTER `tracedash`
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
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/resource_minute_local', '{replica}')
PARTITION BY toDate(bucket)
ORDER BY (project_id, host, gpu_index, bucket)
TTL bucket + toIntervalDay(30)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, cleanup_delay_period = 5, max_cleanup_delay_period = 10;

CREATE TABLE IF NOT EXISTS resource_minute ON CLUSTER `tracedash` AS resource_minute_local
ENGINE = Distributed('tracedash', 'tracedash', resource_minute_local, cityHash64(project_id, host, gpu_index));

CREATE MATERIALIZED VIEW IF NOT EXISTS resource_minute_mv ON CLUSTER `tracedash` TO resource_minute_local AS SELECT project_id, toStartOfMinute(time) AS bucket, host, gpu_index,
    anyLast(gpu_name) AS gpu_name,
    sumIf(toFloat64(assumeNotNull(gpu_utilization)), gpu_utilization IS NOT NULL) AS gpu_utilization_sum,
    countIf(gpu_utilization IS NOT NULL) AS gpu_utilization_n,
    sumIf(toFloat64(assumeNotNull(gpu_temperature)), gpu_temperature IS NOT NULL) AS gpu_temperature_sum,
    countIf(gpu_temperature IS NOT NULL) AS gpu_temperature_n,
    sumIf(toFloat64(assumeNotNull(gpu_power_watts)), gpu_power_watts IS NOT NULL) AS gpu_power_watts_sum,
    countIf(gpu_power_watts IS NOT NULL) AS gpu_power_watts_n,
    sumIf(toFloat64(assumeNotNull(cpu_percent)), cpu_percent IS NOT NULL) AS cpu_percent_sum,
    countIf(cpu_percent IS NOT NULL) AS cpu_percent_n,
    max(ifNull(100 * gpu_memory_used / nullIf(gpu_memory_total, 0), -1)) AS gpu_memory_percent_max,
    max(ifNull(100 * memory_used / nullIf(memory_total, 0), -1)) AS memory_percent_max,
    maxMap(process_pids, process_gpu_memory) AS process_memory,
    groupUniqArrayArray(arrayZip(process_pids, process_names)) AS process_names
FROM resource_samples_local
GROUP BY project_id, bucket, host, gpu_index;

INSERT INTO resource_minute SELECT project_id, toStartOfMinute(time) AS bucket, host, gpu_index,
    anyLast(gpu_name) AS gpu_name,
    sumIf(toFloat64(assumeNotNull(gpu_utilization)), gpu_utilization IS NOT NULL) AS gpu_utilization_sum,
    countIf(gpu_utilization IS NOT NULL) AS gpu_utilization_n,
    sumIf(toFloat64(assumeNotNull(gpu_temperature)), gpu_temperature IS NOT NULL) AS gpu_temperature_sum,
    countIf(gpu_temperature IS NOT NULL) AS gpu_temperature_n,
    sumIf(toFloat64(assumeNotNull(gpu_power_watts)), gpu_power_watts IS NOT NULL) AS gpu_power_watts_sum,
    countIf(gpu_power_watts IS NOT NULL) AS gpu_power_watts_n,
    sumIf(toFloat64(assumeNotNull(cpu_percent)), cpu_percent IS NOT NULL) AS cpu_percent_sum,
    countIf(cpu_percent IS NOT NULL) AS cpu_percent_n,
    max(ifNull(100 * gpu_memory_used / nullIf(gpu_memory_total, 0), -1)) AS gpu_memory_percent_max,
    max(ifNull(100 * memory_used / nullIf(memory_total, 0), -1)) AS memory_percent_max,
    maxMap(process_pids, process_gpu_memory) AS process_memory,
    groupUniqArrayArray(arrayZip(process_pids, process_names)) AS process_names
FROM resource_samples
GROUP BY project_id, bucket, host, gpu_index;

