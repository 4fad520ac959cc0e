"""Reads of the trace explorer, over the per-trace summaries (the ``traces`` table).

- ``trace_bounds``: where a trace's spans lie in time (the summary row is found by its primary
  key; a trace the summariser has not seen yet falls back to the spans' trace-id bloom filter),
  for a trace-id filter here; the trace page reads the same bounds inside its spans query.
- ``explorer_page``: one page of traces matching an ``ExplorerQuery`` (time range, service,
  model, status, dominant phase, duration bounds, minimum TTFT, one attribute ``key=value``,
  trace id), sorted by start, duration, TTFT or cost, with keyset pagination: the cursor holds
  the last row's sort value and trace id, so page N costs what page 1 costs and a trace that
  arrives meanwhile neither repeats nor hides a row.
- ``explorer_rows_for_ids``: the rows among given trace ids that match a query (live updates).

The summaries are a ReplacingMergeTree (a trace is re-summarised when late spans arrive), so
every read here takes the latest version. Pages and choices read ``traces_by_start`` (the same rows
ordered by start time, kept by a materialized view): see ``explorer_page``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from store import get_store

from analytics.trace_math import PHASES

NS = 1_000_000_000
MS = 1_000_000
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
# The trace-id filter also takes the start of an id (the explorer shows the first 12 characters):
# at least 8 hex characters, matched as a prefix among the project's traces of any time.
TRACE_ID_PREFIX = re.compile(r"^[0-9a-f]{8,32}$")
MIN_TRACE_ID_PREFIX = 8
STATUSES = ("ok", "recovered", "error")  # the request's (its root's) status: DOMAIN.md "Status"
SORTS = ("start", "duration", "ttft", "cost")
DIRECTIONS = ("asc", "desc")
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# The attribute filter looks at spans, whose start can lie a little before their trace's start
# (clock skew) and well after it (a long request): the spans' time window is the traces' one
# widened by these margins, then the traces' own start range applies exactly.
ATTRIBUTE_SKEW_NS = 5 * 60 * NS
ATTRIBUTE_TAIL_NS = 60 * 60 * NS
MAX_ATTRIBUTE_KEY = 256
MAX_ATTRIBUTE_VALUE = 1024

# Sort keys: one numeric expression per sort, with "unknown" (no TTFT, no cost) placed last in
# either direction, so keyset comparisons are plain tuple comparisons (value, trace_id).
_INT64_MAX = 2**63 - 1
_COST_UNKNOWN_ASC = 1e300  # finite: ClickHouse writes inf as null in JSON
_SORT_SQL = {
    "start": ("toUnixTimestamp64Nano(start_time)", "Int64"),
    "duration": ("toInt64(e2e_ns)", "Int64"),
    "ttft": ("ifNull(toInt64(ttft_ns), toInt64({null_key:Int64}))", "Int64"),
    "cost": ("ifNull(cost_usd, {null_key:Float64})", "Float64"),
}


def _null_key(sort: str, direction: str):
    if sort == "ttft":
        return _INT64_MAX if direction == "asc" else -1
    if sort == "cost":
        return _COST_UNKNOWN_ASC if direction == "asc" else -1.0
    return None


class QueryError(ValueError):
    """A filter value that cannot be used; ``field`` names the URL parameter at fault."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: after the row with this sort value and trace id or, ``before``,
    the page that ends just before it (the Previous link: the same keyset read backwards)."""

    sort: str
    direction: str
    key: int | float
    trace_id: str
    before: bool = False

    def encode(self) -> str:
        key = self.key if not isinstance(self.key, float) else repr(self.key)
        fields = [self.sort, self.direction, key, self.trace_id] + ([1] if self.before else [])
        raw = json.dumps(fields, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str, *, sort: str, direction: str) -> "Cursor":
        """Parse a cursor from the URL; it must belong to the same sort (a cursor of another
        ordering would skip or repeat rows)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            fields = json.loads(raw)
            if not isinstance(fields, list) or len(fields) not in (4, 5) or fields[4:] not in ([], [1]):
                raise ValueError("not a cursor")
            c_sort, c_dir, key, trace_id = fields[:4]
            before = len(fields) == 5
        except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
            raise QueryError("cursor", "is not a cursor this page wrote; start from the first page") from None
        if c_sort != sort or c_dir != direction:
            raise QueryError("cursor", "belongs to another sort order; start from the first page")
        if not isinstance(trace_id, str) or not TRACE_ID.match(trace_id):
            raise QueryError("cursor", "is not a cursor this page wrote; start from the first page")
        if sort == "cost":
            try:
                key = float(key)
            except (TypeError, ValueError):
                raise QueryError("cursor", "is not a cursor this page wrote; start from the first page") from None
            if not math.isfinite(key):
                raise QueryError("cursor", "is not a cursor this page wrote; start from the first page")
        elif not isinstance(key, int) or isinstance(key, bool) or not -1 <= key <= _INT64_MAX:
            raise QueryError("cursor", "is not a cursor this page wrote; start from the first page")
        return cls(sort=sort, direction=direction, key=key, trace_id=trace_id, before=before)


