"""The summariser: fills the ``traces`` table (one row per trace, every per-trace figure of
DOMAIN.md) from the raw spans, incrementally, computing the figures in ClickHouse.

Each run, per project, finds the traces that received spans since the last run (``ingested_at``
is stamped by ClickHouse at insert; a minmax index finds them without reading the column). Of
those, it keeps the traces whose spans' digest (a hash of every stored copy's span id and
``ingested_at``) differs from their latest summary's, and writes their summaries (deduplication,
tree, exclusive phase time, TTFT, tokens, cost with the project's price table) under a new
``version``, with the engine ``TRACEDASH_SUMMARY_ENGINE`` names: ``arrays`` (one columnar read of
the spans' copies, the figures in numpy, ``analytics.summary_arrays``; the default on the embedded
store) or ``sql`` (one ``INSERT … SELECT``, ``analytics.summary_sql``: no span leaves ClickHouse;
the default on a server).
A trace that grows later is summarised again and the newer row wins. The run re-reads an overlap
before its watermark, because an insert that began before the previous run (so its
``ingested_at`` lies before the watermark) may have become visible only after it; the digest
makes that re-read cost a three-column read, not a summary. On the embedded store, which makes
every insert itself, a run stops before the oldest insert still running instead and re-reads
nothing (``read_until_ms``), so it skips the digest check too. It marks the minutes whose rollups
changed (``rollup_dirty``; held in memory on the embedded store, analytics.rollup_marks) and tells open pages which traces were summarised (``traces.summarized``).
On the embedded store the arrivals and the new traces' spans come from memory where it holds the
run's window whole (``analytics.fresh_spans``), and so do the earlier spans of a trace summarised
without its root that grows (the memory keeps them a while): only other traces that grow are read back.

``trace_row`` computes the same row in Python with ``trace_math`` (the reference the SQL is tested
against, tests/test_summary_sql.py; seeds and bench/load_spans.py use it to write summaries directly).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
from django.conf import settings

from config.live import group_send
from ingest.services import traces_group
from store import get_store

from .prices import prices_for_project
from analytics import attribute_index, fresh_spans, rollup_marks, summary_arrays, summary_sql, trace_presence, watermarks

from analytics.trace_math import PHASES, Tree, trace_summarize

log = logging.getLogger("tracedash.summarizer")

JOB = "summarize"
MINUTE_NS = 60 * 1_000_000_000
EVENT_TRACE_IDS = 100  # trace ids in one live event (the page reloads its list anyway)


@dataclass
class SummarizeReport:
    projects: int = 0
    traces: int = 0
    spans: int = 0
    seconds: float = 0.0
    trace_ids: dict[int, list[str]] = field(default_factory=dict)  # per project (capped)


SUMMARIZE_LEASE = "traces-summarize"  # the per-project lease name of a summariser run (server.leases)


def _clock_ns() -> int:
    """ClickHouse's clock (the one that stamps ``ingested_at``), in unix ns: on the embedded store,
    this process's own (chdb runs in it and reads the same system clock; ``EmbeddedBackend.insert``
    stamps ``ingested_at`` from it), else the server's, read."""
    store = get_store()
    if store.kind == "embedded":
        return time.time_ns()
    return int(store.query("SELECT toUnixTimestamp64Nano(now64(9)) AS now_ns", tag="analytics.summarizer.clock").scalar())


def watermark_get(*, project_id: int, job: str) -> int:
    """Where ``job`` got to for the project (unix ms of the ClickHouse clock; 0: never ran); from
    memory where the store is this process's alone (analytics.watermarks)."""
    store = get_store()
    known = watermarks.known_for(store)
    if known is not None:
        return known.get(store, project_id, job, "analytics.summarizer.watermark_get")
    return int(store.query(watermarks.READ_SQL, {"project_id": project_id, "job": job},
                           tag="analytics.summarizer.watermark_get").scalar() or 0)


