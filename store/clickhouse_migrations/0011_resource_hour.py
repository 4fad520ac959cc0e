"""``resource_hour``: the per-minute resource rollup summed up per hour by a materialized view on
``resource_minute`` (which a view on ``resource_samples`` fills, so every insert of samples
reaches both), read by the Resources page for buckets of whole hours (7 days and longer): a
30-day chart reads 720 rows per host/GPU instead of 43,200 minutes. Same columns and merge
functions as the minutes; created before its backfill, as 0010 (a minute inserted meanwhile may
count twice in sums and counts: averages and maxima stay right).
"""

from store.schema import RESOURCE_HOUR

SELECT = """SELECT project_id, toStartOfHour(bucket) AS bucket, host, gpu_index,
    anyLast(gpu_name) AS gpu_name,
    sum(gpu_utilization_sum) AS gpu_utilization_sum, sum(gpu_utilization_n) AS gpu_utilization_n,
    sum(gpu_temperature_sum) AS gpu_temperature_sum, sum(gpu_temperature_n) AS gpu_temperature_n,
    sum(gpu_power_watts_sum) AS gpu_power_watts_sum, sum(gpu_power_watts_n) AS gpu_power_watts_n,
    sum(cpu_percent_sum) AS cpu_percent_sum, sum(cpu_percent_n) AS cpu_percent_n,
    max(gpu_memory_percent_max) AS gpu_memory_percent_max,
    max(memory_percent_max) AS memory_percent_max,
    maxMap(process_memory) AS process_memory,
    groupUniqArrayArray(process_names) AS process_names
FROM {source}
GROUP BY project_id, bucket, host, gpu_index"""


def statements(ctx):
    # On a cluster the view reads and writes each shard's local tables (both sharded by host/GPU);
    # the backfill goes through the Distributed tables.
    return [
        *ctx.create(RESOURCE_HOUR),
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS resource_hour_mv{ctx.on_cluster} TO {ctx.local('resource_hour')}"
        f" AS {SELECT.format(source=ctx.local('resource_minute'))}",
        f"INSERT INTO resource_hour {SELECT.format(source='resource_minute')}",
    ]