@dataclass(frozen=True)
class ExplorerQuery:
    """What the explorer shows. Times are unix nanoseconds; the range is [start_ns, end_ns)."""

    start_ns: int
    end_ns: int
    service: str = ""  # the root span's service
    model: str = ""  # the trace's model (its first model call's)
    status: str = ""  # "ok" | "recovered" | "error"
    phase: str = ""  # the trace's dominant phase (the one with the most exclusive time)
    min_duration_ns: int | None = None
    max_duration_ns: int | None = None
    min_ttft_ns: int | None = None
    attribute: tuple[str, str] | None = None  # a span attribute key and its exact value
    trace_id: str = ""  # one trace (or, shorter than 32, the traces whose id starts so), whatever the time range
    sort: str = "start"
    direction: str = "desc"
    cursor: Cursor | None = None
    limit: int = PAGE_SIZE

    def __post_init__(self):
        if self.sort not in SORTS:
            raise QueryError("sort", f"must be one of {', '.join(SORTS)}")
        if self.direction not in DIRECTIONS:
            raise QueryError("dir", "must be asc or desc")
        if self.status and self.status not in STATUSES:
            raise QueryError("status", "must be ok, recovered or error")
        if self.phase and self.phase not in PHASES:
            raise QueryError("phase", f"must be one of {', '.join(PHASES)}")
        if self.trace_id and not TRACE_ID_PREFIX.match(self.trace_id):
            raise QueryError("trace_id", f"must be a trace id or its first {MIN_TRACE_ID_PREFIX} or more characters"
                                         " (lowercase hex)")
        if self.end_ns <= self.start_ns:
            raise QueryError("to", "must be after the start of the range")
        if not 1 <= self.limit <= MAX_PAGE_SIZE:
            raise QueryError("limit", f"must be between 1 and {MAX_PAGE_SIZE}")


@dataclass(frozen=True)
class ExplorerRow:
    trace_id: str
    start: datetime
    start_ns: int
    e2e_ns: int
    has_root: bool
    root_name: str
    service: str
    model: str
    status: str
    error_message: str
    ttft_ns: int | None
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    cost_estimated: bool
    span_count: int
    phase_ns: dict[str, int] = field(default_factory=dict)
    sort_key: int | float = 0
    version: int = 0

    @property
    def duration_ms(self) -> float:
        return self.e2e_ns / MS

    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_ns is None else self.ttft_ns / MS

    @property
    def dominant_phase(self) -> str:
        return max(PHASES, key=lambda p: (self.phase_ns.get(p, 0), -PHASES.index(p)))

    def phase_bar(self) -> list[dict]:
        """The mini bar: each phase's share of E2E (percent of the bar's width), in phase order."""
        total = self.e2e_ns or sum(self.phase_ns.values()) or 1
        return [
            {"phase": p, "ns": self.phase_ns.get(p, 0), "ms": self.phase_ns.get(p, 0) / MS,
             "percent": round(100.0 * self.phase_ns.get(p, 0) / total, 2)}
            for p in PHASES if self.phase_ns.get(p, 0) > 0
        ]

    def as_json(self) -> dict:
        return {
            "trace_id": self.trace_id, "start_ns": self.start_ns, "start": self.start.isoformat(),
            "duration_ms": self.duration_ms, "has_root": self.has_root, "root_name": self.root_name,
            "service": self.service, "model": self.model, "status": self.status,
            "error_message": self.error_message, "ttft_ms": self.ttft_ms,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd, "cost_estimated": self.cost_estimated, "span_count": self.span_count,
            "phases": self.phase_bar(),
        }


@dataclass(frozen=True)
class ExplorerPage:
    rows: list[ExplorerRow]
    next_cursor: Cursor | None  # None: this is the last page
    prev_cursor: Cursor | None = None  # None: this is the first page