def summaries_fresh(*, project_id: int, within_seconds: float) -> bool:
    """Whether the project's summaries were brought up to the ClickHouse clock less than
    ``within_seconds`` ago (one small read, or none on the embedded store): a reader that needs
    them current can skip its own summariser run while the periodic one keeps up."""
    store = get_store()
    known = watermarks.known_for(store)
    if known is not None:
        value = known.get(store, project_id, JOB, "analytics.summarizer.watermark_get")
        return value > 0 and time.time_ns() // 1_000_000 - value <= int(within_seconds * 1000)
    return bool(store.query(
        "SELECT toUnixTimestamp64Milli(now64(3)) - max(value) <= {within_ms:Int64} FROM task_watermarks"
        " WHERE project_id = {project_id:UInt64} AND job = {job:String}",
        {"project_id": project_id, "job": JOB, "within_ms": int(within_seconds * 1000)},
        tag="analytics.summarizer.summaries_fresh",
    ).scalar())


def read_until_ms(store, table: str, *, clock_ms: int | None = None) -> tuple[int, int]:
    """(until, overlap), unix ms, for a run that reads ``table``'s rows by ``ingested_at`` from its
    watermark: it reads up to ``until`` and, from the watermark less ``overlap``, again.

    ``ingested_at`` is stamped when an insert starts and the rows become visible when it ends, so
    a run that read up to the clock could miss an insert in flight then. Where the store knows
    every insert (embedded: chdb's data directory belongs to this process), the run stops before
    the oldest one still running and needs no overlap; otherwise (a server, written by other
    processes too) it reads up to the clock and re-reads ``TRACEDASH_SUMMARIZE_OVERLAP_SECONDS``
    before the watermark (the summariser's digest makes that re-read cheap, not free: under steady
    traffic it was about a quarter of the summariser's time). ``clock_ms``: ClickHouse's clock, where
    the caller has just read it (saves reading it again)."""
    settled = store.settled_until_ms(table)
    if settled is not None:
        return settled, 0
    return (clock_ms if clock_ms is not None else _clock_ns() // 1_000_000,
            int(settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS * 1000))


def watermark_set(*, project_id: int, job: str, value: int, lazily: bool = False,
                  before_store: Callable[[], None] | None = None) -> None:
    """Store where ``job`` got to for the project. ``lazily``: on the embedded store, in memory alone
    until it is ``analytics.watermarks.STORE_EVERY_MS`` past the value stored (for a watermark
    nothing reads in SQL; a restart then redoes at most that much). ``before_store``: called just
    before the value is stored (not when it moves in memory alone)."""
    store = get_store()
    if lazily:
        known = watermarks.known_for(store)
        if known is not None and known.advance(project_id, job, int(value)):
            return
    if before_store is not None:
        before_store()
    watermarks_set(project_id=project_id, values={job: value})


def watermarks_set(*, project_id: int, values: dict[str, int]) -> None:
    """Store several of the project's watermarks (``{job: value}``) in one insert."""
    if values:
        get_store().insert("task_watermarks", [{"project_id": project_id, "job": job, "value": int(value)}
                                               for job, value in values.items()], tag="analytics.summarizer.watermark_set")


_TOUCHED_SQL = """
SELECT trace_id, min(toUnixTimestamp64Nano(start_time)) AS first_ns, max(toUnixTimestamp64Nano(start_time)) AS last_ns,
       count() AS spans
FROM spans
WHERE project_id = {project_id:UInt64}
  AND ingested_at >= fromUnixTimestamp64Milli({since_ms:Int64})
  AND ingested_at < fromUnixTimestamp64Milli({until_ms:Int64})
GROUP BY trace_id
ORDER BY first_ns, trace_id
"""

# The latest summary of each trace of a batch, by id: ``traces`` is ordered by trace id, but the ids
# of a batch are random, so this reads a granule of every part for most of them, i.e. a share of
# the whole table that grows with it (the table's size, up to ~1,000 rows per id). A batch looks
# up once: the digest check and the written rows use what it found (``traces_summarize_ids``).
_PREVIOUS_SQL = """
SELECT trace_id, toUnixTimestamp64Nano(spans_start) AS spans_start_ns, toUnixTimestamp64Nano(spans_end) AS spans_end_ns,
       toUnixTimestamp64Nano(start_time) AS start_ns, has_root, version, spans_digest
FROM traces
WHERE project_id = {project_id:UInt64} AND trace_id IN (SELECT arrayJoin(splitByChar(',', {trace_ids:String})))
ORDER BY version DESC
LIMIT 1 BY trace_id
"""

