"""ClickHouse reads for the pages. Every query filters by ``project_id`` first."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from store import get_store

NS = 1_000_000_000


@dataclass(frozen=True)
class ResourceRow:
    host: str
    gpu_index: int  # -1: the host itself
    gpu_name: str
    last_seen: datetime
    cpu_percent: float | None
    memory_percent: float | None
    gpu_utilization: float | None
    gpu_memory_percent: float | None  # used / total from NVML (DOMAIN.md)
    gpu_temperature: float | None
    gpu_power_watts: float | None


_RESOURCES_LATEST_SQL = """
SELECT
    host,
    gpu_index,
    argMax(gpu_name, time) AS gpu_name,
    max(time) AS last_seen,
    argMax(cpu_percent, time) AS cpu_percent,
    argMax(memory_used, time) AS memory_used,
    argMax(memory_total, time) AS memory_total,
    argMax(gpu_utilization, time) AS gpu_utilization,
    argMax(gpu_memory_used, time) AS gpu_memory_used,
    argMax(gpu_memory_total, time) AS gpu_memory_total,
    argMax(gpu_temperature, time) AS gpu_temperature,
    argMax(gpu_power_watts, time) AS gpu_power_watts
FROM resource_samples
WHERE project_id = {project_id:UInt64}
  AND time >= fromUnixTimestamp64Nano({since_ns:Int64})
GROUP BY host, gpu_index
ORDER BY host, gpu_index
"""


def _percent(used, total) -> float | None:
    return None if used is None or not total else 100.0 * used / total


def resources_latest(*, project_id: int, since_seconds: int = 3600) -> list[ResourceRow]:
    """The latest known figures of each host and GPU that reported within ``since_seconds``
    (NULL-skipping: a figure a sample did not carry keeps its last known value; never 0)."""
    result = get_store().query(
        _RESOURCES_LATEST_SQL,
        {"project_id": project_id, "since_ns": time.time_ns() - since_seconds * NS},
        tag="analytics.selectors.resources_latest",
    )
    return [
        ResourceRow(
            host=r["host"], gpu_index=r["gpu_index"], gpu_name=r["gpu_name"], last_seen=r["last_seen"],
            cpu_percent=r["cpu_percent"], memory_percent=_percent(r["memory_used"], r["memory_total"]),
            gpu_utilization=r["gpu_utilization"], gpu_memory_percent=_percent(r["gpu_memory_used"], r["gpu_memory_total"]),
            gpu_temperature=r["gpu_temperature"], gpu_power_watts=r["gpu_power_watts"],
        )
        for r in result.dicts()
    ]


def first_sample_since(*, project_id: int, since: datetime) -> datetime | None:
    """When the project's first resource sample at or after ``since`` was taken, or None: what the
    Resources page's default range is fitted to (``dashboard.timewindow.fit_preset``)."""
    r = get_store().query(
        "SELECT min(time) AS first, count() AS n FROM resource_samples WHERE project_id = {project_id:UInt64}"
        " AND time >= fromUnixTimestamp64Milli({since_ms:Int64})",
        {"project_id": project_id, "since_ms": int(since.timestamp() * 1000)},
        tag="analytics.selectors.first_sample_since").dicts()[0]
    if not r["n"]:
        return None
    first = r["first"]
    return first if first.tzinfo else first.replace(tzinfo=timezone.utc)


# --- Resources over time ------------------------------------------------------------------------
# Chart-friendly bucket widths: a range is cut into at most ``points`` buckets of the smallest of
# these that fits, so a 15-minute view keeps 10-second detail and 30 days stay a few hundred points.
BUCKET_STEPS_SECONDS = (10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)


def bucket_seconds(*, start: datetime, end: datetime, points: int = 240) -> int:
    span = max((end - start).total_seconds(), 1.0)
    for step in BUCKET_STEPS_SECONDS:
        if span / step <= points:
            return step
    return BUCKET_STEPS_SECONDS[-1]


