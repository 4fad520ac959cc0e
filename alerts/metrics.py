"""The values rules compare: one ClickHouse query per (project, source, window[, model]) per round,
shared by every rule that needs it (1,000 rules over a handful of windows cost a handful of queries).

Each series also carries ``sample_at``, the time of its newest sample in the window (for resources
and processes the newest sample row, for latency the newest request's start): the state machine's
``for`` needs breaching samples that span it, not evaluations.

Sources:
- ``resources``: ``resource_samples`` in the window, one row per (host, gpu_index) with the
  latest / average / max / min of each figure. GPU memory % = 100 × gpu_memory_used /
  gpu_memory_total (NVML ``nvmlDeviceGetMemoryInfo``, DOMAIN.md); host memory % = memory_used /
  memory_total; host figures come from the ``gpu_index = -1`` rows. A sample without a figure
  (NULL) is skipped by the aggregates; a series without any sample in the window is missing.
- ``processes``: per (host, GPU, pid), the latest GPU memory in the window over its baseline,
  the minimum of its first ``BASELINE_SECONDS`` (looked for within ``BASELINE_LOOKBACK_SECONDS``).
- ``spans``: raw spans of the window, deduplicated per (trace_id, span_id), summarised per trace
  by ``analytics.trace_math`` and aggregated per root service (alerts.latency).
- ``engines``: inference engines' samples (``engine_samples``) in the window, one series per engine
  instance (engine, target, model) through ``analytics.engines.window_figures``: KV-cache usage % and
  waiting requests as the latest / average / max / min sample, engine-side TTFT P95 from the
  TTFT histogram's bucket increases in the window (no request finished in it: missing).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from store import get_store

from .models import (ENGINE_GAUGE_METRICS, ENGINE_METRICS, GPU_METRICS, HOST_METRICS, LATENCY_METRICS, PROCESS_METRICS,
                     Metric)

BASELINE_SECONDS = 600  # DOMAIN.md: a process's baseline is the minimum over its first 10 minutes
BASELINE_LOOKBACK_SECONDS = 24 * 3600
AGGREGATIONS = ("last", "avg", "max", "min")

# (metric, expression over one resource_samples row); NULL when the sample lacks the figure.
_RESOURCE_FIGURES = {
    Metric.GPU_MEMORY_PERCENT: "if(gpu_memory_total > 0, 100.0 * gpu_memory_used / gpu_memory_total, NULL)",
    Metric.GPU_UTILIZATION: "toFloat64(gpu_utilization)",
    Metric.GPU_TEMPERATURE: "toFloat64(gpu_temperature)",
    Metric.HOST_CPU_PERCENT: "toFloat64(cpu_percent)",
    Metric.HOST_MEMORY_PERCENT: "if(memory_total > 0, 100.0 * memory_used / memory_total, NULL)",
}
_AGG_SQL = {"last": "argMax({c}, time)", "avg": "avg({c})", "max": "max({c})", "min": "min({c})"}

_RESOURCES_SQL = """
SELECT host, gpu_index, toUnixTimestamp64Milli(max(time)) AS last_ms, {aggregates}
FROM (
    SELECT host, gpu_index, time, {figures}
    FROM resource_samples
    WHERE project_id = {{project_id:UInt64}}
      AND time > fromUnixTimestamp64Milli({{since_ms:Int64}})
      AND time <= fromUnixTimestamp64Milli({{until_ms:Int64}})
)
GROUP BY host, gpu_index
""".format(
    figures=", ".join(f"{expr} AS f_{metric.value}" for metric, expr in _RESOURCE_FIGURES.items()),
    aggregates=", ".join(f"{_AGG_SQL[agg].format(c='f_' + metric.value)} AS `{metric.value}__{agg}`"
                         for metric in _RESOURCE_FIGURES for agg in AGGREGATIONS),
)

_PROCESSES_SQL = """
SELECT host, gpu_index, pid,
       argMax(pname, tm) AS name,
       min(tm) AS first_ms,
       argMaxIf(mem, tm, tm > {since_ms:Int64}) AS current,
       countIf(tm > {since_ms:Int64}) AS in_window,
       maxIf(tm, tm > {since_ms:Int64}) AS last_ms,
       arrayMin(arrayMap(x -> x.2, arrayFilter(x -> x.1 <= first_ms + {baseline_ms:Int64}, groupArray((tm, mem))))) AS baseline