def _distinct(values: Iterable[object]) -> list[str]:
    return sorted({str(v) for v in values if v})


def trace_row(*, project_id: int, trace_id: str, spans: list[dict], prices, version: int) -> dict:
    """The ``traces`` row of one trace's (deduplicated) spans."""
    tree = Tree.build(spans)
    summary = trace_summarize((), prices=prices, tree=tree)
    starts = [int(s["start_ns"]) for s in tree.spans.values()]
    ends = [int(s["start_ns"]) + int(s["duration_ns"]) for s in tree.spans.values()]
    values = list(tree.spans.values())
    row = {
        "project_id": project_id,
        "trace_id": trace_id,
        "start_time": summary.start_ns,
        "e2e_ns": max(0, summary.e2e_ns),
        "has_root": int(summary.has_root),
        "spans_start": min(starts),
        "spans_end": max(ends),
        "root_name": summary.root_name,
        "service": summary.service,
        "model": summary.model,
        "services": _distinct(s.get("service") for s in values),
        "models": _distinct(s.get("model") for s in values),
        "phases": _distinct(s.get("phase") for s in values),
        "status": summary.status,
        "error_message": summary.error_message,
        "ttft_ns": summary.ttft_ns,
        "tpot_ns": summary.tpot_ns,
        "input_tokens": summary.input_tokens,
        "output_tokens": summary.output_tokens,
        "cost_usd": summary.cost_usd,
        "cost_estimated": int(summary.cost_estimated),
        "span_count": summary.span_count,
        "version": version,
        "error_spans": summary.error_spans,
        "model_input_tokens": {m: v[0] for m, v in summary.by_model.items() if v[0]},
        "model_output_tokens": {m: v[1] for m, v in summary.by_model.items() if v[1]},
        "model_cost_usd": {m: v[2] for m, v in summary.by_model.items() if v[2]},
        "cache": summary.cache,
    }
    for phase in PHASES:
        row[f"{phase}_ns"] = int(summary.phase_ns.get(phase, 0))
    return row


def _batches(touched: list[dict], size: int) -> Iterable[list[dict]]:
    for i in range(0, len(touched), size):
        yield touched[i:i + size]


# (lists travel as comma-joined text: chdb does not quote Array parameters)
_TRACE_FILTER = "trace_id IN (SELECT arrayJoin(splitByChar(',', {trace_ids:String})))"
_SPAN_FILTER = ("start_time >= fromUnixTimestamp64Nano({lo_ns:Int64}) "
                "AND start_time <= fromUnixTimestamp64Nano({hi_ns:Int64})")
_DIGESTS_SQL = summary_sql.span_digests_sql(trace_filter=_TRACE_FILTER, span_filter=_SPAN_FILTER)
_INSERT_SQL = summary_sql.summary_insert_sql(trace_filter=_TRACE_FILTER, span_filter=_SPAN_FILTER)
_SPANS_SQL = summary_arrays.spans_sql(trace_filter=_TRACE_FILTER, span_filter=_SPAN_FILTER)
# The spans of a few traces over a long range (``_read_groups``): the condition names the column,
# not spans_sql's ``toString(trace_id) AS trace_id``, so that the bloom filter on ``trace_id``
# skips the granules without these ids (one 30-minute trace among 3.6 M spans: ~35 ms, not ~95 or
# more). Only for a few ids: with a run's thousands it skips nothing and the read costs ~10 % more.
_FEW_SPANS_SQL = summary_arrays.spans_sql(trace_filter="spans." + _TRACE_FILTER, span_filter=_SPAN_FILTER)
_INSERT_ONE_THREAD_SQL = summary_sql.summary_insert_sql(trace_filter=_TRACE_FILTER, span_filter=_SPAN_FILTER, threads=1)
# A batch's long-lived traces are read apart (``_read_groups``): at most this many, those whose
# earlier spans start more than FAR_BEFORE_NS, and three times the rest's range, before the rest's.
APART_TRACES = 4
FAR_BEFORE_NS = 60 * 1_000_000_000
# The declared attribute keys each summarised trace carries (analytics.attribute_index).
_INDEX_SQL = attribute_index.traces_index_sql(trace_filter=_TRACE_FILTER, span_filter=_SPAN_FILTER)
# The rows just written, read by start: a summary starts at one of the spans it was computed from,
# all of which lie in [lo, hi], so only that range's granules are read (by id in ``traces`` it
# would be a share of the whole table again, as ``_PREVIOUS_SQL``).
_WRITTEN_SQL = f"""
SELECT trace_id, toUnixTimestamp64Nano(start_time) AS start_ns, span_count
FROM traces_by_start
WHERE project_id = {{project_id:UInt64}} AND {_SPAN_FILTER} AND version = {{version:UInt64}} AND {_TRACE_FILTER}
"""