def bucket_times(*, start: datetime, end: datetime, step: int) -> list[datetime]:
    """Every bucket start from the one holding ``start`` to the one holding ``end`` (so a bucket
    without samples is a gap in the chart, never a 0)."""
    first = int(start.timestamp()) // step * step
    last = int(end.timestamp()) // step * step
    return [datetime.fromtimestamp(t, tz=timezone.utc) for t in range(first, last + 1, step)]


@dataclass(frozen=True)
class DeviceSeries:
    """One host (``gpu_index`` -1: CPU and memory) or one GPU over time; ``None`` = no sample."""

    host: str
    gpu_index: int
    gpu_name: str
    values: dict[str, list[float | None]]  # metric -> one value per bucket of ``ResourceSeries.times``

    @property
    def label(self) -> str:
        return self.host if self.gpu_index < 0 else f"{self.host} · GPU {self.gpu_index}"


@dataclass(frozen=True)
class ProcessSeries:
    host: str
    gpu_index: int
    pid: int
    name: str
    memory_bytes: list[float | None]

    @property
    def label(self) -> str:
        return f"{self.host} · GPU {self.gpu_index} · {self.name or 'pid'} ({self.pid})"


@dataclass(frozen=True)
class ResourceSeries:
    start: datetime
    end: datetime
    step_seconds: int
    times: list[datetime]
    hosts: list[DeviceSeries]  # gpu_index -1 rows
    gpus: list[DeviceSeries]
    processes: list[ProcessSeries]


# Per bucket: utilisation, temperature, power and CPU are averages of the samples; memory % is the
# highest sample of the bucket (the 85 % rule is about peaks, and an average would hide one).
_RESOURCES_SERIES_SQL = """
SELECT
    host,
    gpu_index,
    intDiv(toUnixTimestamp64Milli(time), {step_ms:UInt64}) * {step_ms:UInt64} AS bucket_ms,
    any(gpu_name) AS gpu_name,
    avg(gpu_utilization) AS gpu_utilization,
    max(100 * gpu_memory_used / nullIf(gpu_memory_total, 0)) AS gpu_memory_percent,
    avg(gpu_temperature) AS gpu_temperature,
    avg(gpu_power_watts) AS gpu_power_watts,
    avg(cpu_percent) AS cpu_percent,
    max(100 * memory_used / nullIf(memory_total, 0)) AS memory_percent
FROM resource_samples
WHERE project_id = {project_id:UInt64}
  AND time >= fromUnixTimestamp64Milli({start_ms:Int64}) AND time < fromUnixTimestamp64Milli({end_ms:Int64})
  AND ({host:String} = '' OR host = {host:String})
GROUP BY host, gpu_index, bucket_ms
ORDER BY host, gpu_index, bucket_ms
"""

# Per-process GPU memory: the highest figure per bucket, for the processes that used the most.
_RESOURCES_PROCESSES_SQL = """
SELECT host, gpu_index, pid, any(pname) AS name,
       intDiv(toUnixTimestamp64Milli(time), {step_ms:UInt64}) * {step_ms:UInt64} AS bucket_ms,
       max(mem) AS memory_bytes
FROM resource_samples
ARRAY JOIN process_pids AS pid, process_names AS pname, process_gpu_memory AS mem
WHERE project_id = {project_id:UInt64}
  AND time >= fromUnixTimestamp64Milli({start_ms:Int64}) AND time < fromUnixTimestamp64Milli({end_ms:Int64})
  AND ({host:String} = '' OR host = {host:String})
  AND gpu_index >= 0
GROUP BY host, gpu_index, pid, bucket_ms
ORDER BY host, gpu_index, pid, bucket_ms
"""