_ROW_COLUMNS = """trace_id, toUnixTimestamp64Nano(start_time) AS start_ns, e2e_ns, has_root, root_name, service,
    model, status, error_message, ttft_ns, input_tokens, output_tokens, cost_usd, cost_estimated, span_count,
    network_ns, preprocess_ns, inference_ns, postprocess_ns, other_ns"""

# The dominant phase, with ties going to the earlier phase of PHASES (as ExplorerRow does).
_DOMINANT_PHASE_SQL = (
    "arrayElement(['network','preprocess','inference','postprocess','other'], "
    "indexOf([network_ns, preprocess_ns, inference_ns, postprocess_ns, other_ns], "
    "greatest(network_ns, preprocess_ns, inference_ns, postprocess_ns, other_ns)))"
)


def _row(r: dict) -> ExplorerRow:
    start_ns = int(r["start_ns"])
    return ExplorerRow(
        trace_id=r["trace_id"], start=datetime.fromtimestamp(start_ns / NS, tz=timezone.utc), start_ns=start_ns,
        e2e_ns=int(r["e2e_ns"]), has_root=bool(r["has_root"]), root_name=r["root_name"], service=r["service"],
        model=r["model"], status=r["status"], error_message=r["error_message"],
        ttft_ns=None if r["ttft_ns"] is None else int(r["ttft_ns"]),
        input_tokens=int(r["input_tokens"]), output_tokens=int(r["output_tokens"]),
        cost_usd=None if r["cost_usd"] is None else float(r["cost_usd"]), cost_estimated=bool(r["cost_estimated"]),
        span_count=int(r["span_count"]), phase_ns={p: int(r[f"{p}_ns"]) for p in PHASES},
        sort_key=r.get("sort_key", 0), version=int(r.get("version") or 0),
    )


def _conditions(q: ExplorerQuery, *, project_id: int, trace_start_ns: int | None = None) -> tuple[list[str], dict]:
    """WHERE conditions and their parameters for every filter of ``q`` (not the cursor).
    ``trace_start_ns``: the start of ``q.trace_id``'s summary, which ``traces_by_start`` needs to
    find it by its primary key."""
    where = ["project_id = {project_id:UInt64}"]
    params: dict = {"project_id": project_id}
    if q.trace_id and len(q.trace_id) < 32:
        # A short id: every trace of the project whose id starts so, any time (``traces`` is
        # ordered by trace id, so the prefix reads a narrow key range).
        where.append("trace_id IN (SELECT trace_id FROM traces WHERE project_id = {project_id:UInt64}"
                     " AND startsWith(trace_id, {trace_prefix:String}))")
        params["trace_prefix"] = q.trace_id
    elif q.trace_id:
        where.append("trace_id = {trace_id:FixedString(32)}")
        params["trace_id"] = q.trace_id
        if trace_start_ns is not None:
            where.append("start_time = fromUnixTimestamp64Nano({trace_start_ns:Int64})")
            params["trace_start_ns"] = trace_start_ns
    else:
        where.append("start_time >= fromUnixTimestamp64Nano({start_ns:Int64})")
        where.append("start_time < fromUnixTimestamp64Nano({end_ns:Int64})")
        params.update(start_ns=q.start_ns, end_ns=q.end_ns)
    # Service and model mean what they mean on every page (the shared filter bar, the panels and
    # rollups): the root's service and the trace's model (its first model call's).
    if q.service:
        where.append("service = {service:String}")
        params["service"] = q.service
    if q.model:
        where.append("model = {model:String}")
        params["model"] = q.model
    if q.status:
        where.append("status = {status:String}")
        params["status"] = q.status
    if q.phase:
        where.append(f"{_DOMINANT_PHASE_SQL} = {{phase:String}}")
        params["phase"] = q.phase
    if q.min_duration_ns is not None:
        where.append("e2e_ns >= {min_duration_ns:UInt64}")
        params["min_duration_ns"] = q.min_duration_ns
    if q.max_duration_ns is not None:
        where.append("e2e_ns <= {max_duration_ns:UInt64}")
        params["max_duration_ns"] = q.max_duration_ns
    if q.min_ttft_ns is not None:
        where.append("ttft_ns >= {min_ttft_ns:UInt64}")
        params["min_ttft_ns"] = q.min_ttft_ns
    if q.attribute is not None:
        # Resolved over spans to trace ids; the spans' time window narrows the scan to the range's
        # partitions, and the bloom filters on the attribute keys and values (migration 0006)
        # skip the granules that cannot hold the pair.
        where.append(
            "trace_id IN (SELECT trace_id FROM spans WHERE project_id = {project_id:UInt64}"
            " AND start_time >= fromUnixTimestamp64Nano({attr_lo:Int64})"
            " AND start_time < fromUnixTimestamp64Nano({attr_hi:Int64})"
            " AND attributes[{attr_key:String}] = {attr_value:String})"
        )
        params.update(attr_key=q.attribute[0], attr_value=q.attribute[1])
        if q.trace_id:
            # One trace: its spans' own bounds (or all time when it was never summarised).
            bounds = trace_bounds(project_id=project_id, trace_id=q.trace_id)
            lo, hi = bounds if bounds else (0, _INT64_MAX)
            params.update(attr_lo=lo, attr_hi=min(_INT64_MAX, hi + 1))
        else:
            params.update(attr_lo=q.start_ns - ATTRIBUTE_SKEW_NS, attr_hi=q.end_ns + ATTRIBUTE_TAIL_NS)
    return where, params