def summary_engine(store) -> str:
    """The engine ``TRACEDASH_SUMMARY_ENGINE`` names; ``auto``: ``arrays`` on the embedded store
    (chdb hands the columns over as Arrow in place), ``sql`` on a server (the native driver turns
    every value into a Python object, and the statement runs on the server's cores)."""
    engine = settings.TRACEDASH_SUMMARY_ENGINE
    if engine == "auto":
        return "arrays" if store.kind == "embedded" else "sql"
    return engine


def _previous(store, project_id: int, ids: list[str]) -> dict[str, dict]:
    """The latest summary of each of ``ids`` that has one (``_PREVIOUS_SQL``'s columns), by id. On
    the embedded store most are answered from memory (analytics.trace_presence: new traces and
    those summarised in the last minute), and only the rest are read by id."""
    presence = trace_presence.presence_for(store)
    found, ask = ({}, ids) if presence is None else presence.split(project_id, ids)
    if ask:
        found.update((r["trace_id"], r) for r in store.query(
            _PREVIOUS_SQL, {"project_id": project_id, "trace_ids": ",".join(ask)},
            tag="analytics.summarizer.previous").dicts())
    return found


@dataclass
class Written:
    """The summaries a batch wrote, a column each: their traces' ids, starts (unix ns), span counts
    and whether they have a root."""
    trace_ids: list[str]
    start_ns: np.ndarray
    span_count: np.ndarray
    has_root: np.ndarray