# The same figures from the resource rollups (``resource_minute`` / ``resource_hour``, kept by
# materialized views), for charts whose buckets are whole minutes / hours: averages from sums and
# counts, peaks from maxima (-1: no sample carried the figure). A rollup bucket counts when it
# starts in the window rounded down to its size. ``__TABLE__``/``__FLOOR__``: see _ROLLUP_LEVELS.
_RESOURCES_MINUTE_SQL = """
SELECT
    host,
    gpu_index,
    intDiv(toUnixTimestamp(bucket), {step:UInt32}) * {step:UInt32} * 1000 AS bucket_ms,
    anyIf(gpu_name, gpu_name != '') AS gpu_name,
    sum(gpu_utilization_sum) / nullIf(sum(gpu_utilization_n), 0) AS gpu_utilization,
    nullIf(max(gpu_memory_percent_max), -1) AS gpu_memory_percent,
    sum(gpu_temperature_sum) / nullIf(sum(gpu_temperature_n), 0) AS gpu_temperature,
    sum(gpu_power_watts_sum) / nullIf(sum(gpu_power_watts_n), 0) AS gpu_power_watts,
    sum(cpu_percent_sum) / nullIf(sum(cpu_percent_n), 0) AS cpu_percent,
    nullIf(max(memory_percent_max), -1) AS memory_percent
FROM __TABLE__
WHERE project_id = {project_id:UInt64}
  AND bucket >= __FLOOR__(fromUnixTimestamp64Milli({start_ms:Int64})) AND bucket < fromUnixTimestamp64Milli({end_ms:Int64})
  AND ({host:String} = '' OR host = {host:String})
GROUP BY host, gpu_index, bucket_ms
ORDER BY host, gpu_index, bucket_ms
"""

_RESOURCES_MINUTE_PROCESSES_SQL = """
SELECT host, gpu_index,
       intDiv(toUnixTimestamp(bucket), {step:UInt32}) * {step:UInt32} * 1000 AS bucket_ms,
       maxMap(process_memory) AS memory, groupUniqArrayArray(process_names) AS names
FROM __TABLE__
WHERE project_id = {project_id:UInt64}
  AND bucket >= __FLOOR__(fromUnixTimestamp64Milli({start_ms:Int64})) AND bucket < fromUnixTimestamp64Milli({end_ms:Int64})
  AND ({host:String} = '' OR host = {host:String})
  AND gpu_index >= 0
GROUP BY host, gpu_index, bucket_ms
ORDER BY host, gpu_index, bucket_ms
"""

# (bucket size in seconds, table, rounding function), coarsest first.
_ROLLUP_LEVELS = ((3600, "resource_hour", "toStartOfHour"), (60, "resource_minute", "toStartOfMinute"))


def _rollup_sql(sql: str, step: int) -> str | None:
    """``sql`` on the coarsest rollup whose bucket divides ``step``; None: read the samples."""
    for size, table, floor in _ROLLUP_LEVELS:
        if step % size == 0:
            return sql.replace("__TABLE__", table).replace("__FLOOR__", floor)
    return None


HOST_METRICS = ("cpu_percent", "memory_percent")
GPU_METRICS = ("gpu_utilization", "gpu_memory_percent", "gpu_temperature", "gpu_power_watts")


RESOURCE_POINTS = 240  # buckets per resource chart at most


def resources_hosts(*, project_id: int, start: datetime, end: datetime, limit: int = 500) -> list[str]:
    """The hosts that reported in the hours [start, end) touches (the Resources page's host
    choices), from the hour rollup."""
    result = get_store().query(
        "SELECT DISTINCT host FROM resource_hour WHERE project_id = {project_id:UInt64}"
        " AND bucket >= toStartOfHour(fromUnixTimestamp64Milli({start_ms:Int64}))"
        " AND bucket < fromUnixTimestamp64Milli({end_ms:Int64}) ORDER BY host LIMIT {limit:UInt32}",
        {"project_id": project_id, "start_ms": int(start.timestamp() * 1000), "end_ms": int(end.timestamp() * 1000),
         "limit": limit}, tag="analytics.selectors.resources_hosts")
    return [r[0] for r in result.rows]


