"""``resource_minute``: resource samples per host/GPU and minute, kept by a materialized view on
``resource_samples``, so the Resources page reads minutes for long ranges. Measured on 2.6 M
samples (30 days, 10 hosts/GPUs every 10 s; docs/BENCHMARKS.md "Panel pages"): the page's two
scans of the raw samples took ~560 ms together on the busy reference machine.

The view is created before the backfill, so a sample inserted meanwhile may count twice in its
minute's sums and counts (an average unchanged, maxima unchanged); a run that stopped half-way can
run again (the backfill then doubles sums and counts alike: averages and maxima stay right).
"""

from store.schema import RESOURCE_MINUTE

# One row per (project, minute, host, GPU) of a block of samples: the view's and the backfill's.
SELECT = """SELECT project_id, toStartOfMinute(time) AS bucket, host, gpu_index,
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
FROM {source}
GROUP BY project_id, bucket, host, gpu_index"""


def statements(ctx):
    # On a cluster the view reads and writes each shard's local tables (both sharded by host/GPU);
    # the backfill goes through the Distributed tables.
    return [
        *ctx.create(RESOURCE_MINUTE),
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS resource_minute_mv{ctx.on_cluster} TO {ctx.local('resource_minute')}"
        f" AS {SELECT.format(source=ctx.local('resource_samples'))}",
        f"INSERT INTO resource_minute {SELECT.format(source='resource_samples')}",
    ]