FROM (
    SELECT host, gpu_index, toUnixTimestamp64Milli(time) AS tm, pid, pname, mem
    FROM resource_samples
    ARRAY JOIN process_pids AS pid, process_names AS pname, process_gpu_memory AS mem
    WHERE project_id = {project_id:UInt64}
      AND gpu_index >= 0
      AND time > fromUnixTimestamp64Milli({lookback_ms:Int64})
      AND time <= fromUnixTimestamp64Milli({until_ms:Int64})
)
GROUP BY host, gpu_index, pid
HAVING in_window > 0
"""


# The newest sample of each project per sample source, over the round's longest window of that
# source: a source with no sample in a rule's window has no series there, so its (costlier) read is
# skipped. Each of those reads costs 5-15 ms of CPU even over an empty table, mostly in ClickHouse's
# analysis of the statement, and most projects send no engine metrics (and many no GPU processes).
_NEWEST_SQL = """
SELECT 'resources' AS source, project_id, toUnixTimestamp64Milli(max(time)) AS newest_ms
FROM resource_samples
WHERE project_id IN {resources:Array(UInt64)} AND time > fromUnixTimestamp64Milli({resources_since_ms:Int64})
  AND time <= fromUnixTimestamp64Milli({until_ms:Int64})
GROUP BY project_id
UNION ALL
SELECT 'processes', project_id, toUnixTimestamp64Milli(max(time))
FROM resource_samples
WHERE project_id IN {processes:Array(UInt64)} AND gpu_index >= 0 AND notEmpty(process_pids)
  AND time > fromUnixTimestamp64Milli({processes_since_ms:Int64}) AND time <= fromUnixTimestamp64Milli({until_ms:Int64})
GROUP BY project_id
UNION ALL
SELECT 'engines', project_id, toUnixTimestamp64Milli(max(time))
FROM engine_samples
WHERE project_id IN {engines:Array(UInt64)} AND time > fromUnixTimestamp64Milli({engines_since_ms:Int64})
  AND time <= fromUnixTimestamp64Milli({until_ms:Int64})
GROUP BY project_id
"""
SAMPLED_SOURCES = ("resources", "processes", "engines")


def newest_samples(windows: dict[tuple[int, str], int], *, now: datetime) -> dict[tuple[int, str], int]:
    """``windows``: (project, source) -> the longest window (s) of the round's reads of that sampled
    source. Returns (project, source) -> the newest sample's time (unix ms) within that window, for
    those that have one; one query for all."""
    if not windows:
        return {}
    until = _ms(now)
    params: dict = {"until_ms": until}
    for source in SAMPLED_SOURCES:
        mine = {p: w for (p, s), w in windows.items() if s == source}
        params[source] = sorted(mine) or [0]
        params[f"{source}_since_ms"] = until - max(mine.values(), default=0) * 1000 if mine else until
    rows = get_store().query(_NEWEST_SQL, params, tag="alerts.metrics.newest_samples").rows
    return {(int(project_id), source): int(newest) for source, project_id, newest in rows
            if (int(project_id), source) in windows}


@dataclass(frozen=True)
class Series:
    key: str
    labels: dict
    values: dict  # "<metric>__<agg>" (resources) or "<metric>" -> float | None
    sample_at: datetime | None = None  # the newest sample behind the values (the `for` coverage)


def source_of(metric: str) -> str:
    if metric in ENGINE_METRICS:
        return "engines"
    if metric in PROCESS_METRICS:
        return "processes"
    if metric in LATENCY_METRICS:
        return "spans"
    return "resources"


def series_key(labels: dict) -> str:
    return ",".join(f"{k}={labels[k]}" for k in ("host", "gpu", "pid", "service") if k in labels)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def resources_fetch(*, project_id: int, window_seconds: int, now: datetime) -> list[Series]:
    rows = get_store().query(
        _RESOURCES_SQL,
        {"project_id": project_id, "since_ms": _ms(now) - window_seconds * 1000, "until_ms": _ms(now)},
        tag="alerts.metrics.resources_fetch",
    ).dicts()
    out = []
    for row in rows:
        gpu = int(row["gpu_index"])
        labels = {"host": row["host"]} if gpu < 0 else {"host": row["host"], "gpu": str(gpu)}
        values = {k: (None if v is None else float(v)) for k, v in row.items() if "__" in k}
        out.append(Series(series_key(labels), labels, values, _when(row.get("last_ms"))))
    return out


def _when(ms) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)


def processes_fetch(*, project_id: int, window_seconds: int, now: datetime) -> list[Series]:
    until = _ms(now)
    rows = get_store().query(
        _PROCESSES_SQL,
        {"project_id": project_id, "since_ms": until - window_seconds * 1000, "until_ms": until,
         "lookback_ms": until - BASELINE_LOOKBACK_SECONDS * 1000, "baseline_ms": BASELINE_SECONDS * 1000},
        tag="alerts.metrics.processes_fetch",
    ).dicts()
    out = []
    for row in rows:
        labels = {"host": row["host"], "gpu": str(int(row["gpu_index"])), "pid": str(int(row["pid"])),
                  "process": row["name"]}
        baseline = row["baseline"]
        ratio = None if not baseline else float(row["current"]) / float(baseline)  # 0 baseline: no ratio, not infinity
        out.append(Series(series_key(labels), labels, {Metric.PROCESS_LEAK_RATIO.value: ratio}, _when(row.get("last_ms"))))
    return out


# alert metric -> the engine gauge it aggregates
_ENGINE_GAUGES = {Metric.ENGINE_KV_CACHE_PERCENT: "kv_cache_usage", Metric.ENGINE_REQUESTS_WAITING: "requests_waiting"}


def engine_series_of(figures) -> Series:
    """One engine instance's window figures (``analytics.engines.InstanceFigures``) as an alert series."""
    instance = figures.instance
    labels = {"host": figures.host, "engine": instance.engine, "target": instance.target, "model": instance.model}
    values: dict = {}
    for metric, gauge in _ENGINE_GAUGES.items():
        got = figures.gauges.get(gauge)
        for agg, field_name in (("last", "last"), ("avg", "mean"), ("max", "high"), ("min", "low")):
            values[f"{metric.value}__{agg}"] = None if got is None else got[field_name]
    values[Metric.ENGINE_TTFT_P95.value] = (figures.percentiles_ms.get("ttft_seconds") or {}).get(0.95)
    return Series(instance.key, labels, values, _when(figures.last_ms))


