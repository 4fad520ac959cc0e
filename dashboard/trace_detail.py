"""One trace, whole: its spans (deduplicated), the per-trace figures of DOMAIN.md, self times, the
critical path and the tree (depth, orphans, clock skew). The trace page, its JSON endpoint and the
comparison page read traces here.

The GenAI events that arrived as OTLP log records (``span_logs``) are read for the page and the
JSON (one more query, only once the trace is found) and shown with their span.

A trace is found without scanning ``spans``: the ``traces`` summary (ordered by trace id) gives the
time bounds of its spans, in the same query, so it reads only the partitions and granules of that
window, and the trace-id bloom filter skips the rest. A trace not yet summarised (its spans
arrived seconds ago) is found through the bloom filter alone.
"""

from __future__ import annotations

import functools
import gc
import json
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter

from store import get_store

from analytics.panel_selectors import latest_summaries_sql
from analytics.prices import prices_for_project
from analytics.trace_math import (PHASES, SPAN_FIELDS_SQL, Tree, TraceSummary, critical_path, phase_of,
                                   trace_summarize)

TRACE_ID_RE = re.compile(r"[0-9a-f]{32}\Z")
NS = 1_000_000_000
MS = 1_000_000
# The summary's bounds cover the spans it saw; a span that arrived since (the summariser runs
# every few seconds) can start a little outside them, e.g. a parent whose children came first.
# A minute each side keeps those on the page while still reading a narrow time range.
_BOUNDS_MARGIN_NS = 60 * NS

# Flags shown in the header (DOMAIN.md rules of thumb).
INFERENCE_SHARE_LIMIT = 0.60
NETWORK_LIMIT_NS = 200 * MS


def trace_id_valid(trace_id: str) -> bool:
    return bool(TRACE_ID_RE.match(trace_id or ""))


_SPANS_SELECT = f"""
SELECT {SPAN_FIELDS_SQL}, attributes, resource_attributes,
    arrayMap(t -> toUnixTimestamp64Nano(t), event_times) AS event_ns, event_names, event_attributes
FROM spans
WHERE project_id = {{project_id:UInt64}} AND trace_id = {{trace_id:FixedString(32)}}{{window}}
ORDER BY ingested_at DESC
LIMIT 1 BY span_id
"""
# One round trip: the trace's bounds come from its summary (a primary-key lookup in ``traces``, a
# scalar subquery ClickHouse evaluates before it chooses the partitions and granules to read).
_SPANS_SQL = f"""
WITH (
    SELECT (fromUnixTimestamp64Nano(toUnixTimestamp64Nano(spans_start) - {_BOUNDS_MARGIN_NS}),
            fromUnixTimestamp64Nano(toUnixTimestamp64Nano(spans_end) + {_BOUNDS_MARGIN_NS}))
    FROM traces WHERE project_id = {{project_id:UInt64}} AND trace_id = {{trace_id:FixedString(32)}}
    ORDER BY version DESC LIMIT 1
) AS bounds""" + _SPANS_SELECT.replace("{window}", "\n  AND start_time >= bounds.1 AND start_time <= bounds.2")
_SPANS_UNBOUNDED_SQL = _SPANS_SELECT.replace("{window}", "")


def trace_spans(*, project_id: int, trace_id: str) -> list[dict]:
    """The trace's spans, one per span_id (the most recently ingested copy of a re-sent span).

    One store round trip when the trace has a summary: its spans are read within the summary's
    bounds. A trace not summarised yet (its spans arrived seconds ago), or whose summary is stale
    (the spans it saw were dropped by TTL), is read again without bounds, found through the
    trace-id bloom filter."""
    params = {"project_id": project_id, "trace_id": trace_id}
    rows = get_store().query(_SPANS_SQL, params, tag="dashboard.trace_detail.trace_spans").dicts()
    if not rows:
        rows = get_store().query(_SPANS_UNBOUNDED_SQL, params, tag="dashboard.trace_detail.trace_spans_unbounded").dicts()
    return rows