def resources_series(*, project_id: int, start: datetime, end: datetime, host: str = "",
                     points: int = RESOURCE_POINTS, max_processes: int = 12) -> ResourceSeries:
    """Host and GPU figures of the project over ``[start, end)``, in buckets sized so the range
    has at most ``points`` of them; buckets without a sample (or samples without the figure) are
    ``None``: a gap in the chart, never 0 (DOMAIN.md)."""
    step = bucket_seconds(start=start, end=end, points=points)
    times = bucket_times(start=start, end=end, step=step)
    index = {int(t.timestamp() * 1000): i for i, t in enumerate(times)}
    params = {"project_id": project_id, "step_ms": step * 1000, "step": step, "host": host,
              "start_ms": int(start.timestamp() * 1000), "end_ms": int(end.timestamp() * 1000)}
    store = get_store()
    rollup_sql = _rollup_sql(_RESOURCES_MINUTE_SQL, step)  # whole minutes or hours: a rollup
    devices: dict[tuple[str, int], dict] = {}
    rows = store.query(rollup_sql or _RESOURCES_SERIES_SQL, params, tag="analytics.selectors.resources_series").dicts()
    for r in rows:
        key = (r["host"], r["gpu_index"])
        metrics = HOST_METRICS if r["gpu_index"] < 0 else GPU_METRICS
        device = devices.setdefault(key, {"name": "", "values": {m: [None] * len(times) for m in metrics}})
        device["name"] = device["name"] or r["gpu_name"]
        i = index.get(r["bucket_ms"])
        if i is None:
            continue
        for m in metrics:
            value = r[m]
            device["values"][m][i] = None if value is None or value != value else round(float(value), 3)
    hosts, gpus = [], []
    for (host_name, gpu_index), d in sorted(devices.items()):
        series = DeviceSeries(host=host_name, gpu_index=gpu_index, gpu_name=d["name"], values=d["values"])
        (hosts if gpu_index < 0 else gpus).append(series)

    procs: dict[tuple[str, int, int], dict] = {}
    for h, g, pid, name, bucket_ms, memory in _process_rows(store, params, step=step):
        proc = procs.setdefault((h, g, pid), {"name": name, "values": [None] * len(times), "peak": 0})
        proc["name"] = proc["name"] or name
        i = index.get(bucket_ms)
        if i is not None:
            proc["values"][i] = float(memory)
            proc["peak"] = max(proc["peak"], memory)
    top = sorted(procs.items(), key=lambda item: (-item[1]["peak"], item[0]))[:max_processes]
    processes = [ProcessSeries(host=h, gpu_index=g, pid=p, name=d["name"], memory_bytes=d["values"])
                 for (h, g, p), d in sorted(top)]
    return ResourceSeries(start=start, end=end, step_seconds=step, times=times, hosts=hosts, gpus=gpus,
                          processes=processes)


def _process_rows(store, params: dict, *, step: int):
    """(host, gpu_index, pid, name, bucket_ms, peak GPU memory) per process and bucket."""
    rollup_sql = _rollup_sql(_RESOURCES_MINUTE_PROCESSES_SQL, step)
    if rollup_sql is None:
        for r in store.query(_RESOURCES_PROCESSES_SQL, params, tag="analytics.selectors.resources_processes").dicts():
            yield r["host"], r["gpu_index"], r["pid"], r["name"], r["bucket_ms"], r["memory_bytes"]
        return
    for r in store.query(rollup_sql, params, tag="analytics.selectors.resources_processes").dicts():
        names = {int(pid): name for pid, name in r["names"]}
        pids, memory = r["memory"]
        for pid, value in zip(pids, memory):
            yield r["host"], r["gpu_index"], int(pid), names.get(int(pid), ""), r["bucket_ms"], int(value)


@dataclass(frozen=True)
class LoadSeries:
    """Request rate and P95 end-to-end latency on the resource charts' time axis (a bucket
    without requests has a rate of 0 — no requests is a measured zero — and no P95: a gap)."""

    times: list[datetime]
    step_seconds: int
    rps: list[float | None]
    p95_e2e_ms: list[float | None]