def explorer_page(*, project_id: int, query: ExplorerQuery) -> ExplorerPage:
    """One page of the project's traces matching ``query``, in its sort order, after its cursor
    (or, for a ``before`` cursor, the page just before it: read backwards, then turned round).

    Read from ``traces_by_start`` (the summaries ordered by start: a time window reads only its
    own days and granules). A row there whose trace has a newer summary (not merged away yet, or
    left under an old start when the root arrived late) is stale: each candidate's version is
    checked against the trace's latest in ``traces`` (primary-key lookups), stale rows and repeats
    are dropped and, rarely, more candidates are read.
    """
    trace_start_ns = None
    if len(query.trace_id) == 32:
        summary = trace_summary(project_id=project_id, trace_id=query.trace_id)
        if summary is None:
            return ExplorerPage(rows=[], next_cursor=None)
        trace_start_ns = summary.start_ns
    backward = query.cursor is not None and query.cursor.before
    kept: list[ExplorerRow] = []
    seen: set[str] = set()
    cursor = query.cursor
    while len(kept) <= query.limit:
        wanted = query.limit + 1 - len(kept)  # one more tells whether a next page exists
        # A little more than needed: right after a burst of re-summarised traces, some candidates
        # are older versions not merged away yet.
        fetch = wanted + wanted // 2 + 4
        batch = _candidates(project_id=project_id, query=query, cursor=cursor, limit=fetch,
                            trace_start_ns=trace_start_ns, backward=backward)
        latest = _latest_versions(project_id=project_id, trace_ids=[r.trace_id for r in batch])
        for row in batch:
            if latest.get(row.trace_id) == row.version and row.trace_id not in seen:
                seen.add(row.trace_id)
                kept.append(row)
        if len(batch) < fetch:
            break
        cursor = _cursor_after(query, batch[-1])
    more = len(kept) > query.limit
    kept = kept[: query.limit]
    if backward:
        kept.reverse()
        # Read backwards from the cursor: the page after this one exists (the cursor's own row).
        return ExplorerPage(rows=kept, next_cursor=_cursor_after(query, kept[-1]) if kept else None,
                            prev_cursor=_cursor_after(query, kept[0], before=True) if more and kept else None)
    return ExplorerPage(rows=kept, next_cursor=_cursor_after(query, kept[-1]) if more else None,
                        prev_cursor=_cursor_after(query, kept[0], before=True) if query.cursor and kept else None)


COUNT_CAP = 10_000  # the explorer counts matching traces exactly up to this many, then says "more than"


@dataclass(frozen=True)
class ExplorerCount:
    traces: int  # matching traces counted (exact when ``more`` is False)
    more: bool = False  # True: the count stopped reading (2 × ``cap`` rows); ``traces`` is a lower bound
    cap: int = COUNT_CAP

    def __str__(self) -> str:
        if self.more:
            return f"more than {self.cap:,} traces" if self.traces > self.cap else f"at least {self.traces:,} traces"
        return f"{self.traces:,} trace{'' if self.traces == 1 else 's'}"