# The trace's GenAI events (OTLP log records, ``span_logs``, ordered by trace then time): a
# primary-key lookup, read beside the spans query (``trace_get``), so it needs no bounds from it.
# Identical records (an exporter's retry of a batch the server had taken) are shown once.
MAX_GENAI_EVENTS = 10_000
_GENAI_EVENTS_SQL = """
SELECT span_id, toUnixTimestamp64Nano(time) AS time_ns, event_name, severity, body, attributes
FROM span_logs
WHERE project_id = {project_id:UInt64} AND trace_id = {trace_id:FixedString(32)}
ORDER BY time, span_id
LIMIT 1 BY span_id, time, event_name, body
LIMIT {limit:UInt32}
"""
# Threads that read a trace's GenAI events while the request's thread reads its spans (embedded
# each call borrows a connection of its own from the store's pool, and a query releases the GIL).
_EVENTS_READER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tracedash-trace-events")


def read_beside(fn, /, **kwargs):
    """``fn(**kwargs)`` started on the readers' threads (a store read to run while this thread reads
    the spans): its future."""
    return _EVENTS_READER.submit(fn, **kwargs)


def _body_value(text: str):
    """The stored body (JSON text of the OTLP AnyValue) as the value it was: a string, a map, …"""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:  # not written by ingest (a hand-made row): shown as the text it is
        return text


def trace_genai_events(*, project_id: int, trace_id: str) -> list[dict]:
    """The trace's GenAI events, oldest first (at most ``MAX_GENAI_EVENTS``), each
    ``{span_id, time_ns, name, severity, body, attributes}``."""
    rows = get_store().query(_GENAI_EVENTS_SQL, {"project_id": project_id, "trace_id": trace_id,
                                                 "limit": MAX_GENAI_EVENTS},
                             tag="dashboard.trace_detail.trace_genai_events").dicts()
    return [{"span_id": r["span_id"], "time_ns": int(r["time_ns"]), "name": r["event_name"], "severity": r["severity"],
             "body": _body_value(r["body"]), "attributes": dict(r["attributes"])} for r in rows]


@dataclass
class SpanView:
    """A span as the waterfall shows it (one row)."""

    span_id: str
    parent_span_id: str
    name: str
    phase: str  # in the figures: a span that stated no phase beneath a model call is inference
    reported_phase: str  # the phase it was stored with, where that differs ('' otherwise)
    service: str
    model: str
    start_ns: int
    duration_ns: int
    status: str
    status_message: str
    ttft_ns: int | None
    input_tokens: int | None  # None: not reported
    output_tokens: int | None
    cost_usd: float | None
    attributes: dict
    resource_attributes: dict
    events: list[dict]
    genai_events: list[dict]  # GenAI events sent as OTLP log records for this span, oldest first
    depth: int
    self_ns: int
    child_count: int
    orphan: bool  # its parent id is set, but no such span arrived
    extra_root: bool  # a second span without a parent (the first, longest one is the root)
    critical_ns: int  # this span's own time on the critical path
    on_critical_path: bool  # its own time or a descendant's is on the critical path
    skew_note: str  # "starts 12.0 ms before its parent" etc. ('' if inside its parent)

    def as_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def as_row(self) -> tuple:
        return _span_row(self)


SPAN_FIELDS = tuple(SpanView.__dataclass_fields__)
_span_row = attrgetter(*SPAN_FIELDS)  # one C call per span for the column-wise JSON


@dataclass
class TraceDetail:
    project_id: int
    trace_id: str
    summary: TraceSummary
    spans: list[SpanView]  # depth-first: the root's tree, other parentless spans, then orphans
    critical_path: list[tuple[str, int, int]]
    flags: list[str] = field(default_factory=list)
    # GenAI events of the trace that name no span of it (none, or one that has not arrived)
    genai_events: list[dict] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        return min((s.start_ns for s in self.spans), default=0)

    @property
    def end_ns(self) -> int:
        return max((s.start_ns + s.duration_ns for s in self.spans), default=0)

    def phases(self) -> list[dict]:
        """Exclusive time per phase with its share of E2E, in PHASES order."""
        e2e = self.summary.e2e_ns
        return [{"phase": p, "ns": self.summary.phase_ns.get(p, 0),
                 "share": (self.summary.phase_ns.get(p, 0) / e2e) if e2e > 0 else None} for p in PHASES]


def _count(value) -> int | None:
    return None if value is None else int(value)


def _skew_note(span: dict, parent: dict | None) -> str:
    if parent is None:
        return ""
    start, end = int(span["start_ns"]), int(span["start_ns"]) + int(span["duration_ns"])
    p_start, p_end = int(parent["start_ns"]), int(parent["start_ns"]) + int(parent["duration_ns"])
    notes = []
    if start < p_start:
        notes.append(f"starts {(p_start - start) / MS:.1f} ms before its parent")
    if end > p_end:
        notes.append(f"ends {(end - p_end) / MS:.1f} ms after its parent")
    if notes:
        return "; ".join(notes) + " (clock skew between hosts?); drawn where it was reported"
    return ""