def _write(store, reads: list[tuple[list[dict], object, dict]], *, prices, project_id: int, version: int) -> Written:
    """Write the summaries of the traces each ``(traces, spans, params)`` of ``reads`` names with the
    configured engine (``TRACEDASH_SUMMARY_ENGINE``; ``spans``: the ``arrays`` engine's read,
    ``_SPANS_SQL`` or ``_FEW_SPANS_SQL`` for a few traces over a long range, or the spans themselves
    from memory, analytics.fresh_spans); returns what was written."""
    presence = trace_presence.presence_for(store)
    if summary_engine(store) == "arrays":
        rows = summary_arrays.summaries_write(store, [(spans, params) for _, spans, params in reads],
                                              project_id=project_id, version=version, prices=prices)
        if not len(rows):
            return Written([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
        ids = list(rows.column("trace_id"))
        if presence is not None:
            presence.written(project_id, ids, rows)
        return Written(ids, np.asarray(rows.column("start_time"), dtype=np.int64),
                       np.asarray(rows.column("span_count"), dtype=np.int64),
                       np.asarray(rows.column("has_root"), dtype=bool))
    written = []
    for traces, _, params in reads:
        # A small batch (an incremental run's) on one thread: half the CPU; a large one (a backlog,
        # a rebuild) on all of them: the same CPU, sooner.
        counts = [t.get("spans") for t in traces]
        small = None not in counts and sum(int(c) for c in counts) <= settings.TRACEDASH_SUMMARIZE_ONE_THREAD_SPANS
        store.command(_INSERT_ONE_THREAD_SQL if small else _INSERT_SQL, params, tag=trace_presence.SUMMARY_WRITE_TAG)
        rows = store.query(_WRITTEN_SQL, params, tag="analytics.summarizer.written").dicts()
        if presence is not None:
            presence.written(project_id, [r["trace_id"] for r in rows])
        written.extend(rows)
    return Written([r["trace_id"] for r in written], np.array([int(r["start_ns"]) for r in written], dtype=np.int64),
                   np.array([int(r["span_count"]) for r in written], dtype=np.int64),
                   np.ones(len(written), dtype=bool))  # (this engine does not tell)


def _start_range(traces: list[dict], previous: dict[str, dict]) -> tuple[int, int]:
    """The start range of the traces' new spans (``first_ns``, ``last_ns``) and of the spans their
    previous summaries saw."""
    return (min([int(t["first_ns"]) for t in traces] + [int(p["spans_start_ns"]) for p in previous.values()]),
            max([int(t["last_ns"]) for t in traces] + [int(p["spans_end_ns"]) for p in previous.values()]))


def _read_groups(batch: list[dict], previous: dict[str, dict]) -> list[tuple[list[dict], bool]]:
    """The batch's reads, as (traces, few). One read covers every span that started in the batch's
    range, so a long-lived trace that grows (an agent's session: new spans now, its first ones
    half an hour ago) would have each run read every span of that half hour. Those traces (at most
    APART_TRACES, whose earlier spans start FAR_BEFORE_NS and three times the rest's range before
    the rest's) are read apart, by id (``_FEW_SPANS_SQL``); each group costs its own statements. A
    batch of only such traces (the new ones of the run came from memory: analytics.fresh_spans) is
    read by id when it spans more than FAR_BEFORE_NS."""
    grown = [t for t in batch if t["trace_id"] in previous]
    if not grown:
        return [(batch, False)]
    first = {t["trace_id"]: _start_range([t], {"": previous[t["trace_id"]]})[0] for t in grown}
    far = {t["trace_id"] for t in sorted(grown, key=lambda t: first[t["trace_id"]])[:APART_TRACES]}
    rest = [t for t in batch if t["trace_id"] not in far]
    if not rest:
        # Only these few traces, all grown (the new ones came from memory): one read, by id where
        # they span more than FAR_BEFORE_NS.
        lo, hi = _start_range(batch, {t["trace_id"]: previous[t["trace_id"]] for t in batch})
        return [(batch, hi - lo > FAR_BEFORE_NS)]
    lo, hi = _start_range(rest, {t["trace_id"]: previous[t["trace_id"]] for t in rest if t["trace_id"] in previous})
    cut = lo - max(FAR_BEFORE_NS, 3 * (hi - lo))
    apart = {t for t in far if first[t] < cut}
    if not apart:
        return [(batch, False)]
    return [([t for t in batch if t["trace_id"] not in apart], False), ([t for t in batch if t["trace_id"] in apart], True)]


def traces_summarize_ids(*, project_id: int, touched: list[dict], prices=None, version: int | None = None,
                         mark_dirty: bool = True, skip_unchanged: bool = False,
                         keys: list[str] | None = None,
                         window: fresh_spans.Window | None = None,
                         rootless: list[str] | None = None,
                         held: rollup_marks.HeldMarks | None = None) -> tuple[list[str], int]:
    """Summarise the traces in ``touched`` (``trace_id``, ``first_ns``, ``last_ns``: the start
    range of their new spans; ``spans``, where known: how many) in ClickHouse, write their rows
    and mark the minutes to roll up again. ``skip_unchanged``: leave out traces whose spans are
    exactly those their latest summary was computed from (the incremental runs' overlap). ``keys``:
    the attribute keys to index for these traces (default: the project's declared ones). ``window``:
    the arrivals ``touched`` came from, held in memory (analytics.fresh_spans; the ``arrays`` engine):
    a trace without a summary has all its spans there and is not read back, nor is one that grows
    whose earlier spans the memory holds whole (``Window.grown``). ``rootless``: gets the ids of
    the traces written without a root (where the engine tells). ``held``: the minutes to roll up
    again are held there (analytics.rollup_marks; the caller flushes them before it stores its
    watermark) instead of inserted. Returns (trace ids written, spans summarised)."""
    store = get_store()
    if prices is None:
        prices = prices_for_project(project_id=project_id)
    version = version or _clock_ns()
    if keys is None:
        keys = attribute_index.declared_keys(project_id=project_id)
    base = {"project_id": project_id, "version": version, "prices": summary_sql.prices_json(prices),
            "keys": attribute_index.keys_json(keys)}
    written: list[str] = []
    spans_read = 0
    for batch in _batches(touched, settings.TRACEDASH_SUMMARIZE_BATCH_TRACES):
        previous = _previous(store, project_id, [t["trace_id"] for t in batch])
        reads = []
        new, rest = [], batch
        if window is not None:
            # A trace without a summary has every stored copy of its spans in the window (a span
            # that arrived before it was summarised then): from memory. The others grow: read.
            new = [t for t in batch if t["trace_id"] not in previous]
            rest = [t for t in batch if t["trace_id"] in previous]
            if rest:
                # A trace that grows (its root arrives after its children, as exporters send them)
                # whose earlier spans the memory kept, exactly those its summary saw: from memory too.
                whole = set(window.grown({t["trace_id"]: previous[t["trace_id"]]["spans_digest"] for t in rest},
                                         base["prices"]))
                new += [t for t in rest if t["trace_id"] in whole]
                rest = [t for t in rest if t["trace_id"] not in whole]
        groups = [(new, window)] if new else []
        groups += [(group, _FEW_SPANS_SQL if few else _SPANS_SQL) for group, few in (_read_groups(rest, previous) if rest else [])]
        for group, spans in groups:
            ids = [t["trace_id"] for t in group]
            seen = {t: previous[t] for t in ids if t in previous}
            # Every span of these traces lies within the new spans' range and the range the previous
            # summary saw, so one bounded read finds them all.
            lo, hi = _start_range(group, seen)
            params = dict(base, lo_ns=lo, hi_ns=hi, trace_ids=",".join(ids))
            if spans is window:
                spans = window.spans_of(ids, base["prices"])
            if skip_unchanged and seen:
                ids = sorted(r["trace_id"] for r in store.query(_DIGESTS_SQL, params, tag="analytics.summarizer.changed").dicts()
                             if r["trace_id"] not in seen or int(seen[r["trace_id"]]["spans_digest"]) != int(r["digest"]))
                if not ids:
                    continue  # every summary is already the latest
                # The summary reads every column it needs of the spans in [lo, hi]: bound it by the
                # traces to write alone, not by the whole overlap the digest check had to cover
                # (under steady traffic most touched traces are unchanged ones from the overlap).
                changed = set(ids)
                group = [t for t in group if t["trace_id"] in changed]
                lo, hi = _start_range(group, {t: p for t, p in seen.items() if t in changed})
                params.update(trace_ids=",".join(ids), lo_ns=lo, hi_ns=hi)
            reads.append((group, spans, params))
        if not reads:
            continue
        rows = _write(store, reads, prices=prices, project_id=project_id, version=version)
        if keys:
            for _, _, params in reads:
                store.command(_INDEX_SQL, params, tag="analytics.summarizer.index")
        # Columns, not a loop over every trace: under traffic that arrives whole nearly every trace
        # is new (no previous summary), and only those that grew are looked at one by one.
        minutes = rows.start_ns // MINUTE_NS
        dirty = set(np.unique(minutes).tolist())
        moved: list[tuple[str, int]] = []
        for i, trace_id in enumerate(rows.trace_ids if previous else ()):
            before = previous.get(trace_id)
            if before is None:
                continue
            start_ns = int(rows.start_ns[i])
            if before["has_root"]:
                dirty.add(int(before["start_ns"]) // MINUTE_NS)
            if int(before["start_ns"]) != start_ns:
                moved.append((trace_id, int(before["start_ns"])))
        spans_read += int(rows.span_count.sum())
        if rootless is not None:
            rootless.extend(rows.trace_ids[i] for i in np.flatnonzero(~rows.has_root).tolist())
        starts_retire(project_id=project_id, moved=moved, version=version)
        if dirty and mark_dirty:
            if held is not None:
                held.add(project_id, [m * MINUTE_NS for m in dirty])
            else:
                rollup_marks.marks_insert(store, project_id, [m * MINUTE_NS for m in dirty])
        written.extend(sorted(rows.trace_ids))
    return written, spans_read


# A retired start (store.schema.TRACES_BY_START): a row under the start a trace's summary had
# before, one version below the summary that moved it (which lies under its new start), so that it
# replaces the old row there under FINAL and the trace counts once, at its new start.
_RETIRE_SQL = """
INSERT INTO traces_by_start (project_id, trace_id, start_time, version)
SELECT {project_id:UInt64}, toFixedString(m.1, 32), fromUnixTimestamp64Nano(toInt64(m.2)), {version:UInt64} - 1
FROM (SELECT arrayJoin(arrayZip(splitByChar(',', {trace_ids:String}), splitByChar(',', {starts:String}))) AS m)
"""


def starts_retire(*, project_id: int, moved: list[tuple[str, int]], version: int) -> None:
    """Retire the old starts of the traces whose summary ``version`` moved them (``moved``: trace
    id, start the previous summary had, unix ns) in ``traces_by_start``. Whoever writes a summary
    whose start differs from the trace's previous one calls this (the summariser does)."""
    if moved:
        get_store().command(_RETIRE_SQL, {"project_id": project_id, "version": int(version),
                                          "trace_ids": ",".join(t for t, _ in moved),
                                          "starts": ",".join(str(int(s)) for _, s in moved)},
                            tag="analytics.summarizer.starts_retire")


_BOUND_SQL = """
SELECT count() AS n, min(t) AS first_ms, max(t) AS last_ms
FROM (
    SELECT toUnixTimestamp64Milli(ingested_at) AS t
    FROM spans
    WHERE project_id = {project_id:UInt64}
      AND ingested_at >= fromUnixTimestamp64Milli({since_ms:Int64})
      AND ingested_at < fromUnixTimestamp64Milli({until_ms:Int64})
    ORDER BY ingested_at
    LIMIT {limit:UInt64}
)
"""


def _bounded_until(*, project_id: int, since_ms: int, until_ms: int) -> int:
    """Where this run stops reading: ``until_ms``, or earlier when more than
    ``TRACEDASH_SUMMARIZE_MAX_SPANS`` spans arrived since the watermark ``since_ms`` (a backlog — a
    bulk load, a first run — is worked off over several runs, each short). One insert's spans share their
    ``ingested_at``, so a run takes a whole insert even when it alone is over the limit: it stops
    before the arrival of the span past the limit, or just after the first arrival when that is
    the same one (stopping before it would read nothing, and the run after would stop there again)."""
    limit = int(settings.TRACEDASH_SUMMARIZE_MAX_SPANS)
    n, first_ms, last_ms = get_store().query(
        _BOUND_SQL, {"project_id": project_id, "since_ms": since_ms, "until_ms": until_ms, "limit": limit + 1},
        tag="analytics.summarizer.bound").rows[0]
    if int(n) <= limit:
        return until_ms
    return min(until_ms, max(int(last_ms), int(first_ms) + 1))


def traces_summarize(*, project_ids: Iterable[int] | None = None) -> SummarizeReport:
    """One incremental run over the given projects (default: every project). Idempotent."""
    from projects.models import Project

    started = time.perf_counter()
    report = SummarizeReport()
    store = get_store()
    if project_ids is None:
        project_ids = list(Project.objects.values_list("pk", flat=True))
    # On the embedded store the spans that arrived are in memory (analytics.fresh_spans): a run
    # whose window it holds whole reads neither which traces arrived nor the new traces' spans.
    fresh = fresh_spans.fresh_for(store) if summary_engine(store) == "arrays" else None
    # On the embedded store the rollups' marks are held in memory until the watermark is stored.
    held = rollup_marks.held_for(store)
    for project_id in project_ids:
        report.projects += 1
        until_ms, overlap_ms = read_until_ms(store, "spans")
        watermark = watermark_get(project_id=project_id, job=JOB)
        since_ms = max(0, watermark - overlap_ms)
        window = None
        if fresh is not None and not overlap_ms:
            window = fresh.window(project_id, watermark, until_ms, int(settings.TRACEDASH_SUMMARIZE_MAX_SPANS))
        if window is not None:
            until_ms = window.until_ms
            touched = window.touched()
        else:
            until_ms = _bounded_until(project_id=project_id, since_ms=watermark, until_ms=until_ms)
            touched = store.query(_TOUCHED_SQL, {"project_id": project_id, "since_ms": since_ms, "until_ms": until_ms},
                                  tag="analytics.summarizer.touched").dicts()
        if touched:
            # Only an overlap re-reads spans that a summary has already seen; without one (the
            # embedded store) every touched trace received a span since its latest summary, and
            # the digest check would read the spans' ids once more to find nothing to skip.
            rootless: list[str] = []
            written, spans = traces_summarize_ids(project_id=project_id, touched=touched,
                                                  skip_unchanged=overlap_ms > 0, window=window, rootless=rootless,
                                                  held=held)
            report.traces += len(written)
            report.spans += spans
            report.trace_ids[project_id] = written[:EVENT_TRACE_IDS]
            traces_summarized_notify(project_id=project_id, trace_ids=written)
            # Stored at most every 10 s of progress on the embedded store (a restart summarises those
            # traces again, and marks their minutes again); known at once to every reader in this
            # process. The marks held until then are stored first.
            watermark_set(project_id=project_id, job=JOB, value=until_ms, lazily=True,
                          before_store=None if held is None else lambda: held.flush(store, project_id))
            if fresh is not None:
                fresh.consumed(project_id, until_ms, keep=rootless)
        elif fresh is not None and window is None and since_ms == watermark:
            fresh.quiet(project_id, watermark, until_ms)  # the memory can take the next window from the watermark
        # Nothing arrived: the watermark stays (the next run reads from it again, as cheaply),
        # and an idle project writes nothing.
    report.seconds = time.perf_counter() - started
    return report


_RANGE_SQL = """
SELECT trace_id, min(toUnixTimestamp64Nano(start_time)) AS first_ns, max(toUnixTimestamp64Nano(start_time)) AS last_ns,
       count() AS spans
FROM spans
WHERE project_id = {project_id:UInt64}
  AND start_time >= fromUnixTimestamp64Nano({lo_ns:Int64} - {pad_ns:Int64})
  AND start_time < fromUnixTimestamp64Nano({hi_ns:Int64} + {pad_ns:Int64})
GROUP BY trace_id
HAVING first_ns >= {lo_ns:Int64} AND first_ns < {hi_ns:Int64}
ORDER BY first_ns, trace_id
"""


def traces_rebuild(*, project_id: int, from_ns: int, to_ns: int, chunk_seconds: int = 3600,
                   progress: Callable[[int, int, int], None] | None = None, mark_dirty: bool = True) -> int:
    """Summarise again every trace whose first span starts in [from_ns, to_ns), a chunk of time
    at a time (for data loaded in bulk, or after the price table changed). ``progress(done_ns,
    total_ns, traces)`` is called after each chunk. Returns the number of traces written.
    ``mark_dirty=False`` when the caller rebuilds the range's rollups itself (the rollup task need
    not redo them)."""
    prices = prices_for_project(project_id=project_id)
    chunk_ns = chunk_seconds * 1_000_000_000
    pad_ns = int(settings.TRACEDASH_TRACE_MAX_SECONDS * 1_000_000_000)
    total = 0
    cursor = from_ns
    while cursor < to_ns:
        end = min(cursor + chunk_ns, to_ns)
        # A trace belongs to the chunk its first span starts in; spans up to the longest trace
        # length (TRACEDASH_TRACE_MAX_SECONDS) either side are looked at to find its bounds.
        touched = get_store().query(
            _RANGE_SQL, {"project_id": project_id, "lo_ns": cursor, "hi_ns": end, "pad_ns": pad_ns},
            tag="analytics.summarizer.rebuild_range").dicts()
        if touched:
            written, _ = traces_summarize_ids(project_id=project_id, touched=touched, prices=prices,
                                              mark_dirty=mark_dirty)
            total += len(written)
        cursor = end
        if progress is not None:
            progress(cursor - from_ns, to_ns - from_ns, total)
    return total


def traces_summarized_notify(*, project_id: int, trace_ids: list[str]) -> None:
    """Tell the project's open pages which traces have new summaries (``traces.summarized``).
    The rows are already written: a live-update failure is logged, never raised."""
    if not trace_ids:
        return
    group_send(traces_group(project_id), {
        "type": "traces.summarized", "count": len(trace_ids), "trace_ids": trace_ids[:EVENT_TRACE_IDS],
    })
