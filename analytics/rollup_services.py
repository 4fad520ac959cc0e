"""Rollup writes: per-minute, hour, six-hour and day aggregates per project/service/model (and
hour, six-hour and day totals over every service and model).

A bucket is always recomputed whole from its source (minutes from the latest summaries in
``traces``, hours from minutes, six hours from hours, days from six hours) by one
``INSERT … SELECT`` inside ClickHouse, with a higher ``version``; reads take the latest row of each key (FINAL). So recomputing a bucket
twice changes nothing, a late span never counts twice (its trace's new summary replaces the old
one, and the bucket is recomputed from the summaries), and a key that vanished from a bucket (a
trace moved to another model when its model call arrived) is written as a zero row.

Which minutes: those the summariser marked in ``rollup_dirty`` since this job's watermark (minus an
overlap, as the summariser does), and those it holds in memory on the embedded store
(analytics.rollup_marks) — every minute a summary was written in, or moved out of — and, as a
safety net, every minute of the late-arrival window (``TRACEDASH_ROLLUP_LATE_SECONDS``), re-covered
whatever the marks say by a run with marks at most every ``TRACEDASH_ROLLUP_LATE_EVERY_SECONDS``
(its own watermark, ``rollup_late``). Only minutes that have ended are recomputed: the open one
(its marks taken, ``rollup_deferred`` noting it) is recomputed by the first run after it ended, and
readers take the whole minutes from ``rollup_ready`` on from the summaries (``rollups.window_pieces``).
Likewise an hour, six hours or day is recomputed with its minutes only once it has ended (by the
first run after its end, when one was left open): readers take it whole only from then on.
Re-covering the window on every 10 s run and the current minute on each aggregated each trace about
66 times; the window once a minute, about 17; the open minute deferred and the window every 300 s,
about 3.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from django.conf import settings

from store import get_store
from store.schema import ROLLUP_HISTOGRAMS, ROLLUP_MINUTE

from . import rollup_marks

from .summarizer import _clock_ns, read_until_ms, watermark_get, watermarks_set
from analytics.trace_math import PHASES

from .panel_selectors import latest_summaries_sql

JOB = "rollup"
LATE_JOB = "rollup_late"  # when the late-arrival window was last re-covered
# The open minute: every minute before READY was recomputed after it closed; marks of a minute that
# had not closed yet are taken but the minute is recomputed once it has (DEFERRED: the end of the
# latest such minute). Readers take the whole minutes from READY on from the summaries (rollups.py).
READY_JOB = "rollup_ready"
DEFERRED_JOB = "rollup_deferred"
NS = 1_000_000_000
MINUTE, HOUR, DAY = 60, 3600, 86400
SIX_HOURS = 6 * HOUR
LEVELS = {"minute": ("rollup_minute", MINUTE), "hour": ("rollup_hour", HOUR), "6h": ("rollup_6h", SIX_HOURS),
          "day": ("rollup_day", DAY), "hour_all": ("rollup_hour_all", HOUR), "6h_all": ("rollup_6h_all", SIX_HOURS),
          "day_all": ("rollup_day_all", DAY)}
# Where each level is computed from: (source, the bucket expression over the source's buckets).
_SIX = "toStartOfInterval(bucket, toIntervalHour(6))"
_SOURCES = {"hour": ("rollup_minute FINAL", "toStartOfHour(bucket)"), "6h": ("rollup_hour FINAL", _SIX),
            "day": ("rollup_6h FINAL", "toStartOfDay(bucket)"), "hour_all": ("rollup_hour FINAL", "bucket"),
            "6h_all": ("rollup_hour_all FINAL", _SIX), "day_all": ("rollup_6h_all FINAL", "toStartOfDay(bucket)")}
HIST_GAMMA = 1.01  # histogram bucket growth: the value shown is within (γ-1)/(γ+1) < 0.5 % of the exact one
_LN_GAMMA = math.log(HIST_GAMMA)

_KEYS = ("project_id", "bucket", "service", "model")
_COLUMNS = [c.name for c in ROLLUP_MINUTE.insert_columns]
_AGGREGATES = [c for c in _COLUMNS if c not in (*_KEYS, "version")]
_MAPS = {c.name: c.type for c in ROLLUP_MINUTE.columns if c.type.startswith("Map(")}  # histograms, per-model maps
# The order ``_select`` writes its values in (INSERT … SELECT matches by position).
_COLUMN_LIST = ", ".join((*_KEYS, *_AGGREGATES, "version"))


def hist_key_sql(expr: str) -> str:
    """The histogram key of a value in ns: 0 for <= 1 ns, else ceil(log_γ(value)). The log's argument
    is kept finite and >= 1 on every row, because ClickHouse evaluates the key on rows the ``-If``
    combinator then leaves out: ``assumeNotNull`` of a NULL TPOT or TTFT returns whatever its slot
    holds (NaN where it was computed as 0/0), and log of NaN, 0 or inf cannot be cast to an integer —
    a served demo's minute rollup failed on one."""
    safe = f"if(isFinite({expr}) AND {expr} > 1, {expr}, 1)"
    return f"toUInt16(ceil(log({safe}) / {_LN_GAMMA!r}))"