def trace_flags(summary: TraceSummary) -> list[str]:
    """The DOMAIN.md rules of thumb this trace breaks."""
    flags = []
    share = summary.phase_share("inference")
    if share is not None and share > INFERENCE_SHARE_LIMIT:
        flags.append(f"Inference is {share:.0%} of latency (over {INFERENCE_SHARE_LIMIT:.0%}): the model, not the app, dominates.")
    network = summary.phase_ns.get("network", 0)
    if network > NETWORK_LIMIT_NS:
        flags.append(f"Network time is {network / MS:.0f} ms (over {NETWORK_LIMIT_NS // MS} ms): check the region or the connection.")
    return flags


def trace_detail_build(*, project_id: int, trace_id: str, rows: list[dict],
                       prices: Mapping[str, tuple[float, float]] | None = None,
                       genai_events: Sequence[dict] = ()) -> TraceDetail:
    """The whole trace from its (deduplicated) span rows; ``prices`` (the project's price table)
    estimates the cost of spans that carry tokens but no cost, as the summariser does.
    ``genai_events`` (``trace_genai_events``) go to their span, or to the trace when it has no such span."""
    tree = Tree.build(rows)
    events_by_span: dict[str, list[dict]] = {}
    trace_events = []
    for event in genai_events:
        if event["span_id"] in tree.spans:
            events_by_span.setdefault(event["span_id"], []).append(event)
        else:
            trace_events.append(event)
    # Phase times and the rows' self times need the same per-span intervals: compute them once.
    tree.self_intervals = functools.cache(tree.self_intervals)
    summary = trace_summarize((), prices=prices, tree=tree)
    path = critical_path((), tree=tree)
    critical: dict[str, int] = {}
    for span_id, lo, hi in path:
        critical[span_id] = critical.get(span_id, 0) + (hi - lo)
    on_path: set[str] = set()
    for span_id in critical:  # a span whose descendant is on the path is on it too
        while span_id and span_id not in on_path and span_id in tree.spans:
            on_path.add(span_id)
            span_id = str(tree.spans[span_id].get("parent_span_id") or "")
    orphans = set(tree.orphans)
    extra_roots = sorted((sid for sid, s in tree.spans.items() if not s.get("parent_span_id") and sid != tree.root),
                         key=lambda sid: (int(tree.spans[sid]["start_ns"]), sid))
    tops = ([tree.root] if tree.root is not None else []) + extra_roots + list(tree.orphans)

    views: list[SpanView] = []
    stack = [(sid, 0) for sid in reversed(tops)]
    while stack:  # iterative depth-first walk: a 10,000-deep chain must not hit the recursion limit
        span_id, depth = stack.pop()
        span = tree.spans[span_id]
        kids = tree.children.get(span_id, [])
        parent = tree.spans.get(span.get("parent_span_id") or "")
        self_ns = sum(e - s for s, e in tree.self_intervals(span_id))
        views.append(SpanView(
            span_id=span_id, parent_span_id=str(span.get("parent_span_id") or ""), name=str(span["name"]),
            phase=tree.phases[span_id], service=str(span.get("service") or ""),
            reported_phase="" if tree.phases[span_id] == phase_of(span) else phase_of(span),
            model=str(span.get("model") or ""), start_ns=int(span["start_ns"]), duration_ns=int(span["duration_ns"]),
            status=str(span.get("status") or "ok"), status_message=str(span.get("status_message") or ""),
            ttft_ns=None if span.get("ttft_ns") is None else int(span["ttft_ns"]),
            input_tokens=_count(span.get("input_tokens")), output_tokens=_count(span.get("output_tokens")),
            cost_usd=span.get("cost_usd"), attributes=dict(span.get("attributes") or {}),
            resource_attributes=dict(span.get("resource_attributes") or {}),
            events=[{"time_ns": int(t), "name": n, "attributes": dict(a)} for t, n, a in
                    zip(span.get("event_ns") or [], span.get("event_names") or [], span.get("event_attributes") or [])],
            genai_events=events_by_span.get(span_id, []),
            depth=depth, self_ns=self_ns, child_count=len(kids), orphan=span_id in orphans,
            extra_root=span_id in extra_roots, critical_ns=critical.get(span_id, 0),
            on_critical_path=span_id in on_path, skew_note=_skew_note(span, parent),
        ))
        stack.extend((kid, depth + 1) for kid in reversed(kids))
    return TraceDetail(project_id=project_id, trace_id=trace_id, summary=summary, spans=views,
                       critical_path=path, flags=trace_flags(summary), genai_events=trace_events)


