"""Reads of the rollups: the figures of DOMAIN.md "Over a time window" for the overview, costs and
compare pages and the series JSON endpoints, served from the minute/hour/day rollups.

The result types are ``analytics.panel_selectors``' (whose ``window_stats`` computes a window's
figures exactly from the per-trace summaries: the reference these are tested against). Each read
picks its tables by range:

- series whose step is under a minute (windows up to one or two hours, by the points asked) read
  the window's per-trace summaries, aggregated in buckets of that step as the minute rollup
  aggregates a minute (histograms included), so their percentiles are the rollups' and their
  working memory does not grow with the requests in the window;
- everything else reads minute rollups (windows up to 2 days: measured cheaper than mixing
  levels), or the coarsest rollups with whole buckets in the window — days, then six hours, then
  hours towards the edges, minutes for the partial hours — a series only uses a level whose bucket
  divides its step (a 30-day series of 6-hour steps reads six-hour rows, its KPIs days).

Windows are exact, whatever second they start and end on (DOMAIN.md "Over a time window"): the
whole minutes inside [start, end) come from the rollups, the partial minutes at its edges — and the
whole minutes the rollup task has not recomputed since they ended (the last minute or so: an open
minute is rolled up once, when it has ended; ``rollup_services.rollups_ready_ns``) — from the
per-trace summaries (the latest summary of each trace whose root starts there), aggregated by the
same expressions the minute rollup uses (``rollup_services.FROM_TRACES``) and added to the
rollups' rows — histograms included, so percentiles merge as well. A series' buckets therefore sum
to the window's figures, and a window and the one just before it never share a request. Percentiles come from the rollups' log-bucket histograms: the value shown is the
representative of the bucket that holds the nearest-rank percentile (the ⌈q·n⌉-th smallest
value), within 0.5 % of it (``HIST_GAMMA`` = 1.01). A phase's percentiles are over the requests
that spent time in it (as in ``panel_selectors``); TTFT's and TPOT's over the requests that have
one; the mean phase times (the stacked breakdown) over every request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from store import get_store

from . import panel_selectors
from .panel_selectors import (LATENCY_EDGES_MS, QUANTILES, LatencyHeatmap, ModelSpend, WindowSeries,
                              WindowStats)
from .rollup_services import FROM_TRACES, HIST_GAMMA, TRACE_COLUMNS, hist_entry_sql, hist_key_sql, rollups_ready_ns
from .selectors import bucket_seconds, bucket_times
from analytics.trace_math import PHASES

MINUTE, HOUR, DAY = 60, 3600, 86400
MINUTES_MAX_SECONDS = 2 * DAY  # longer windows read hours for their whole hours (series: if the step allows)
PROJECTION_DAYS = 7

_TABLE = {"minute": "rollup_minute", "hour": "rollup_hour", "6h": "rollup_6h", "day": "rollup_day"}
_QS = "[" + ", ".join(repr(q) for q in QUANTILES) + "]"


def _ceil(ts: int, step: int) -> int:
    return -(-ts // step) * step


def _floor(ts: int, step: int) -> int:
    return ts // step * step


_LEVEL_SIZES = (("day", DAY), ("6h", 6 * HOUR), ("hour", HOUR))  # each divides the one before


def _ns(t: datetime) -> int:
    """A time as integer unix nanoseconds (exact: no float rounding of the microseconds)."""
    return (t - _EPOCH) // timedelta(microseconds=1) * 1000


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MINUTE_NS = MINUTE * 1_000_000_000


def window_pieces(start: datetime, end: datetime, step: int | None = None, *, ready_ns: int = 0) -> list[tuple[str, int, int]]:
    """The pieces that cover [start, end) exactly once: rollup segments (level, from_s, to_s) for
    the whole minutes inside, and ("edge", from_ns, to_ns) for the partial minutes at either end
    (read from the per-trace summaries) — and for the whole minutes from ``ready_ns`` on, which the
    rollup task has not recomputed since they ended (``rollup_services.rollups_ready_ns``; 0: none)."""
    start_ns, end_ns = _ns(start), _ns(end)
    if end_ns <= start_ns:
        return []
    first = -(-start_ns // MINUTE_NS) * MINUTE_NS  # the first whole minute inside
    last = end_ns // MINUTE_NS * MINUTE_NS  # the end of the last whole minute inside
    if ready_ns:
        last = min(last, max(first, ready_ns // MINUTE_NS * MINUTE_NS))
    if first >= last:
        return [("edge", start_ns, end_ns)]
    pieces = [("edge", start_ns, first)] if start_ns < first else []
    pieces += rollup_segments(start_s=first // 1_000_000_000, end_s=last // 1_000_000_000, step=step)
    if last < end_ns:
        pieces.append(("edge", last, end_ns))
    return pieces


def _pieces(project_id: int, start: datetime, end: datetime, step: int | None = None) -> list[tuple[str, int, int]]:
    """``window_pieces`` for a project's reads: the minutes its rollups do not hold yet from the summaries."""
    return window_pieces(start, end, step, ready_ns=rollups_ready_ns(project_id=project_id))