def hist_entry_sql(name: str) -> tuple[str, str]:
    """Histogram ``name``'s key of a per-trace summary, and the condition under which the summary
    counts in it: every request in E2E's; TTFT's and TPOT's, the requests that have one; a phase's,
    the requests that spent time in it (its percentiles are over those)."""
    if name == "e2e":
        return hist_key_sql("e2e_ns"), "1"
    if name in ("ttft", "tpot"):
        col = f"{name}_ns"
        return hist_key_sql(f"assumeNotNull({col})"), f"{col} IS NOT NULL"
    return hist_key_sql(f"{name}_ns"), f"{name}_ns > 0"


def _hist_from_traces(name: str) -> str:
    key, condition = hist_entry_sql(name)
    if condition == "1":
        return f"sumMap(map({key}, toUInt64(1)))"
    return f"sumMapIf(map({key}, toUInt64(1)), {condition})"


# Minutes from the latest summaries of rooted traces (a request is a trace whose root arrived).
FROM_TRACES = {
    "requests": "count()",
    # DOMAIN.md "Status": a request is an error when its root failed; recovered when its root
    # succeeded although a span below it failed (not an error request).
    "errors": "countIf(status = 'error')",
    "recovered": "countIf(status = 'recovered')",
    "error_spans": "sum(error_spans)",
    # Tokens and cost of each call under its own model (not the trace's first model's).
    "model_input_tokens": "sumMap(model_input_tokens)",
    "model_output_tokens": "sumMap(model_output_tokens)",
    "model_cost_usd": "sumMap(model_cost_usd)",
    "e2e_sum_ns": "sum(e2e_ns)",
    "e2e_max_ns": "max(e2e_ns)",
    "input_tokens": "sum(input_tokens)",
    "output_tokens": "sum(output_tokens)",
    "cost_usd": "sum(ifNull(cost_usd, 0))",
    "cost_requests": "countIf(cost_usd IS NOT NULL)",
    "cost_estimated_requests": "countIf(cost_estimated = 1)",
    "ttft_sum_ns": "sum(ifNull(ttft_ns, 0))",
    "ttft_count": "countIf(ttft_ns IS NOT NULL)",
    "tpot_sum_ns": "sum(ifNull(tpot_ns, 0))",
    "tpot_count": "countIf(tpot_ns IS NOT NULL)",
    **{f"{p}_sum_ns": f"sum({p}_ns)" for p in PHASES},
    **{f"{h}_hist": _hist_from_traces(h) for h in ROLLUP_HISTOGRAMS},
}
# Coarser buckets from finer ones: sums add, maxima take the max, histograms add key by key.
_FROM_ROLLUP = {c: ("max(e2e_max_ns)" if c == "e2e_max_ns" else f"sumMap({c})" if c in _MAPS else f"sum({c})")
                for c in _AGGREGATES}
_ZERO = {c: (f"CAST(map(), '{_MAPS[c]}')" if c in _MAPS else "0") for c in _AGGREGATES}