def explorer_count(*, project_id: int, query: ExplorerQuery, cap: int = COUNT_CAP) -> ExplorerCount:
    """How many traces match ``query`` (its cursor aside): each trace once, by its latest summary,
    as ``explorer_page`` lists them. Exact up to ``cap``; beyond, a lower bound (``more``): the
    count reads at most twice ``cap`` rows of the window, newest first, so a month of traces
    costs what a few thousand do."""
    if len(query.trace_id) == 32:
        summary = trace_summary(project_id=project_id, trace_id=query.trace_id)
        if summary is None:
            return ExplorerCount(0, cap=cap)
        where, params = _conditions(query, project_id=project_id, trace_start_ns=summary.start_ns)
    else:
        where, params = _conditions(query, project_id=project_id)
    # The table's own order and a limit: deterministic (the subquery is read more than once) and
    # read in order, stopping at the limit.
    matching = (f"SELECT trace_id, version FROM traces_by_start WHERE {' AND '.join(where)}"
                " ORDER BY start_time DESC, trace_id DESC LIMIT {count_rows:UInt32}")
    params["count_rows"] = 2 * cap + 1
    sql = (
        f"SELECT (SELECT count() FROM ({matching})) AS rows_read, uniqExact(trace_id) AS n FROM ({matching}) AS m\n"
        "WHERE (trace_id, version) IN (SELECT trace_id, max(version) FROM traces"
        " WHERE project_id = {project_id:UInt64}"
        f" AND trace_id IN (SELECT trace_id FROM ({matching})) GROUP BY trace_id)"
    )
    result = get_store().query(sql, params, tag="dashboard.explorer.explorer_count")
    rows_read, n = (int(v) for v in result.rows[0]) if result.rows else (0, 0)
    return ExplorerCount(n, rows_read > 2 * cap, cap)  # the limit reached: more rows than were read


def _cursor_after(query: ExplorerQuery, row: ExplorerRow, *, before: bool = False) -> Cursor:
    key = float(row.sort_key) if query.sort == "cost" else int(row.sort_key)
    return Cursor(sort=query.sort, direction=query.direction, key=key, trace_id=row.trace_id, before=before)


def _candidates(*, project_id: int, query: ExplorerQuery, cursor: Cursor | None, limit: int,
                trace_start_ns: int | None, backward: bool = False) -> list[ExplorerRow]:
    """Candidates after ``cursor`` in the query's order or, ``backward``, before it in the reverse
    order (the sort keys, unknown values included, stay those of the query's direction)."""
    where, params = _conditions(query, project_id=project_id, trace_start_ns=trace_start_ns)
    sort_sql, sort_type = _SORT_SQL[query.sort]
    null_key = _null_key(query.sort, query.direction)
    if null_key is not None:
        params["null_key"] = null_key
    op, order = (">", "ASC") if (query.direction == "asc") != backward else ("<", "DESC")
    # By start: the table's own order (start_time, trace_id), so ClickHouse reads in order from the
    # window's end and stops after the page; other sorts read the window and sort it.
    order_by = "start_time" if query.sort == "start" else "sort_key"
    if cursor is not None:
        key = "fromUnixTimestamp64Nano({cursor_key:Int64})" if query.sort == "start" else f"{{cursor_key:{sort_type}}}"
        where.append(f"({order_by}, trace_id) {op} ({key}, {{cursor_trace_id:FixedString(32)}})")
        params.update(cursor_key=cursor.key, cursor_trace_id=cursor.trace_id)
    params["limit"] = limit
    sql = (
        # No FINAL: the version check in explorer_page drops every row but a trace's latest, which
        # FINAL would do at a cost that grows with the days in the window (one merge per day).
        f"SELECT {_ROW_COLUMNS}, version, {sort_sql} AS sort_key FROM traces_by_start\n"
        f"WHERE {' AND '.join(where)}\n"
        f"ORDER BY {order_by} {order}, trace_id {order}\n"
        "LIMIT {limit:UInt32}"
    )
    result = get_store().query(sql, params, tag="dashboard.explorer.explorer_page")
    return [_row(r) for r in result.dicts()]


def _latest_versions(*, project_id: int, trace_ids: list[str]) -> dict[str, int]:
    if not trace_ids:
        return {}
    result = get_store().query(
        "SELECT trace_id, max(version) AS version FROM traces WHERE project_id = {project_id:UInt64}"
        " AND trace_id IN (SELECT arrayJoin(splitByChar(',', {trace_ids:String}))) GROUP BY trace_id",
        {"project_id": project_id, "trace_ids": ",".join(trace_ids)}, tag="dashboard.explorer.latest_versions")
    return {trace_id: int(version) for trace_id, version in result.rows}


