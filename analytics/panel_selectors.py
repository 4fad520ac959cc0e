"""Exact figures over a time window (DOMAIN.md "Over a time window") from the per-trace summaries
(the latest version of each trace, read by start from ``traces_by_start``), the result types the
rollup reads share (``analytics.rollups``: what the pages read), and the pages' shared read helpers.
``window_stats`` here is the reference the rollups are tested against and what a compare side that
filters by an attribute reads (the rollups keep no attributes).

A request is a trace whose root has arrived, in the window its root starts in (as the rollups
count it). Its status is its root's (DOMAIN.md "Status"): an error request is one whose root
failed; a recovered one succeeded although a span below it failed (not an error). ``service`` filters on the trace's root service and ``model`` on its first model call
(the dimensions the rollups keep). Percentiles here are exact (``quantilesExact``) over the
window's requests; a phase's percentiles are over the requests that spent time in that phase.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from store import get_store

from analytics.trace_math import PHASES

QUANTILES = (0.5, 0.9, 0.95, 0.99)

# The requests a page counts (roots) of the service and model it filters by ('' for any).
SCOPE = """has_root = 1 AND ({service:String} = '' OR service = {service:String})
  AND ({model:String} = '' OR model = {model:String})"""


def latest_summaries_sql(columns: str, ranges: list[tuple[str, str]], *, unit: str = "Milli",
                         where: str = "1") -> str:
    """Each trace's latest summary (``columns``: names of ``traces`` columns, comma-separated) among
    those starting in ``ranges`` (pairs of parameter names: [from, to), unix ms or ns by ``unit``),
    that ``where`` (on the summary) also selects — read from ``traces_by_start`` alone, ``FINAL``.
    Ordered by start, it reads only the ranges' granules, where ``traces`` (ordered by trace id)
    reads the whole of every column it touches to find a few traces by id (on 10 M spans,
    ``trace_id`` alone: ~190 ms however short the range). FINAL keeps the latest version under each
    start; a summary whose start moved has its old start retired (store.schema.TRACES_BY_START:
    a row with no spans replaces the old one), so each trace is read once, at its latest start."""
    within = " OR ".join(f"(start_time >= fromUnixTimestamp64{unit}({{{lo}:Int64}})"
                         f" AND start_time < fromUnixTimestamp64{unit}({{{hi}:Int64}}))" for lo, hi in ranges)
    return f"""SELECT {columns} FROM traces_by_start FINAL
    WHERE project_id = {{project_id:UInt64}} AND ({within}) AND span_count > 0 AND ({where})"""


def window_requests_sql(columns: str) -> str:
    """The window's requests (the latest summary of each rooted trace starting in it, of the
    service and model filtered, ``SCOPE``) with
    ``columns`` (``trace_id`` among them for a join): ``latest_summaries_sql`` over the window."""
    return latest_summaries_sql(columns, [("start_ms", "end_ms")], where=SCOPE)


_AGGREGATES = """count() AS requests,
    countIf(status = 'error') AS errors,
    countIf(status = 'recovered') AS recovered_n,
    sum(error_spans) AS error_spans_n,
    sum(e2e_ns) AS e2e_sum_ns,
    sum(input_tokens) AS input_total,
    sum(output_tokens) AS output_total,
    sum(ifNull(cost_usd, 0)) AS cost_total,
    countIf(cost_usd IS NOT NULL) AS costed,
    countIf(cost_estimated = 1) AS estimated_n,
    quantilesExact(0.5, 0.9, 0.95, 0.99)(e2e_ns) AS e2e_q,
    countIf(ttft_ns IS NOT NULL) AS ttft_n,
    quantilesExact(0.5, 0.9, 0.95, 0.99)(ttft_ns) AS ttft_q,
    countIf(tpot_ns IS NOT NULL) AS tpot_n,
    quantilesExact(0.5, 0.9, 0.95, 0.99)(tpot_ns) AS tpot_q,
    sum(network_ns) AS network_sum, sum(preprocess_ns) AS preprocess_sum, sum(inference_ns) AS inference_sum,
    sum(postprocess_ns) AS postprocess_sum, sum(other_ns) AS other_sum,
    quantilesExactIf(0.5, 0.9, 0.95, 0.99)(network_ns, network_ns > 0) AS network_q, countIf(network_ns > 0) AS network_n,
    quantilesExactIf(0.5, 0.9, 0.95, 0.99)(preprocess_ns, preprocess_ns > 0) AS preprocess_q, countIf(preprocess_ns > 0) AS preprocess_n,
    quantilesExactIf(0.5, 0.9, 0.95, 0.99)(inference_ns, inference_ns > 0) AS inference_q, countIf(inference_ns > 0) AS inference_n,
    quantilesExactIf(0.5, 0.9, 0.95, 0.99)(postprocess_ns, postprocess_ns > 0) AS postprocess_q, countIf(postprocess_ns > 0) AS postprocess_n,
    quantilesExactIf(0.5, 0.9, 0.95, 0.99)(other_ns, other_ns > 0) AS other_q, countIf(other_ns > 0) AS other_n"""


_STATS_COLUMNS = ("trace_id, status, error_spans, e2e_ns, input_tokens, output_tokens, cost_usd, cost_estimated, ttft_ns, "
                  "tpot_ns, network_ns, preprocess_ns, inference_ns, postprocess_ns, other_ns")


def _params(project_id: int, start: datetime, end: datetime, service: str, model: str, **extra) -> dict:
    return {"project_id": project_id, "start_ms": int(start.timestamp() * 1000), "end_ms": int(end.timestamp() * 1000),
            "service": service, "model": model, **extra}


def _ms(quantiles, n: int) -> dict[float, float | None]:
    return {q: (round(float(v) / 1e6, 3) if n else None) for q, v in zip(QUANTILES, quantiles)}


@dataclass(frozen=True)
class WindowStats:
    """Every window figure of DOMAIN.md for one window (or one bucket of a series)."""

    seconds: float
    requests: int
    errors: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cost_estimated: int  # requests whose cost is (partly) from the price table
    e2e_ms: dict[float, float | None]  # quantile -> ms; None without requests
    ttft_ms: dict[float, float | None]
    tpot_ms: dict[float, float | None]
    phase_ms: dict[str, dict[float, float | None]]  # phase -> quantile -> exclusive ms
    phase_mean_ms: dict[str, float | None]
    e2e_mean_ms: float | None
    recovered: int = 0  # requests that succeeded although a span failed (a retried call): not errors
    error_spans: int = 0  # spans with status error in the window's requests ("spans with errors")

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0

    @property
    def concurrency(self) -> float | None:
        """Mean in-flight requests (Little's law): summed E2E / window seconds."""
        if self.e2e_mean_ms is None or not self.seconds:
            return None
        return self.e2e_mean_ms * self.requests / 1000 / self.seconds

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def availability(self) -> float | None:
        return None if self.error_rate is None else 1 - self.error_rate

    @property
    def cost_per_request(self) -> float | None:
        return self.cost_usd / self.requests if self.requests else None

    @property
    def cost_per_1k_tokens(self) -> float | None:
        tokens = self.input_tokens + self.output_tokens
        return self.cost_usd / (tokens / 1000) if tokens else None

    @property
    def inference_share(self) -> float | None:
        """Inference time / E2E over the window's requests (a ratio of sums)."""
        if not self.e2e_mean_ms:
            return None
        return (self.phase_mean_ms["inference"] or 0.0) / self.e2e_mean_ms


def _stats(r: dict, seconds: float) -> WindowStats:
    n = r["requests"]
    return WindowStats(
        seconds=seconds, requests=n, errors=r["errors"], input_tokens=r["input_total"],
        output_tokens=r["output_total"], cost_usd=float(r["cost_total"]), cost_estimated=r["estimated_n"],
        e2e_ms=_ms(r["e2e_q"], n), ttft_ms=_ms(r["ttft_q"], r["ttft_n"]), tpot_ms=_ms(r["tpot_q"], r["tpot_n"]),
        phase_ms={p: _ms(r[f"{p}_q"], r[f"{p}_n"]) for p in PHASES},
        phase_mean_ms={p: (r[f"{p}_sum"] / n / 1e6 if n else None) for p in PHASES},
        e2e_mean_ms=r["e2e_sum_ns"] / n / 1e6 if n else None,
        recovered=int(r["recovered_n"]), error_spans=int(r["error_spans_n"]),
    )


def window_stats(*, project_id: int, start: datetime, end: datetime, service: str = "", model: str = "",
                 release: tuple[str, str] | None = None) -> WindowStats:
    """The window's figures. ``release``: (attribute key, value) — only traces with a span carrying it."""
    params = _params(project_id, start, end, service, model)
    where = SCOPE
    if release:
        where += f" AND trace_id IN ({_ATTRIBUTE_TRACES})"
        params.update(attr_key=release[0], attr_value=release[1])
    sql = f"SELECT {_AGGREGATES} FROM ({latest_summaries_sql(_STATS_COLUMNS, [('start_ms', 'end_ms')], where=where)})"
    r = get_store().query(sql, params, tag="analytics.panel_selectors.window_stats").dicts()[0]
    return _stats(r, (end - start).total_seconds())


# Traces with a span carrying attribute key = value (a release, a variant) as a span attribute or
# a resource attribute (OpenTelemetry puts ``service.version`` there), in the same time range
# (spans may start a little before their trace — clock skew — or long after it).
_ATTRIBUTE_TRACES = """SELECT DISTINCT trace_id FROM spans
    WHERE project_id = {project_id:UInt64}
      AND start_time >= fromUnixTimestamp64Milli({start_ms:Int64}) - toIntervalMinute(5)
      AND start_time < fromUnixTimestamp64Milli({end_ms:Int64}) + toIntervalHour(1)
      AND (attributes[{attr_key:String}] = {attr_value:String}
           OR resource_attributes[{attr_key:String}] = {attr_value:String})"""


@dataclass(frozen=True)
class WindowSeries:
    start: datetime
    end: datetime
    step_seconds: int
    times: list[datetime]
    buckets: list[WindowStats | None]  # None: no request started in the bucket

    def values(self, getter) -> list:
        return [None if b is None else getter(b) for b in self.buckets]


# Latency buckets of the histogram / heatmap: upper edges in ms, 1-2-5 steps.
LATENCY_EDGES_MS = (10, 20, 50, 100, 200, 500, 1000, 1500, 2000, 5000, 10000, 20000, 60000)


@dataclass(frozen=True)
class LatencyHeatmap:
    times: list[datetime]
    step_seconds: int
    edges_ms: tuple[int, ...]  # bucket i holds E2E < edges_ms[i] (and >= edges_ms[i-1]); the last one is open
    counts: list[list[int]]  # [latency bucket][time bucket]

    @property
    def labels(self) -> list[str]:
        out, low = [], 0
        for edge in self.edges_ms:
            out.append(f"{low}–{edge} ms")
            low = edge
        out.append(f"≥ {low} ms")
        return out

    @property
    def totals(self) -> list[int]:
        return [sum(row) for row in self.counts]


@dataclass(frozen=True)
class ModelSpend:
    times: list[datetime]
    step_seconds: int
    cost_by_model: dict[str, list[float | None]] = field(default_factory=dict)


def panel_facets(*, project_id: int, start: datetime, end: datetime) -> dict[str, list[str]]:
    """The root services and models with requests in the hours the window touches (the filter
    bar's choices), from the hour rollups of the hours that have ended: a few rows per hour instead
    of every trace; from the minute rollups of the hour under way; and from the summaries of the
    minutes the rollups do not hold yet."""
    recent = latest_summaries_sql("service, model", [("recent_ms", "end_ms")], where="has_root = 1").replace(
        "{recent_ms:Int64}", _NOT_ROLLED_UP_MS)
    r = get_store().query(
        "SELECT groupUniqArray(200)(service) AS services, groupUniqArray(200)(model) AS models FROM ("
        " SELECT service, model FROM rollup_hour"
        " WHERE project_id = {project_id:UInt64} AND requests > 0"
        " AND bucket >= toStartOfHour(toDateTime({start_s:UInt32}, 'UTC')) AND bucket < toDateTime({end_s:UInt32}, 'UTC')"
        f" AND bucket < {_READY_HOUR}"
        " UNION ALL SELECT service, model FROM rollup_minute"
        " WHERE project_id = {project_id:UInt64} AND requests > 0"
        f" AND bucket >= greatest(toStartOfHour(toDateTime({{start_s:UInt32}}, 'UTC')), {_READY_HOUR})"
        " AND bucket < toDateTime({end_s:UInt32}, 'UTC')"
        f" UNION ALL SELECT toString(service), toString(model) FROM ({recent}))",
        {"project_id": project_id, "start_s": int(start.timestamp()), "end_s": int(end.timestamp()) + 1,
         "since_s": int(start.timestamp()) // 3600 * 3600, "end_ms": (int(end.timestamp()) + 1) * 1000},
        tag="analytics.panel_selectors.panel_facets").dicts()[0]
    return {"services": sorted(s for s in r["services"] if s), "models": sorted(m for m in r["models"] if m)}


def attribute_values(*, project_id: int, start: datetime, end: datetime, key: str, limit: int = 50) -> list[str]:
    """Values of span or resource attribute ``key`` in the window (the compare page's choices)."""
    r = get_store().query(
        "SELECT groupUniqArray({limit:UInt32})(if(mapContains(attributes, {attr_key:String}),"
        " attributes[{attr_key:String}], resource_attributes[{attr_key:String}])) AS vals FROM spans"
        " WHERE project_id = {project_id:UInt64}"
        " AND start_time >= fromUnixTimestamp64Milli({start_ms:Int64}) AND start_time < fromUnixTimestamp64Milli({end_ms:Int64})"
        " AND (mapContains(attributes, {attr_key:String}) OR mapContains(resource_attributes, {attr_key:String}))",
        _params(project_id, start, end, "", "", attr_key=key, limit=limit),
        tag="analytics.panel_selectors.attribute_values").dicts()[0]
    return sorted(v for v in r["vals"] if v)


# A page's reads are independent: run them side by side. A query releases the GIL while
# ClickHouse works, and each call borrows a connection of its own from the store's pool, so the
# page waits about as long as its slowest read instead of the sum. The thread pool lives as long
# as the process.
_POOL_WORKERS = 6
_pool = None
_pool_lock = threading.Lock()


def reads_concurrently(**reads: Callable[[], object]) -> dict[str, object]:
    """``{name: read()}`` for zero-argument reads, run on the shared pool; the first error raised
    by a read is raised here (after the others finish). A read must not call this itself (the
    pool is bounded: nested waits could take every worker)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_POOL_WORKERS, thread_name_prefix="panel-read")
    futures = {name: _pool.submit(read) for name, read in reads.items()}
    wait(futures.values())
    return {name: future.result() for name, future in futures.items()}


# The minutes the rollup task has not recomputed since they ended (from rollup_services.READY_JOB
# on: the open minute, at least) are read from the summaries (analytics.rollups.window_pieces).
# (Nothing when the rollup task never ran for the project: its rollups are then taken as they are.)
_READY_MS = ("ifNull(nullIf((SELECT max(value) FROM task_watermarks WHERE project_id = {project_id:UInt64}"
             " AND job = 'rollup_ready'), 0), 4102444800000)")
_NOT_ROLLED_UP_MS = f"toInt64(greatest(toInt64({{since_s:UInt32}}) * 1000, {_READY_MS}))"
# The hour of READY: the hours before it are rolled up whole (an hour's rollup is recomputed once the
# hour has ended: analytics.rollup_services), its closed minutes are in the minute rollup.
_READY_HOUR = f"toStartOfHour(fromUnixTimestamp64Milli(toInt64({_READY_MS}), 'UTC'))"


def first_request_since(*, project_id: int, since: datetime) -> datetime | None:
    """The start of the first minute with requests at or after ``since`` (the minute rollup, then
    the summaries of the minutes it does not hold yet), or None: what a page's default range is
    fitted to (``dashboard.timewindow.fit_preset``)."""
    recent = latest_summaries_sql("start_time", [("recent_ms", "end_ms")], where="has_root = 1").replace(
        "{recent_ms:Int64}", _NOT_ROLLED_UP_MS)
    r = get_store().query(
        "SELECT minIf(f, c > 0) AS first, sum(c) AS n FROM ("
        " SELECT toUnixTimestamp(min(bucket)) AS f, count() AS c FROM rollup_minute"
        " WHERE project_id = {project_id:UInt64} AND requests > 0 AND bucket >= toDateTime({since_s:UInt32}, 'UTC')"
        f" UNION ALL SELECT intDiv(toUnixTimestamp(min(start_time)), 60) * 60 AS f, count() AS c FROM ({recent}))",
        {"project_id": project_id, "since_s": int(since.timestamp()) // 60 * 60, "end_ms": 4102444800000},
        tag="analytics.panel_selectors.first_request_since").dicts()[0]
    if not r["n"]:
        return None
    return datetime.fromtimestamp(int(r["first"]), tz=timezone.utc)