def _select(exprs: dict[str, str], bucket: str, dims: tuple[str, str]) -> str:
    parts = ["project_id", f"{bucket} AS b", f"{dims[0]} AS s", f"{dims[1]} AS m"]
    # Aliases differ from the column names (an alias named like a column would shadow it in the
    # other aggregates); INSERT … SELECT matches columns by position.
    parts += [f"{exprs[c]} AS a_{c}" for c in _AGGREGATES]
    parts.append("{version:UInt64} AS version")
    return ",\n    ".join(parts)


# The latest summary of every trace whose latest summary starts in [lo, hi), read by start from
# ``traces_by_start FINAL`` (panel_selectors.latest_summaries_sql): the range's granules only. It
# used to find them by id in ``traces`` (ordered by trace id: the ids of a few minutes lie in every
# granule, so each run read the whole table, its cost and memory growing with the data — the
# soak's RSS spiked every 10 s, higher each time).
TRACE_COLUMNS = """project_id, trace_id, start_time, service, model, has_root, status, e2e_ns, input_tokens,
        output_tokens, cost_usd, cost_estimated, ttft_ns, tpot_ns, network_ns, preprocess_ns, inference_ns,
        postprocess_ns, other_ns, error_spans, model_input_tokens, model_output_tokens, model_cost_usd"""
_LATEST_TRACES = latest_summaries_sql(TRACE_COLUMNS, [("lo_ns", "hi_ns")], unit="Nano")
_BUCKETS = "(SELECT toDateTime(toUInt32(arrayJoin(splitByChar(',', {buckets:String}))), 'UTC'))"


def _recompute_sql(level: str) -> str:
    """INSERT the buckets of ``level`` listed in {buckets} (unix seconds, comma-joined; all within
    [{lo_ns}, {hi_ns})), recomputed from their source, plus zero rows for keys no longer there."""
    table, _ = LEVELS[level]
    dims = ("''", "''") if level.endswith("_all") else ("service", "model")
    if level == "minute":
        source = f"({_LATEST_TRACES})"
        time_col, bucket = "start_time", "toStartOfMinute(start_time)"
        where_extra = " AND has_root = 1"
        exprs = FROM_TRACES
    else:
        source, bucket = _SOURCES[level]
        time_col, where_extra, exprs = "bucket", "", _FROM_ROLLUP
    where = (f"project_id = {{project_id:UInt64}} AND {time_col} >= fromUnixTimestamp64Nano({{lo_ns:Int64}}) "
             f"AND {time_col} < fromUnixTimestamp64Nano({{hi_ns:Int64}}) AND {bucket} IN {_BUCKETS}{where_extra}")
    # A key is still there when its source has requests for it: zero rows of finer levels (keys
    # that vanished there) must not keep it alive here.
    live = "" if level == "minute" else " AND requests > 0"
    fresh = (f"SELECT\n    {_select(exprs, bucket, dims)}\nFROM {source}\nWHERE {where}\n"
             "GROUP BY project_id, b, s, m\nHAVING a_requests > 0")
    gone_parts = ["project_id", "bucket AS b", "service AS s", "model AS m"]
    gone_parts += [f"{_ZERO[c]} AS a_{c}" for c in _AGGREGATES]
    gone_parts.append("{version:UInt64} AS version")
    gone = (f"SELECT {', '.join(gone_parts)}\nFROM {table} FINAL\n"
            f"WHERE project_id = {{project_id:UInt64}} AND bucket IN {_BUCKETS} AND requests > 0\n"
            f"  AND (bucket, service, model) NOT IN (SELECT {bucket}, {dims[0]}, {dims[1]} FROM {source} WHERE {where}{live})")
    return f"INSERT INTO {table} ({_COLUMN_LIST})\n{fresh}\nUNION ALL\n{gone}"


_SQL = {level: _recompute_sql(level) for level in LEVELS}


def _floor(ts: int, step: int) -> int:
    return ts - ts % step