def explorer_rows_for_ids(*, project_id: int, query: ExplorerQuery, trace_ids: list[str]) -> list[ExplorerRow]:
    """The rows among ``trace_ids`` that match ``query``'s filters (its cursor and limit aside),
    in its sort order: what a live page adds when the summariser announces new traces."""
    ids = sorted({t for t in trace_ids if TRACE_ID.match(t)})
    if not ids:
        return []
    where, params = _conditions(replace(query, cursor=None), project_id=project_id)
    # One text parameter: array parameters are not passed alike by both backends.
    where.append("trace_id IN (SELECT arrayJoin(splitByChar(',', {trace_ids:String})))")
    params["trace_ids"] = ",".join(ids)
    sort_sql, _ = _SORT_SQL[query.sort]
    null_key = _null_key(query.sort, query.direction)
    if null_key is not None:
        params["null_key"] = null_key
    order = "ASC" if query.direction == "asc" else "DESC"
    sql = (
        f"SELECT {_ROW_COLUMNS}, {sort_sql} AS sort_key FROM traces FINAL\n"
        f"WHERE {' AND '.join(where)}\n"
        f"ORDER BY sort_key {order}, trace_id {order}"
    )
    result = get_store().query(sql, params, tag="dashboard.explorer.explorer_rows_for_ids")
    return [_row(r) for r in result.dicts()]


def trace_summary(*, project_id: int, trace_id: str) -> ExplorerRow | None:
    """The latest summary of one trace, or None when the summariser has not seen it."""
    if not TRACE_ID.match(trace_id):
        return None
    result = get_store().query(
        f"SELECT {_ROW_COLUMNS} FROM traces WHERE project_id = {{project_id:UInt64}}"
        " AND trace_id = {trace_id:FixedString(32)} ORDER BY version DESC LIMIT 1",
        {"project_id": project_id, "trace_id": trace_id},
        tag="dashboard.explorer.trace_summary",
    )
    rows = result.dicts()
    return _row(rows[0]) if rows else None


def trace_bounds(*, project_id: int, trace_id: str) -> tuple[int, int] | None:
    """(earliest span start, latest span end) of a trace in unix ns, or None if it has no spans.

    From the trace's summary (a primary-key lookup) when the summariser has seen it; otherwise
    from the spans themselves, found through their trace-id bloom filter. A caller that reads the
    spans within these bounds (``start_time BETWEEN``) touches only their partitions and granules.
    Spans that arrive after the latest summary may lie outside; the next summary widens the bounds.
    """
    if not TRACE_ID.match(trace_id):
        return None
    params = {"project_id": project_id, "trace_id": trace_id}
    store = get_store()
    result = store.query(
        "SELECT toUnixTimestamp64Nano(spans_start) AS lo, toUnixTimestamp64Nano(spans_end) AS hi FROM traces"
        " WHERE project_id = {project_id:UInt64} AND trace_id = {trace_id:FixedString(32)}"
        " ORDER BY version DESC LIMIT 1",
        params, tag="dashboard.explorer.trace_bounds",
    )
    if result.rows:
        lo, hi = result.rows[0]
        return int(lo), int(hi)
    result = store.query(
        "SELECT count() AS n, min(toUnixTimestamp64Nano(start_time)) AS lo,"
        " max(toUnixTimestamp64Nano(start_time) + toInt64(duration_ns)) AS hi FROM spans"
        " WHERE project_id = {project_id:UInt64} AND trace_id = {trace_id:FixedString(32)}",
        params, tag="dashboard.explorer.trace_bounds_from_spans",
    )
    n, lo, hi = result.rows[0]
    return (int(lo), int(hi)) if n else None


def explorer_facets(*, project_id: int, start_ns: int, end_ns: int, limit: int = 200) -> dict[str, list[str]]:
    """The services and models seen in the range, for the filter bar's choices."""
    result = get_store().query(
        "SELECT groupUniqArray({limit:UInt32})(service) AS services,"
        " groupUniqArray({limit:UInt32})(model) AS models FROM traces_by_start"
        " WHERE project_id = {project_id:UInt64}"
        " AND start_time >= fromUnixTimestamp64Nano({start_ns:Int64})"
        " AND start_time < fromUnixTimestamp64Nano({end_ns:Int64})",
        {"project_id": project_id, "start_ns": start_ns, "end_ns": end_ns, "limit": limit},
        tag="dashboard.explorer.explorer_facets",
    )
    row = result.dicts()[0] if result.rows else {"services": [], "models": []}
    return {"services": sorted(s for s in row["services"] if s), "models": sorted(m for m in row["models"] if m)}