@contextmanager
def _gc_paused():
    """Reading and building a large trace allocates hundreds of thousands of short-lived objects
    (10,000 spans: ~500k) that are all freed afterwards; the cyclic collector's full passes over
    them doubled the time (measured: 420 → 210 ms for 10,000 spans), so it waits until the trace
    is built. Only the caller that paused it resumes it, so overlapping requests never leave it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def trace_get(*, project_id: int, trace_id: str, with_genai_events: bool = False) -> TraceDetail | None:
    """The trace of this project, or None (unknown id, or another project's trace).
    ``with_genai_events``: also its GenAI events (one more query, run beside the spans query; the
    trace page and JSON show them, the comparison page does not)."""
    if not trace_id_valid(trace_id):
        return None
    prices = prices_for_project(project_id=project_id)
    events = (read_beside(trace_genai_events, project_id=project_id, trace_id=trace_id)
              if with_genai_events else None)
    with _gc_paused():
        rows = trace_spans(project_id=project_id, trace_id=trace_id)
        genai_events = events.result() if events is not None else []
        if not rows:
            return None
        return trace_detail_build(project_id=project_id, trace_id=trace_id, rows=rows, prices=prices,
                                  genai_events=genai_events)


CACHE_OUTCOMES = {0: None, 1: "miss", 2: "hit"}  # traces.cache / TraceSummary.cache (definitions.md "Cache")


def summary_json(summary: TraceSummary) -> dict:
    return {
        "start_ns": summary.start_ns, "e2e_ns": summary.e2e_ns, "has_root": summary.has_root,
        "root_name": summary.root_name, "service": summary.service, "model": summary.model,
        "status": summary.status, "error_spans": summary.error_spans, "error_message": summary.error_message,
        "ttft_ns": summary.ttft_ns,
        "tpot_ns": summary.tpot_ns, "input_tokens": summary.input_tokens, "output_tokens": summary.output_tokens,
        "cost_usd": summary.cost_usd, "cost_estimated": summary.cost_estimated, "span_count": summary.span_count,
        "phase_ns": {p: summary.phase_ns.get(p, 0) for p in PHASES},
        "cache": CACHE_OUTCOMES[summary.cache],  # a cache answered a span ("hit"), or was consulted and missed
    }


def trace_json(detail: TraceDetail, *, columnar: bool = False) -> dict:
    """The JSON of ``GET /api/v1/traces/<id>`` (and the trace page's data): times in integer ns.

    ``columnar``: spans as ``{"fields": [...], "rows": [[...], ...]}`` instead of one object per
    span, a third of the size (the page embeds it: a 10,000-span trace is ~2 MB instead of ~6 MB).
    """
    spans = ({"fields": list(SPAN_FIELDS), "rows": [s.as_row() for s in detail.spans]} if columnar
             else [s.as_json() for s in detail.spans])
    return {
        "trace_id": detail.trace_id,
        "project_id": detail.project_id,
        "summary": summary_json(detail.summary),
        "phases": detail.phases(),
        "flags": detail.flags,
        "critical_path": [{"span_id": s, "start_ns": lo, "end_ns": hi} for s, lo, hi in detail.critical_path],
        "spans": spans,
        "genai_events": detail.genai_events,
    }


# --- comparison -----------------------------------------------------------------------------------

COMPARE_FIGURES = ("e2e_ns", "ttft_ns", "input_tokens", "output_tokens", "cost_usd") + tuple(f"{p}_ns" for p in PHASES)


def _since(seconds: int) -> dict[str, int]:
    """The range parameters of "started in the last ``seconds``" (the upper bound: an hour ahead, for
    clocks a little ahead of this one)."""
    now = time.time_ns()
    return {"since_ns": now - seconds * NS, "until_ns": now + 3600 * NS}


# An endpoint's requests: its service and root span name, with a root.
_ENDPOINT = "service = {service:String} AND root_name = {root_name:String} AND has_root = 1"

# Exact medians (NULLs, i.e. a missing TTFT or cost, are skipped); the inner query reads the latest
# summary of each trace starting since then (by start: analytics.panel_selectors.latest_summaries_sql).
_ENDPOINT_P50_SQL = """
SELECT
    count() AS traces,
    countIf(ttft_ns IS NOT NULL) AS ttft_count,
    countIf(cost_usd IS NOT NULL) AS cost_count,
    """ + ",\n    ".join(f"quantileExact(0.5)({name}) AS p50_{name}" for name in COMPARE_FIGURES) + """
FROM (
""" + latest_summaries_sql("*", [("since_ns", "until_ns")], unit="Nano", where=_ENDPOINT) + """
)
"""


@dataclass
class Baseline:
    """The P50 of each figure over an endpoint's traces (each figure's own median: the phase
    medians need not add up to the E2E median)."""

    label: str
    traces: int
    figures: dict[str, float | None]


def trace_figures(summary: TraceSummary) -> dict[str, float | None]:
    figures = {"e2e_ns": summary.e2e_ns, "ttft_ns": summary.ttft_ns, "input_tokens": summary.input_tokens,
               "output_tokens": summary.output_tokens, "cost_usd": summary.cost_usd}
    figures.update({f"{p}_ns": summary.phase_ns.get(p, 0) for p in PHASES})
    return figures


def endpoint_p50(*, project_id: int, service: str, root_name: str, since_seconds: int = 24 * 3600) -> Baseline:
    """Exact medians over the endpoint's (same service and root span name) traces that started in
    the last ``since_seconds``, from the per-trace summaries."""
    row = get_store().query(
        _ENDPOINT_P50_SQL,
        {"project_id": project_id, "service": service, "root_name": root_name,
         **_since(since_seconds)},
        tag="dashboard.trace_detail.endpoint_p50",
    ).dicts()[0]
    count = int(row["traces"])
    figures: dict[str, float | None] = {}
    for name in COMPARE_FIGURES:
        value = row[f"p50_{name}"] if count else None
        if name == "ttft_ns" and not row["ttft_count"]:
            value = None
        if name == "cost_usd" and not row["cost_count"]:
            value = None
        figures[name] = None if value is None else float(value)
    hours = since_seconds / 3600
    return Baseline(label=f"P50 of {service} · {root_name} (last {hours:g} h, {count} traces)", traces=count, figures=figures)


# The newest first, read by start (the few granules at the window's end, not every trace since).
_ENDPOINT_RECENT_SQL = latest_summaries_sql(
    "trace_id, toUnixTimestamp64Nano(start_time) AS start_ns, e2e_ns, status", [("since_ns", "until_ns")],
    unit="Nano", where=_ENDPOINT + " AND trace_id != {trace_id:FixedString(32)}") + """
ORDER BY start_time DESC
LIMIT {limit:UInt32}
"""


@dataclass(frozen=True)
class EndpointTrace:
    trace_id: str
    start_ns: int
    e2e_ns: int
    status: str


def endpoint_recent_traces(*, project_id: int, trace_id: str, service: str, root_name: str,
                           since_seconds: int = 24 * 3600, limit: int = 10) -> list[EndpointTrace]:
    """Other recent traces of the same endpoint (service and root span name), newest first: the
    candidates the trace page offers to compare with."""
    rows = get_store().query(
        _ENDPOINT_RECENT_SQL,
        {"project_id": project_id, "trace_id": trace_id, "service": service, "root_name": root_name,
         **_since(since_seconds), "limit": limit},
        tag="dashboard.trace_detail.endpoint_recent_traces",
    ).dicts()
    return [EndpointTrace(trace_id=r["trace_id"], start_ns=int(r["start_ns"]), e2e_ns=int(r["e2e_ns"]), status=r["status"])
            for r in rows]


@dataclass
class CompareRow:
    figure: str
    a: float | None
    b: float | None

    @property
    def diff(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def diff_percent(self) -> float | None:
        if self.diff is None or not self.a:
            return None
        return 100.0 * self.diff / self.a


def compare_rows(a: dict[str, float | None], b: dict[str, float | None]) -> list[CompareRow]:
    """Per figure: A, B, B − A and (B − A) / A."""
    return [CompareRow(figure=name, a=a.get(name), b=b.get(name)) for name in COMPARE_FIGURES]
