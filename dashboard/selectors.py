"""ClickHouse reads for the pages. Every query filters by ``project_id`` first."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from store import get_store

NS = 1_000_000_000


@dataclass(frozen=True)
class TraceRow:
    trace_id: str
    root_name: str
    service: str
    start: datetime
    duration_ms: float
    status: str
    span_count: int
    has_root: bool


_TRACES_RECENT_SQL = """
SELECT
    trace_id,
    countIf(parent_span_id = '') > 0 AS has_root,
    if(has_root, argMinIf(name, start_time, parent_span_id = ''), argMin(name, start_time)) AS root_name,
    if(has_root, argMinIf(service, start_time, parent_span_id = ''), argMin(service, start_time)) AS root_service,
    min(toUnixTimestamp64Nano(start_time)) AS first_start_ns,
    if(has_root, minIf(toUnixTimestamp64Nano(start_time), parent_span_id = ''), first_start_ns) AS start_ns,
    if(has_root,
       maxIf(duration_ns, parent_span_id = ''),
       max(toUnixTimestamp64Nano(start_time) + duration_ns) - first_start_ns) AS duration_ns,
    countIf(status = 'error') > 0 AS has_error,
    uniqExact(span_id) AS span_count
FROM spans
WHERE project_id = {project_id:UInt64}
  AND start_time >= fromUnixTimestamp64Nano({since_ns:Int64})
GROUP BY trace_id
ORDER BY start_ns DESC, trace_id
LIMIT {limit:UInt32}
"""


def traces_recent(*, project_id: int, since_seconds: int = 24 * 3600, limit: int = 50) -> list[TraceRow]:
    """The project's most recent traces that started within ``since_seconds``.

    End-to-end duration is the root span's (DOMAIN.md); a trace whose root has not arrived shows
    the extent of the spans it has, and ``has_root`` is False.
    """
    since_ns = time.time_ns() - since_seconds * NS
    result = get_store().query(
        _TRACES_RECENT_SQL,
        {"project_id": project_id, "since_ns": since_ns, "limit": limit},
        tag="dashboard.selectors.traces_recent",
    )
    rows = []
    for r in result.dicts():
        rows.append(
            TraceRow(
                trace_id=r["trace_id"],
                root_name=r["root_name"],
                service=r["root_service"],
                start=datetime.fromtimestamp(r["start_ns"] / NS, tz=timezone.utc),
                duration_ms=r["duration_ns"] / 1e6,
                status="error" if r["has_error"] else "ok",
                span_count=r["span_count"],
                has_root=bool(r["has_root"]),
            )
        )
    return rows


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
        tag="dashboard.selectors.resources_latest",
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