def engines_fetch(*, project_id: int, window_seconds: int, now: datetime) -> list[Series]:
    from analytics.engines import window_figures

    start = datetime.fromtimestamp((_ms(now) - window_seconds * 1000) / 1000, tz=timezone.utc)
    return [engine_series_of(f) for f in window_figures(project_id=project_id, start=start, end=now)]


def fetch(*, project_id: int, source: str, window_seconds: int, now: datetime, model: str = "", group_by: str = "",
          group_value: str = "", service: str = "") -> list[Series]:
    """The source's series of the window; a latency rule with ``group_by`` gets one series per value of
    that attribute (``group_value``, ``service``: its filters; see alerts.latency)."""
    if source == "engines":
        return engines_fetch(project_id=project_id, window_seconds=window_seconds, now=now)
    if source == "resources":
        return resources_fetch(project_id=project_id, window_seconds=window_seconds, now=now)
    if source == "processes":
        return processes_fetch(project_id=project_id, window_seconds=window_seconds, now=now)
    from .latency import latency_fetch

    return latency_fetch(project_id=project_id, window_seconds=window_seconds, now=now, model=model,
                         group_by=group_by, group_value=group_value, service=service)


def rule_values(rule, series: list[Series]) -> dict[str, tuple[dict, float | None]]:
    """The series a rule watches (its scope applied) and each one's value (None: missing)."""
    metric = rule.metric
    out = {}
    for s in series:
        labels = s.labels
        if metric in GPU_METRICS and "gpu" not in labels:
            continue
        if metric in HOST_METRICS and "gpu" in labels:
            continue
        if (metric in ENGINE_METRICS) != ("engine" in labels):
            continue
        if metric in ENGINE_METRICS and rule.model and labels.get("model") != rule.model:
            continue
        if rule.host and labels.get("host") != rule.host:
            continue
        if rule.gpu_index is not None and "gpu" in labels and labels["gpu"] != str(rule.gpu_index):
            continue
        if rule.service and "service" in labels and labels["service"] != rule.service:
            continue
        group_by = getattr(rule, "group_by", "")
        if group_by and (group_by not in labels or (rule.group_value and labels[group_by] != rule.group_value)):
            continue
        if metric in (GPU_METRICS | HOST_METRICS | ENGINE_GAUGE_METRICS):
            value = s.values.get(f"{metric}__{rule.aggregation if rule.aggregation != 'window' else 'last'}")
        elif metric == Metric.PHASE_SHARE:
            value = s.values.get(f"{metric}:{rule.phase or 'inference'}")
        else:
            value = s.values.get(metric)
        out[s.key] = (labels, value)
    return out