def rollup_buckets_recompute(*, project_id: int, level: str, buckets: Iterable[int], version: int | None = None) -> int:
    """Recompute the given buckets (unix seconds, aligned to the level) of one level. Returns how
    many were recomputed."""
    buckets = sorted(set(int(b) for b in buckets))
    if not buckets:
        return 0
    _, step = LEVELS[level]
    version = version or _clock_ns()
    store = get_store()
    for i in range(0, len(buckets), 2000):  # keep the IN list reasonable
        chunk = buckets[i:i + 2000]
        store.command(_SQL[level], {
            "project_id": project_id, "version": version,
            "lo_ns": chunk[0] * NS, "hi_ns": (chunk[-1] + step) * NS,
            "buckets": ",".join(str(b) for b in chunk),  # chdb does not quote Array parameters
        }, tag=f"analytics.rollup_services.recompute_{level}")
    return len(buckets)


# The coarser levels, each after the one it is computed from (``_SOURCES``), with their bucket size.
_UPPER = (("hour", HOUR), ("hour_all", HOUR), ("6h", SIX_HOURS), ("6h_all", SIX_HOURS), ("day", DAY), ("day_all", DAY))


def rollup_minutes_recompute(*, project_id: int, minutes: Iterable[int], ended_by_s: int | None = None,
                             ended: dict[int, Iterable[int]] | None = None) -> tuple[int, int, int]:
    """Recompute the given minutes (unix seconds) and the hours, six hours and days that hold them.
    ``ended_by_s``: only the coarser buckets that ended by then (unix s); one still open is left
    out (no reader takes it before it has ended: ``rollups.window_pieces``), and the run after its
    end recomputes it (``ended``: {bucket size: buckets} to recompute whatever ``minutes`` holds).
    Returns (minutes, hours, days) recomputed."""
    minutes = sorted({_floor(int(m), MINUTE) for m in minutes})
    n_minutes = rollup_buckets_recompute(project_id=project_id, level="minute", buckets=minutes)
    done = {}
    for level, size in _UPPER:
        buckets = {_floor(m, size) for m in minutes}
        if ended_by_s is not None:
            buckets = {b for b in buckets if b + size <= ended_by_s}
        buckets |= set((ended or {}).get(size, ()))
        done[level] = rollup_buckets_recompute(project_id=project_id, level=level, buckets=buckets)
    return n_minutes, done["hour"], done["day"]


@dataclass
class RollupReport:
    projects: int = 0
    minutes: int = 0
    hours: int = 0
    days: int = 0
    seconds: float = 0.0


_DIRTY_SQL = """
SELECT DISTINCT toUnixTimestamp(bucket) AS minute
FROM rollup_dirty
WHERE project_id = {project_id:UInt64}
  AND marked_at >= fromUnixTimestamp64Milli({since_ms:Int64})
  AND marked_at < fromUnixTimestamp64Milli({until_ms:Int64})
"""