def rollup_segments(*, start_s: int, end_s: int, step: int | None = None) -> list[tuple[str, int, int]]:
    """(level, from, to) pieces that cover the buckets starting in [start_s, end_s) once each: the
    coarsest level with whole buckets in the middle, finer ones towards the edges, minutes for the
    partial hours (only levels whose bucket divides ``step``, when a series asks)."""
    start_s = _floor(start_s, MINUTE)
    if end_s <= start_s:
        return []
    if end_s - start_s <= MINUTES_MAX_SECONDS:
        return [("minute", start_s, end_s)]
    sizes = [(level, size) for level, size in _LEVEL_SIZES if step is None or step % size == 0]

    def cover(lo: int, hi: int, levels: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
        for i, (level, size) in enumerate(levels):
            a, b = _ceil(lo, size), _floor(hi, size)
            if a < b:
                finer = levels[i + 1:]
                return cover(lo, a, finer) + [(level, a, b)] + cover(b, hi, finer)
        return [("minute", lo, hi)] if lo < hi else []

    return cover(start_s, end_s, sizes)


# The latest summary of every trace whose summary starts in one of the edge ranges, aggregated as a
# minute's rollup row: read from ``traces_by_start`` alone (panel_selectors.latest_summaries_sql),
# both edges of a window by one subquery.
def _latest(edges: list[tuple[int, int, int]]) -> tuple[str, dict]:
    """The latest summary of each request starting in the edge ranges (index, from_ns, to_ns), and
    the ranges' parameters (``elo{index}``, ``ehi{index}``)."""
    sql = panel_selectors.latest_summaries_sql(TRACE_COLUMNS, [(f"elo{i}", f"ehi{i}") for i, _, _ in edges],
                                               unit="Nano", where=panel_selectors.SCOPE)
    params = {}
    for i, lo, hi in edges:
        params[f"elo{i}"], params[f"ehi{i}"] = lo, hi
    return sql, params


def _edge_rows(edges: list[tuple[int, int, int]], columns: list[str]) -> tuple[str, dict]:
    keys = ("bucket", "service", "model")
    inner = ", ".join(f"{FROM_TRACES[c]} AS a_{c}" for c in columns if c not in keys)
    outer = ", ".join(c if c in keys else f"a_{c} AS {c}" for c in columns)
    latest, params = _latest(edges)
    return (
        f"SELECT {outer} FROM (SELECT toDateTime(intDiv(toUnixTimestamp64Nano(start_time), {MINUTE_NS}) * {MINUTE}, 'UTC')"
        f" AS bucket, service, model, {inner} FROM ({latest})"
        " GROUP BY bucket, service, model)"), params


def _source(segments: list[tuple[str, int, int]], columns: str, *, totals: bool = False) -> tuple[str, dict]:
    """The rows of the segments' levels, filtered; ``totals``: hours and days from the rollups
    summed over every service and model (for reads that filter neither and need no model).
    An ``edge`` segment's rows are aggregated from the summaries, like a minute's."""
    parts, params = [], {}
    edges = [(i, lo, hi) for i, (level, lo, hi) in enumerate(segments) if level == "edge"]
    if edges:
        rows, params = _edge_rows(edges, [c.strip() for c in columns.split(",")])
        parts.append(rows)
    for i, (level, lo, hi) in enumerate(segments):
        if level == "edge":
            continue
        table = _TABLE[level] + ("_all" if totals and level != "minute" else "")
        parts.append(
            f"SELECT {columns} FROM {table} FINAL WHERE project_id = {{project_id:UInt64}}"
            f" AND bucket >= toDateTime({{lo{i}:UInt32}}, 'UTC') AND bucket < toDateTime({{hi{i}:UInt32}}, 'UTC')"
            " AND ({service:String} = '' OR service = {service:String}) AND ({model:String} = '' OR model = {model:String})")
        params[f"lo{i}"], params[f"hi{i}"] = lo, hi
    return "(" + "\n UNION ALL ".join(parts) + ")", params


_SUM_COLUMNS = ("requests", "errors", "recovered", "error_spans", "e2e_sum_ns", "input_tokens", "output_tokens", "cost_usd",
                "cost_estimated_requests", "ttft_count", "tpot_count", *(f"{p}_sum_ns" for p in PHASES))
HISTOGRAMS = ("e2e", "ttft", "tpot", *PHASES)
SERIES_HISTOGRAMS = ("e2e", "ttft", "network")
_SUMS = ", ".join(f"sum({c}) AS s_{c}" for c in _SUM_COLUMNS)


def _rep_ms(key: int) -> float:
    """The value (ms) a histogram key stands for: within 0.5 % of every value counted under it."""
    return 0.0 if key == 0 else 2 * HIST_GAMMA ** key / (HIST_GAMMA + 1) / 1e6


def _first_key_at_least(ms: float) -> int:
    """The smallest histogram key whose value is at least ``ms``."""
    key = max(1, int(math.log(ms * 1e6 * (HIST_GAMMA + 1) / 2) / math.log(HIST_GAMMA)) - 2)
    while _rep_ms(key) < ms:
        key += 1
    return key


def _combined(hists: tuple[str, ...]) -> str:
    """Every entry of the chosen histograms of a row as (histogram index, key, count)."""
    parts = [f"arrayMap((k, c) -> (toUInt8({i}), k, c), mapKeys({h}_hist), mapValues({h}_hist))"
             for i, h in enumerate(hists)]
    return parts[0] if len(parts) == 1 else f"arrayConcat({', '.join(parts)})"


# Percentiles: the histogram entries of every row read are unrolled and weighed by their counts;
# quantilesExactWeighted gives the key where the running count reaches ⌈q·n⌉ (nearest rank). A
# typed hash table per group: several times cheaper than merging the maps with sumMap.
def _quantiles_query(source: str, hists: tuple[str, ...], time_expr: str) -> str:
    return (f"SELECT {time_expr} AS t, e.1 AS metric, quantilesExactWeighted({_QS[1:-1]})(e.2, e.3) AS q, sum(e.3) AS n "
            f"FROM {source} ARRAY JOIN {_combined(hists)} AS e GROUP BY t, metric")


def _read(segments, *, project_id: int, service: str, model: str, hists: tuple[str, ...], step: int | None,
          tag: str) -> tuple[dict[int, dict], dict[int, dict[str, tuple[list, int]]]]:
    """Sums per time bucket (``step``; one bucket 0 without) and the chosen histograms'
    quantile keys and counts per bucket — in one query (one round trip)."""
    if _all_summaries(segments):
        return _read_summaries(segments, project_id=project_id, service=service, model=model, hists=hists, step=step,
                               tag=tag)
    time_expr = "intDiv(toUnixTimestamp(bucket), {step:UInt32}) * {step:UInt32}" if step else "toUInt32(0)"
    totals = not service and not model
    source, params = _source(segments, ", ".join(("bucket", *_SUM_COLUMNS)), totals=totals)
    params.update(project_id=project_id, service=service, model=model, step=step or 1)
    sql = f"SELECT {time_expr} AS t, {_SUMS} FROM {source} GROUP BY t HAVING s_requests > 0"
    if hists:
        hist_source, _ = _source(segments, ", ".join(("bucket", *(f"{h}_hist" for h in hists))), totals=totals)
        sql = (f"SELECT sums.*, quantiles.found AS found FROM ({sql}) AS sums LEFT JOIN ("
               f"SELECT t, groupArray((metric, q, n)) AS found FROM ({_quantiles_query(hist_source, hists, time_expr)})"
               f" GROUP BY t) AS quantiles USING t")
    sums: dict[int, dict] = {}
    quantiles: dict[int, dict[str, tuple[list, int]]] = {}
    for r in get_store().query(sql, params, tag=tag).dicts():
        t = int(r["t"])
        sums[t] = r
        for metric, keys, n in r.get("found") or ():
            quantiles.setdefault(t, {})[hists[int(metric)]] = (keys, int(n))
    return sums, quantiles


def _summaries(segments, *, project_id: int, service: str, model: str) -> tuple[str, dict]:
    """The latest summary of each request starting in the (``edge``) segments, and its parameters."""
    sql, params = _latest([(i, lo, hi) for i, (_, lo, hi) in enumerate(segments)])
    return sql, {"project_id": project_id, "service": service, "model": model, **params}


def _summary_bucket(step: int | None) -> str:
    """A summary's time bucket of ``step`` seconds (unix seconds; 0 for one bucket)."""
    if not step:
        return "toUInt32(0)"
    return f"toUInt32(intDiv(toUnixTimestamp64Nano(start_time), {step * 1_000_000_000}) * {step})"


def _read_summaries(segments, *, project_id: int, service: str, model: str, hists: tuple[str, ...],
                    step: int | None, tag: str) -> tuple[dict[int, dict], dict[int, dict[str, tuple[list, int]]]]:
    """``_read`` of a window the rollups hold no minute of (one shorter than a minute, one the
    rollup task has not reached, a series finer than a minute): one pass over its per-trace
    summaries, the sums as the minute rollup computes them and each histogram's quantile keys
    straight from the summaries' keys (a hash table of keys per bucket: neither the maps an edge
    row builds to be added to rollup rows nor every request's value)."""
    latest, params = _summaries(segments, project_id=project_id, service=service, model=model)
    columns = [f"{FROM_TRACES[c]} AS s_{c}" for c in _SUM_COLUMNS]
    for i, h in enumerate(hists):
        key, condition = hist_entry_sql(h)
        columns.append(f"quantilesExactWeightedIf({_QS[1:-1]})({key}, toUInt64(1), {condition}) AS q{i}")
        columns.append(f"countIf({condition}) AS n{i}")
    sql = f"SELECT {_summary_bucket(step)} AS t, {', '.join(columns)} FROM ({latest}) GROUP BY t HAVING s_requests > 0"
    sums: dict[int, dict] = {}
    quantiles: dict[int, dict[str, tuple[list, int]]] = {}
    for r in get_store().query(sql, params, tag=tag).dicts():
        t = int(r["t"])
        sums[t] = r
        quantiles[t] = {h: (r[f"q{i}"], int(r[f"n{i}"])) for i, h in enumerate(hists)}
    return sums, quantiles


def _ms(found: tuple[list, int] | None) -> dict[float, float | None]:
    if not found or not found[1]:
        return dict.fromkeys(QUANTILES)
    return {q: round(_rep_ms(int(k)), 3) for q, k in zip(QUANTILES, found[0])}


def _stats(r: dict, quantiles: dict[str, tuple[list, int]], seconds: float) -> WindowStats:
    n = int(r["s_requests"])
    return WindowStats(
        seconds=seconds, requests=n, errors=int(r["s_errors"]), input_tokens=int(r["s_input_tokens"]),
        output_tokens=int(r["s_output_tokens"]), cost_usd=float(r["s_cost_usd"]),
        cost_estimated=int(r["s_cost_estimated_requests"]),
        e2e_ms=_ms(quantiles.get("e2e")), ttft_ms=_ms(quantiles.get("ttft")), tpot_ms=_ms(quantiles.get("tpot")),
        phase_ms={p: _ms(quantiles.get(p)) for p in PHASES},
        phase_mean_ms={p: (int(r[f"s_{p}_sum_ns"]) / n / 1e6 if n else None) for p in PHASES},
        e2e_mean_ms=int(r["s_e2e_sum_ns"]) / n / 1e6 if n else None,
        recovered=int(r["s_recovered"]), error_spans=int(r["s_error_spans"]),
    )


def _empty(seconds: float) -> WindowStats:
    none = dict.fromkeys(QUANTILES)
    return WindowStats(seconds=seconds, requests=0, errors=0, input_tokens=0, output_tokens=0, cost_usd=0.0,
                       cost_estimated=0, e2e_ms=dict(none), ttft_ms=dict(none), tpot_ms=dict(none),
                       phase_ms={p: dict(none) for p in PHASES}, phase_mean_ms=dict.fromkeys(PHASES),
                       e2e_mean_ms=None)


def _seconds(t: datetime) -> int:
    return int(t.timestamp())


def window_stats(*, project_id: int, start: datetime, end: datetime, service: str = "", model: str = "",
                 histograms: tuple[str, ...] = HISTOGRAMS) -> WindowStats:
    """Every window figure of DOMAIN.md over [start, end): requests, errors, tokens, cost,
    P50/P90/P95/P99 of E2E, TTFT, TPOT and each phase, mean phase times (properties give RPS,
    output tokens/s, concurrency, error rate, availability, cost per request / per 1k tokens,
    inference share). ``histograms``: whose percentiles to compute (default all; ``()`` for a
    page that shows none, e.g. the costs tiles: several times cheaper over long windows)."""
    seconds = (end - start).total_seconds()
    segments = _pieces(project_id, start, end)
    if not segments:
        return _empty(seconds)
    _check(histograms)
    sums, quantiles = _read(segments, project_id=project_id, service=service, model=model, hists=tuple(histograms),
                            step=None, tag="analytics.rollups.window_stats")
    return _stats(sums[0], quantiles.get(0, {}), seconds) if 0 in sums else _empty(seconds)


@dataclass(frozen=True)
class Rate:
    """Requests over a short span (the overview's current rate)."""

    requests: int
    seconds: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


_RATES_SOURCE = panel_selectors.latest_summaries_sql("start_time", [("lo", "hi")], unit="Nano",
                                                     where=panel_selectors.SCOPE)


def request_rates(*, project_id: int, spans: list[tuple[datetime, datetime]], service: str = "",
                  model: str = "") -> list[Rate]:
    """Requests (roots starting in each span, exactly) of a few short, recent spans, in one read
    of the per-trace summaries: cheaper than a window read each when they are minutes long."""
    if not spans:
        return []
    bounds = [(_ns(a), _ns(b)) for a, b in spans]
    counts = ", ".join(f"countIf(start_time >= fromUnixTimestamp64Nano({{lo{i}:Int64}})"
                       f" AND start_time < fromUnixTimestamp64Nano({{hi{i}:Int64}})) AS n{i}" for i in range(len(bounds)))
    params = {"project_id": project_id, "lo": min(lo for lo, _ in bounds), "hi": max(hi for _, hi in bounds),
              "service": service, "model": model}
    for i, (lo, hi) in enumerate(bounds):
        params[f"lo{i}"], params[f"hi{i}"] = lo, hi
    r = get_store().query(f"SELECT {counts} FROM ({_RATES_SOURCE})", params, tag="analytics.rollups.request_rates").dicts()[0]
    return [Rate(requests=int(r[f"n{i}"]), seconds=(b - a).total_seconds()) for i, (a, b) in enumerate(spans)]


def _check(histograms) -> None:
    unknown = set(histograms) - set(HISTOGRAMS)
    if unknown:
        raise ValueError(f"unknown histogram(s) {sorted(unknown)}; known: {HISTOGRAMS}")


def _series_pieces(project_id: int, start: datetime, end: datetime, points: int) -> tuple[int, list]:
    """A series' step (about ``points`` buckets) and the pieces it reads. A step under a minute
    (windows up to an hour or two) reads the whole window from the per-trace summaries (one
    ``edge`` piece: ``_all_summaries``), in buckets of that step, aggregated as the minute rollup is
    (histograms: percentiles within 0.5 %, as every longer series), so its working memory is bounded
    by its buckets, not by the requests in the window (exact percentiles kept every request's
    values: ~190 MiB for an hour of 8 M spans)."""
    step = bucket_seconds(start=start, end=end, points=points)
    if step < MINUTE:
        return step, [("edge", _ns(start), _ns(end))] if end > start else []
    return step, _pieces(project_id, start, end, step)


def _all_summaries(segments) -> bool:
    """Every piece is read from the summaries (none from the rollups): each request is a row."""
    return all(level == "edge" for level, _, _ in segments)


def window_series(*, project_id: int, start: datetime, end: datetime, service: str = "", model: str = "",
                  points: int = 120, histograms: tuple[str, ...] = SERIES_HISTOGRAMS) -> WindowSeries:
    """The window's figures per bucket of a step chosen for about ``points`` buckets (at least a
    minute; ``None`` for a bucket without requests). ``histograms``: whose percentiles to compute
    per bucket (of ``HISTOGRAMS``; the others are ``None``). By default those the pages draw over
    time (E2E, TTFT, network): every histogram costs a long window about 15 ms more; pass
    ``HISTOGRAMS`` for all, ``()`` for none (counts, tokens, cost and mean phase times only)."""
    _check(histograms)
    step, segments = _series_pieces(project_id, start, end, points)
    times = bucket_times(start=start, end=end, step=step)
    index = {_seconds(t): i for i, t in enumerate(times)}
    buckets: list[WindowStats | None] = [None] * len(times)
    if segments:
        sums, quantiles = _read(segments, project_id=project_id, service=service, model=model,
                                hists=tuple(histograms), step=step, tag="analytics.rollups.window_series")
        for t, r in sums.items():
            i = index.get(t)
            if i is not None:
                buckets[i] = _stats(r, quantiles.get(t, {}), step)
    return WindowSeries(start=start, end=end, step_seconds=step, times=times, buckets=buckets)


def latency_heatmap(*, project_id: int, start: datetime, end: datetime, service: str = "", model: str = "",
                    points: int = 120) -> LatencyHeatmap:
    """Requests per E2E latency bucket (``LATENCY_EDGES_MS``) per time bucket. From the rollups a
    request lands by its histogram value, so one within 0.5 % of an edge may fall on either side."""
    step, segments = _series_pieces(project_id, start, end, points)
    times = bucket_times(start=start, end=end, step=step)
    index = {_seconds(t): i for i, t in enumerate(times)}
    counts = [[0] * len(times) for _ in range(len(LATENCY_EDGES_MS) + 1)]
    if segments:
        def lat(key: str) -> str:
            return f"arrayCount(first -> {key} >= first, {{firsts:String}}::Array(UInt16)) AS lat"

        if _all_summaries(segments):  # each request's own key
            source, params = _summaries(segments, project_id=project_id, service=service, model=model)
            sql = (f"SELECT {_summary_bucket(step)} AS t, {lat(hist_key_sql('e2e_ns'))}, count() AS n"
                   f" FROM ({source}) GROUP BY t, lat")
        else:
            source, params = _source(segments, "bucket, e2e_hist", totals=not service and not model)
            sql = (f"SELECT intDiv(toUnixTimestamp(bucket), {{step:UInt32}}) * {{step:UInt32}} AS t, {lat('k')}, sum(c) AS n"
                   f" FROM {source} ARRAY JOIN mapKeys(e2e_hist) AS k, mapValues(e2e_hist) AS c GROUP BY t, lat")
        edges = "[" + ",".join(str(_first_key_at_least(edge)) for edge in LATENCY_EDGES_MS) + "]"
        for r in get_store().query(sql, {"project_id": project_id, "service": service, "model": model, "step": step,
                                         "firsts": edges, **params}, tag="analytics.rollups.latency_heatmap").dicts():
            i = index.get(int(r["t"]))
            if i is not None:
                counts[int(r["lat"])][i] += int(r["n"])
    return LatencyHeatmap(times=times, step_seconds=step, edges_ms=LATENCY_EDGES_MS, counts=counts)


# Cost and tokens per model of the calls (each call under its own model, DOMAIN.md "Cost").
# Rows summarised before migration 0012 carry no per-model map: their cost counts under the
# trace's model (the rollup row's), as it did then.
def _per_model(column: str) -> str:
    total = {"model_cost_usd": "cost_usd", "model_input_tokens": "input_tokens", "model_output_tokens": "output_tokens"}[column]
    return (f"if(empty({column}) AND {total} > 0, CAST(map(CAST(model AS String), {total}), 'Map(String, "
            f"{'Float64' if column == 'model_cost_usd' else 'UInt64'})'), {column})")


def spend_by_model(*, project_id: int, start: datetime, end: datetime, service: str = "", model: str = "",
                   points: int = 120) -> ModelSpend:
    """Cost per model per time bucket: each model call's cost under its own model ("(no model)"
    for spans without one). ``model`` filters the requests (by their first model call), as elsewhere."""
    step, segments = _series_pieces(project_id, start, end, points)
    times = bucket_times(start=start, end=end, step=step)
    index = {_seconds(t): i for i, t in enumerate(times)}
    out: dict[str, list[float | None]] = {}
    if segments:
        if _all_summaries(segments):  # each request a row, in its bucket of the step
            latest, params = _summaries(segments, project_id=project_id, service=service, model=model)
            source = (f"(SELECT toDateTime({_summary_bucket(step)}, 'UTC') AS bucket, model, toUInt64(1) AS requests,"
                      f" ifNull(cost_usd, 0) AS cost_usd, model_cost_usd FROM ({latest}))")
        else:
            source, params = _source(segments, "bucket, model, requests, cost_usd, model_cost_usd")
        sql = (f"SELECT intDiv(toUnixTimestamp(bucket), {{step:UInt32}}) * {{step:UInt32}} AS t, "
               f"sumMap({_per_model('model_cost_usd')}) AS costs FROM {source} GROUP BY t HAVING sum(requests) > 0")
        for r in get_store().query(sql, {"project_id": project_id, "service": service, "model": model, "step": step,
                                         **params}, tag="analytics.rollups.spend_by_model").dicts():
            i = index.get(int(r["t"]))
            if i is None:
                continue
            for m, cost in sorted(r["costs"].items()):
                out.setdefault(m or "(no model)", [None] * len(times))[i] = float(cost)
    return ModelSpend(times=times, step_seconds=step, cost_by_model=dict(sorted(out.items())))


@dataclass(frozen=True)
class ModelTotals:
    """One model's calls over a window: their tokens and cost (each call under its own model)."""

    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float


def model_totals(*, project_id: int, start: datetime, end: datetime, service: str = "",
                 model: str = "") -> list[ModelTotals]:
    """Tokens and spend per model over [start, end), most expensive first ("(no model)": spans
    that carry tokens or cost without a model)."""
    segments = _pieces(project_id, start, end)
    if not segments:
        return []
    source, params = _source(segments, "bucket, model, cost_usd, input_tokens, output_tokens, model_cost_usd, "
                                       "model_input_tokens, model_output_tokens")
    r = get_store().query(
        f"SELECT sumMap({_per_model('model_cost_usd')}) AS costs, sumMap({_per_model('model_input_tokens')}) AS ins,"
        f" sumMap({_per_model('model_output_tokens')}) AS outs FROM {source}",
        {"project_id": project_id, "service": service, "model": model, **params},
        tag="analytics.rollups.model_totals").dicts()[0]
    names = set(r["costs"]) | set(r["ins"]) | set(r["outs"])
    rows = [ModelTotals(model=m or "(no model)", input_tokens=int(r["ins"].get(m, 0)),
                        output_tokens=int(r["outs"].get(m, 0)), cost_usd=float(r["costs"].get(m, 0.0))) for m in names]
    return sorted(rows, key=lambda t: (-t.cost_usd, -(t.input_tokens + t.output_tokens), t.model))


@dataclass(frozen=True)
class SpendProjection:
    """Projected monthly spend = cost over the time the last 7 days actually cover × 30 days /
    that time (a project a day old is projected from its day, not from 7 days mostly empty)."""

    start: datetime  # where the data of the last 7 days begins (its first request), or 7 days ago
    end: datetime
    covered_seconds: float  # the time the projection is based on (0: no data)
    cost_covered: float  # the cost over that time
    projected_monthly: float
    by_model: dict[str, float]  # projected monthly spend per model (each call under its own model)

    @property
    def cost_last_7_days(self) -> float:
        return self.cost_covered

    @property
    def basis(self) -> str:
        """"37 minutes", "5.2 hours", "7 days": how much data the projection is based on."""
        seconds = self.covered_seconds
        if seconds < 2 * HOUR:
            minutes = max(1, round(seconds / MINUTE))
            return f"{minutes} minute{'s' if minutes != 1 else ''}"
        if seconds < 2 * DAY:
            return f"{seconds / HOUR:.1f} hours"
        return f"{seconds / DAY:.1f} days".replace(".0 days", " days")


MONTH_SECONDS = 30 * DAY

_FIRST_REQUEST_SQL = """SELECT toUnixTimestamp64Nano(start_time) FROM traces_by_start
WHERE project_id = {project_id:UInt64} AND has_root = 1
  AND start_time >= fromUnixTimestamp64Nano({start_ns:Int64}) AND start_time < fromUnixTimestamp64Nano({end_ns:Int64})
ORDER BY start_time LIMIT 1"""


def spend_projection(*, project_id: int, now: datetime | None = None, service: str = "", model: str = "") -> SpendProjection:
    end = now or datetime.now(timezone.utc)
    start = end - timedelta(days=PROJECTION_DAYS)
    first = get_store().query(_FIRST_REQUEST_SQL, {"project_id": project_id, "start_ns": _ns(start), "end_ns": _ns(end)},
                              tag="analytics.rollups.first_request").scalar()
    if first is None:
        return SpendProjection(start=start, end=end, covered_seconds=0.0, cost_covered=0.0, projected_monthly=0.0,
                               by_model={})
    # The project's data begins at its first request of the last 7 days (whatever the filters:
    # a filtered figure is projected over the same time, so models add up to the whole).
    covered_from = max(start, _EPOCH + timedelta(microseconds=int(first) // 1000))
    covered = max((end - covered_from).total_seconds(), 1.0)
    segments = _pieces(project_id, covered_from, end)
    source, params = _source(segments, "bucket, model, cost_usd, model_cost_usd")
    r = get_store().query(f"SELECT sum(cost_usd) AS cost, sumMap({_per_model('model_cost_usd')}) AS costs FROM {source}",
                          {"project_id": project_id, "service": service, "model": model, **params},
                          tag="analytics.rollups.spend_projection").dicts()[0]
    scale = MONTH_SECONDS / covered
    by_model = {(m or "(no model)"): float(c) * scale for m, c in sorted(r["costs"].items())}
    cost = float(r["cost"] or 0.0)
    return SpendProjection(start=covered_from, end=end, covered_seconds=covered, cost_covered=cost,
                           projected_monthly=cost * scale, by_model=by_model)


# --- compare -----------------------------------------------------------------------------------
COMPARE_FIGURES = {
    # name: (getter, unit, lower is better)
    "requests": (lambda s: s.requests, "", None),
    "rps": (lambda s: s.rps, "req/s", False),
    "output_tps": (lambda s: s.output_tps, "tokens/s", False),
    "error_rate": (lambda s: s.error_rate, "", True),
    "e2e_p50_ms": (lambda s: s.e2e_ms[0.5], "ms", True),
    "e2e_p95_ms": (lambda s: s.e2e_ms[0.95], "ms", True),
    "e2e_p99_ms": (lambda s: s.e2e_ms[0.99], "ms", True),
    "ttft_p50_ms": (lambda s: s.ttft_ms[0.5], "ms", True),
    "ttft_p95_ms": (lambda s: s.ttft_ms[0.95], "ms", True),
    "ttft_p99_ms": (lambda s: s.ttft_ms[0.99], "ms", True),
    "tpot_p50_ms": (lambda s: s.tpot_ms[0.5], "ms", True),
    **{f"{p}_p{int(q * 100)}_ms": ((lambda s, p=p, q=q: s.phase_ms[p][q]), "ms", True)
       for p in PHASES for q in (0.5, 0.95, 0.99)},
    "inference_share": (lambda s: s.inference_share, "", None),
    "cost_usd": (lambda s: s.cost_usd, "USD", True),
    "cost_per_request": (lambda s: s.cost_per_request, "USD", True),
    "cost_per_1k_tokens": (lambda s: s.cost_per_1k_tokens, "USD", True),
}


@dataclass(frozen=True)
class CompareRow:
    name: str
    unit: str
    a: float | None
    b: float | None
    change_percent: float | None  # (b − a) / a × 100; None when a is 0 or either is missing
    better: bool | None  # b better than a (None: no direction, or no change)


@dataclass(frozen=True)
class Comparison:
    a: WindowStats
    b: WindowStats
    rows: list[CompareRow]


def compare_stats(a: WindowStats, b: WindowStats) -> Comparison:
    """Side by side, with the difference in % (b against a)."""
    rows = []
    for name, (get, unit, lower_better) in COMPARE_FIGURES.items():
        va, vb = get(a), get(b)
        change = None if va in (None, 0) or vb is None else (vb - va) / va * 100
        better = None if change in (None, 0) or lower_better is None else (change < 0) == lower_better
        rows.append(CompareRow(name=name, unit=unit, a=va, b=vb, change_percent=change, better=better))
    return Comparison(a=a, b=b, rows=rows)


def compare_windows(*, project_id: int, a: tuple[datetime, datetime], b: tuple[datetime, datetime],
                    service: str = "", model: str = "") -> Comparison:
    """Two time windows (e.g. before and after an optimisation), same filters."""
    return compare_stats(window_stats(project_id=project_id, start=a[0], end=a[1], service=service, model=model),
                         window_stats(project_id=project_id, start=b[0], end=b[1], service=service, model=model))


def compare_models(*, project_id: int, start: datetime, end: datetime, model_a: str, model_b: str,
                   service: str = "") -> Comparison:
    """Two models over the same window."""
    return compare_stats(window_stats(project_id=project_id, start=start, end=end, service=service, model=model_a),
                         window_stats(project_id=project_id, start=start, end=end, service=service, model=model_b))


# Traces that carry attribute ``key`` = value_a or value_b on any span, as a span or resource
# attribute (``spans.dims``: a release, a variant), joined once with the window's requests (their
# latest summaries, panel_selectors.latest_summaries_sql),
# and per side the window's figures; percentiles as the rollups give them (nearest rank, to 0.5 %).
def _nearest_rank_sql(name: str, column: str, condition: str = "") -> str:
    """Nearest-rank quantiles as histogram keys, the same log buckets as the rollups (within 0.5 %):
    a small hash table of keys instead of sorting every value."""
    key = hist_key_sql(column)
    if condition:
        return (f"quantilesExactWeightedIf({_QS[1:-1]})({key}, toUInt64(1), {condition}) AS q_{name},"
                f" countIf({condition}) AS n_{name}")
    return f"quantilesExactWeighted({_QS[1:-1]})({key}, toUInt64(1)) AS q_{name}, count() AS n_{name}"


_ATTRIBUTE_REQUESTS = panel_selectors.latest_summaries_sql(
    "trace_id, status, error_spans, e2e_ns, input_tokens, output_tokens, cost_usd, cost_estimated, ttft_ns, tpot_ns, "
    + ", ".join(f"{p}_ns" for p in PHASES), [("start_ns", "end_ns")], unit="Nano", where=panel_selectors.SCOPE)
_ATTRIBUTE_SQL = f"""
WITH tagged AS (
    SELECT trace_id, min(dims[{{key:String}}]) AS side
    FROM spans
    WHERE project_id = {{project_id:UInt64}}
      AND start_time >= fromUnixTimestamp64Nano({{start_ns:Int64}}) - toIntervalMinute(5)
      AND start_time < fromUnixTimestamp64Nano({{end_ns:Int64}}) + toIntervalHour(1)
      AND mapContains(dims, {{key:String}}) AND dims[{{key:String}}] IN ({{value_a:String}}, {{value_b:String}})
    GROUP BY trace_id
)
SELECT side,
    count() AS s_requests, countIf(status = 'error') AS s_errors, countIf(status = 'recovered') AS s_recovered,
    sum(error_spans) AS s_error_spans, sum(e2e_ns) AS s_e2e_sum_ns,
    sum(input_tokens) AS s_input_tokens, sum(output_tokens) AS s_output_tokens, sum(ifNull(cost_usd, 0)) AS s_cost_usd,
    countIf(cost_estimated = 1) AS s_cost_estimated_requests,
    {", ".join(f"sum({p}_ns) AS s_{p}_sum_ns" for p in PHASES)},
    {_nearest_rank_sql("e2e", "e2e_ns")},
    {_nearest_rank_sql("ttft", "assumeNotNull(ttft_ns)", "ttft_ns IS NOT NULL")},
    {_nearest_rank_sql("tpot", "assumeNotNull(tpot_ns)", "tpot_ns IS NOT NULL")},
    {", ".join(_nearest_rank_sql(p, f"{p}_ns", f"{p}_ns > 0") for p in PHASES)}
FROM (
    SELECT t.*, tagged.side AS side
    FROM ({_ATTRIBUTE_REQUESTS}) AS t
    INNER JOIN tagged USING trace_id
)
GROUP BY side
"""


def _side_ms(r: dict, name: str) -> dict[float, float | None]:
    return _ms((r[f"q_{name}"], int(r[f"n_{name}"])))


def compare_attribute(*, project_id: int, start: datetime, end: datetime, key: str, value_a: str, value_b: str,
                      service: str = "", model: str = "") -> Comparison:
    """Two values of a span or resource attribute (two releases, two variants) over the same window:
    a trace is on a side when any of its spans carries ``key`` = that value. The rollups keep no
    attributes, so this reads the spans of the window and the summaries of the traces found."""
    seconds = (end - start).total_seconds()
    rows = {r["side"]: r for r in get_store().query(_ATTRIBUTE_SQL, {
        "project_id": project_id, "start_ns": _ns(start), "end_ns": _ns(end), "key": key,
        "value_a": value_a, "value_b": value_b, "service": service, "model": model,
    }, tag="analytics.rollups.compare_attribute").dicts()}

    def side(value: str) -> WindowStats:
        r = rows.get(value)
        if r is None:
            return _empty(seconds)
        n = int(r["s_requests"])
        return WindowStats(
            seconds=seconds, requests=n, errors=int(r["s_errors"]), input_tokens=int(r["s_input_tokens"]),
            output_tokens=int(r["s_output_tokens"]), cost_usd=float(r["s_cost_usd"]),
            cost_estimated=int(r["s_cost_estimated_requests"]), e2e_ms=_side_ms(r, "e2e"),
            ttft_ms=_side_ms(r, "ttft"), tpot_ms=_side_ms(r, "tpot"),
            phase_ms={p: _side_ms(r, p) for p in PHASES},
            phase_mean_ms={p: int(r[f"s_{p}_sum_ns"]) / n / 1e6 for p in PHASES},
            e2e_mean_ms=int(r["s_e2e_sum_ns"]) / n / 1e6,
            recovered=int(r["s_recovered"]), error_spans=int(r["s_error_spans"]))
    return compare_stats(side(value_a), side(value_b))