def rollups_update(*, project_ids: Iterable[int] | None = None, now_ns: int | None = None) -> RollupReport:
    """One incremental run: per project with new marks, recompute the marked minutes and the
    late-arrival window, then their hours, six hours and days. Idempotent; an idle project costs
    one read and writes nothing."""
    from projects.models import Project

    started = time.perf_counter()
    report = RollupReport()
    if project_ids is None:
        project_ids = list(Project.objects.values_list("pk", flat=True))
    late = int(settings.TRACEDASH_ROLLUP_LATE_SECONDS)
    late_every_ms = int(settings.TRACEDASH_ROLLUP_LATE_EVERY_SECONDS * 1000)
    held = rollup_marks.held_for(get_store())
    for project_id in project_ids:
        report.projects += 1
        clock = _clock_ns()
        until_ms, overlap_ms = read_until_ms(get_store(), "rollup_dirty", clock_ms=clock // 1_000_000)
        until_ms = min(until_ms, clock // 1_000_000)
        since_ms = max(0, watermark_get(project_id=project_id, job=JOB) - overlap_ms)
        marked = {int(r[0]) for r in get_store().query(
            _DIRTY_SQL, {"project_id": project_id, "since_ms": since_ms, "until_ms": until_ms},
            tag="analytics.rollup_services.dirty").rows}
        if held is not None:  # the marks the summariser holds in memory (analytics.rollup_marks)
            held_minutes, sequence = held.taken(project_id)
            marked.update(m // NS for m in held_minutes)
        marked = sorted(marked)
        now_s = (now_ns or clock) // NS
        closed_s = _floor(now_s, MINUTE)  # every minute before it has ended
        ready_s = watermark_get(project_id=project_id, job=READY_JOB) // 1000
        deferred_s = watermark_get(project_id=project_id, job=DEFERRED_JOB) // 1000
        # Minutes whose marks an earlier run took while they were open, closed since: recompute them now.
        closing = range(ready_s, min(deferred_s, closed_s), MINUTE) if deferred_s > ready_s else range(0)
        if not marked and not closing:
            continue  # nothing was summarised: no rollup can have changed (and nothing is written)
        cover_window = until_ms - watermark_get(project_id=project_id, job=LATE_JOB) >= late_every_ms
        window = range(_floor(now_s - late, MINUTE), closed_s, MINUTE) if cover_window else range(0)
        # An open minute is not recomputed: its traces keep arriving, and every read takes the
        # minutes from READY on from the summaries (each run recomputed the current minute again:
        # about six times a minute at the default 10 s). Nor is an hour, six hours or day that has
        # not ended: readers take one only once every minute of it is before READY, and a trace
        # that starts just before a minute's end marks that minute again for tens of seconds, each
        # run recomputing all six coarser levels with it (``_UPPER``). The run after a bucket's end
        # recomputes it: those the last run's READY fell in that have ended since.
        deferred = [m for m in marked if m >= closed_s]
        ended = {size: [_floor(ready_s - 1, size)] for size in (HOUR, SIX_HOURS, DAY)
                 if ready_s and ready_s < _floor(ready_s - 1, size) + size <= closed_s}
        minutes, hours, days = rollup_minutes_recompute(
            project_id=project_id, minutes=[m for m in marked if m < closed_s] + list(window) + list(closing),
            ended_by_s=closed_s, ended=ended)
        # The run's watermarks in one insert; one that would not move (the open minute deferred
        # again: every run under traffic, a minute long) is not written.
        moved = {JOB: until_ms}
        if deferred and (max(deferred) + MINUTE) > deferred_s:
            moved[DEFERRED_JOB] = (max(deferred) + MINUTE) * 1000
        if closed_s > ready_s:
            moved[READY_JOB] = closed_s * 1000
        if cover_window:
            moved[LATE_JOB] = until_ms
        report.minutes += minutes
        report.hours += hours
        report.days += days
        watermarks_set(project_id=project_id, values=moved)
        if held is not None:
            held.done(project_id, sequence)
    report.seconds = time.perf_counter() - started
    return report


def rollups_ready_ns(*, project_id: int) -> int:
    """Unix ns before which every minute's rollup is complete (its minute ended before the rollup
    task last ran); 0 when the task never ran for the project (every minute's rollup is then taken
    as it is, as rollups_rebuild's callers expect)."""
    return watermark_get(project_id=project_id, job=READY_JOB) * 1_000_000


def rollups_rebuild(*, project_id: int, from_ns: int, to_ns: int,
                    progress: Callable[[int, int], None] | None = None) -> int:
    """Recompute every minute, hour and day rollup in [from_ns, to_ns) (widened to whole days),
    a day at a time; ``progress(days_done, days_total)`` after each. Returns minutes recomputed."""
    first = _floor(from_ns // NS, DAY)
    last = _floor((to_ns - 1) // NS, DAY)
    days = list(range(first, last + DAY, DAY))
    total = 0
    for i, day in enumerate(days, 1):
        minutes = range(day, day + DAY, MINUTE)
        total += rollup_buckets_recompute(project_id=project_id, level="minute", buckets=minutes)
        hours = range(day, day + DAY, HOUR)
        rollup_buckets_recompute(project_id=project_id, level="hour", buckets=hours)
        rollup_buckets_recompute(project_id=project_id, level="hour_all", buckets=hours)
        rollup_buckets_recompute(project_id=project_id, level="6h", buckets=range(day, day + DAY, SIX_HOURS))
        rollup_buckets_recompute(project_id=project_id, level="6h_all", buckets=range(day, day + DAY, SIX_HOURS))
        rollup_buckets_recompute(project_id=project_id, level="day", buckets=[day])
        rollup_buckets_recompute(project_id=project_id, level="day_all", buckets=[day])
        if progress is not None:
            progress(i, len(days))
    return total
