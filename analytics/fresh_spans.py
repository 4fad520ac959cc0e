"""The spans this process has just stored, handed to the summariser without reading them back.

A summariser run finds the traces that received spans since its watermark (``spans.ingested_at``),
bounds the run (``TRACEDASH_SUMMARIZE_MAX_SPANS``) and reads every stored copy of those traces'
spans back from ``spans``: three reads of what the ingest writer had in memory a second before,
~40 % of a run's CPU (docs/BENCHMARKS.md). On the embedded store this process makes every insert
into ``spans`` (chdb opens a data directory in one process only), and each insert stamps
``ingested_at`` itself with a value it knows (``EmbeddedBackend.insert``). So this module keeps,
per insert, the columns the summaries read (the Arrow table the rows were stored from: no copy)
and its stamp, and answers a run's window of arrivals from memory:

- **which traces arrived** (``Window.touched``: what the ``touched`` read returned) and where a
  backlog's run stops (what the ``bound`` read computed), from the inserts' stamps and row counts;
- **the spans of a new trace** (one without a summary: every stored copy of its spans arrived
  within the window, since a span that arrived before the watermark was summarised then):
  ``Window.spans`` gives them with the columns ``summary_arrays.spans_sql`` reads, the digest's
  hashes included (ClickHouse's ``cityHash64``, computed here: ``city_hash64_16``);
- **the earlier spans of a trace that grows**: spans arrive as they end (SDKs and OpenTelemetry
  exporters send them so), the children before their root, so a trace is summarised first without
  its root and again when the root comes. The summariser names the traces it left without a root
  (``consumed``'s ``keep``), and their spans are kept for ``HISTORY_MS`` after their window is
  summarised (copied out of the insert's table: the rest of the insert is let go). When such a
  trace grows, ``Window.grown`` checks that the copies held are exactly those its latest summary was
  computed from (their digest, ``spans_digest``, is equal) before the summary is computed from them
  and the window's; any other trace that grows is read from ``spans``.

Only what is certain is answered. The window is served when every insert with a stamp in it was
recorded (every insert of the process goes through its one store, ``store.get_store()``, whose
listener this is): the buffer covers the stamps from its start (``since``) on, per project; an insert that
raised (its rows may be stored all the same), a statement that writes ``spans`` (``ALTER``,
``DELETE``, ``TRUNCATE``, ``INSERT … SELECT``; none is served while one runs) or a listener that
failed make it start over from the clock, and a run whose watermark lies before that reads the
store, as every run on a ClickHouse server does. The summariser tells which arrivals it has
summarised (``consumed``); at most ``MAX_ROWS`` spans are kept, none longer than ``MAX_AGE_MS``
(the oldest go first, and their projects read the store until they are past them).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from clickhouse_cityhash.cityhash import CityHash64

from store import writes_table

log = logging.getLogger(__name__)

TABLE = "spans"
MAX_ROWS = 400_000  # spans kept at most (8 runs of TRACEDASH_SUMMARIZE_MAX_SPANS's default; ~100 MB at most)
MAX_AGE_MS = 60_000  # an insert not summarised this long after its stamp is let go (a project no run takes)
HISTORY_MS = 60_000  # a rootless trace's spans are kept this long after their arrival, for when it grows
# ... and at most this much of them (the oldest go first): ~240 bytes a span, ~45 s of spans sent as
# they end at 12,500 spans/s (an LLM request's trace lasts 10-30 s; one kept for less is read back).
MAX_HISTORY_BYTES = 128 * 1024 * 1024
# The columns of ``spans`` the summaries read, as the insert's Arrow table has them.
KEPT = ("project_id", "trace_id", "span_id", "parent_span_id", "name", "phase", "phase_fallback", "cache", "service",
        "model", "start_time", "duration_ns", "status", "status_message", "ttft_ns", "input_tokens", "output_tokens",
        "cost_usd")
LOADTEST_KEY = "loadtest.run_id"  # spans.loadtest_run_id's DEFAULT: attributes['loadtest.run_id']
SPAN_ID_BYTES = 16  # spans.span_id is a FixedString(16): a shorter id is hashed NUL-padded, as stored


_WRITES_SPANS = writes_table(TABLE)

# --- ClickHouse's cityHash64 (CityHash v1.0.2), vectorised for what the digest hashes ------------------
_K_MUL = np.uint64(0x9DDFEA08EB382D69)


def _hash128_to_64(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        a = (low ^ high) * _K_MUL
        a ^= a >> np.uint64(47)
        b = (high ^ a) * _K_MUL
        b ^= b >> np.uint64(47)
        return b * _K_MUL


def city_hash64_16(data: np.ndarray) -> np.ndarray:
    """``cityHash64`` of each row of ``data`` (n, 16) bytes: a ``FixedString(16)``'s (CityHash
    v1.0.2's HashLen0to16 for 16 bytes)."""
    words = np.ascontiguousarray(data).view("<u8").reshape(-1, 2)
    a, b = words[:, 0].astype(np.uint64), words[:, 1].astype(np.uint64)
    with np.errstate(over="ignore"):
        moved = b + np.uint64(16)
    rotated = (moved >> np.uint64(16)) | (moved << np.uint64(48))
    return _hash128_to_64(a, rotated) ^ b


def city_hash64_ms(stamp_ms: int) -> int:
    """``cityHash64`` of a ``DateTime64(3)`` value (its 8 bytes: unix ms, little-endian)."""
    return CityHash64(struct.pack("<q", int(stamp_ms)))


def combine(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``cityHash64(x, y)`` from the hashes of ``x`` and ``y`` (ClickHouse combines the hashes of its
    arguments with CityHash's Hash128to64)."""
    return _hash128_to_64(first, second)


def _fixed_bytes(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """A column of ids as (n, width) bytes, NUL-padded as ``FixedString(width)`` stores them."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.binary_length(array)
    if len(array) and array.null_count == 0 and pc.min(lengths).as_py() == width == pc.max(lengths).as_py():
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32 if array.type == pa.string() else np.int64)
        start = int(offsets[array.offset])
        data = np.frombuffer(array.buffers()[2], dtype=np.uint8)[start:start + width * len(array)]
        return data.reshape(-1, width)
    joined = b"".join((v or "").encode()[:width].ljust(width, b"\0") for v in array.to_pylist())
    return np.frombuffer(joined, dtype=np.uint8).reshape(-1, width)


@dataclass
class _Insert:
    stamp_ms: int
    table: pa.Table  # KEPT columns and ``loadtest``
    counts: dict[int, int]  # rows per project not yet summarised
    projects: int = 1  # projects it holds rows of


@dataclass
class _Kept:
    """The spans of the traces a run left without a root, from the inserts it summarised (a copy;
    ``stamp_ms``: the newest of those inserts' stamps)."""

    stamp_ms: int
    project_id: int
    table: pa.Table  # KEPT columns and ``loadtest``, ``ingested_ms``, ``stamp_hash``


def _stamped(table: pa.Table, stamp_ms: int) -> pa.Table:
    n = table.num_rows
    return (table.append_column("ingested_ms", pa.array(np.full(n, stamp_ms, dtype=np.int64)))
            .append_column("stamp_hash", pa.array(np.full(n, city_hash64_ms(stamp_ms), dtype=np.uint64))))


@dataclass
class Window:
    """A project's arrivals in [since_ms, until_ms), from memory."""

    project_id: int
    until_ms: int
    table: pa.Table  # the KEPT columns and ``loadtest``, ``ingested_ms``, ``stamp_hash``
    earlier: pa.Table | None = None  # the kept spans of rootless traces that arrived before (``FreshSpans.kept``)
    _grown: pa.Table | None = None  # those of the traces ``grown`` found whole
    _traces: int = -1  # the window's traces (``touched``)
    stats: dict | None = None  # the memory's counters: ``grown`` (whole in memory) and ``grown_read``

    @property
    def spans(self) -> int:
        return self.table.num_rows

    def touched(self) -> list[dict]:
        """The traces that received spans, as the summariser's ``touched`` read gives them:
        ``trace_id``, ``first_ns`` and ``last_ns`` (the start range of their new spans),
        ``spans``; by first start, then id."""
        if not self.table.num_rows:
            return []
        starts = pa.table({"trace_id": self.table.column("trace_id"),
                           "st": pc.cast(self.table.column("start_time"), pa.int64())})
        grouped = starts.group_by("trace_id").aggregate([("st", "min"), ("st", "max"), ("st", "count")])
        grouped = grouped.sort_by([("st_min", "ascending"), ("trace_id", "ascending")])
        self._traces = grouped.num_rows
        return [{"trace_id": t, "first_ns": lo, "last_ns": hi, "spans": n} for t, lo, hi, n in zip(
            grouped.column("trace_id").to_pylist(), grouped.column("st_min").to_pylist(),
            grouped.column("st_max").to_pylist(), grouped.column("st_count").to_pylist())]

    def grown(self, digests: dict[str, int], prices_json: str) -> list[str]:
        """Of these traces that grow ({trace id: its latest summary's ``spans_digest``}), those whose
        earlier spans are all held: the copies kept from before the window add up to that digest,
        so they are exactly the copies the summary was computed from (as ClickHouse would find
        them in ``spans``: every copy stored before the window). ``spans_of`` then gives their
        spans from memory too."""
        whole = self._whole(digests, prices_json)
        if self.stats is not None:
            self.stats["grown"] += len(whole)
            self.stats["grown_read"] += len(digests) - len(whole)
        return whole

    def _whole(self, digests: dict[str, int], prices_json: str) -> list[str]:
        self._grown = None
        if self.earlier is None or not self.earlier.num_rows or not digests:
            return []
        ids = list(digests)
        at = pc.index_in(self.earlier.column("trace_id"), value_set=pa.array(ids, pa.string()))
        held = pc.is_valid(at)
        rows = self.earlier.filter(held)
        if not rows.num_rows:
            return []
        codes = at.filter(held).to_numpy().astype(np.int64)
        sums = np.zeros(len(ids), dtype=np.uint64)
        np.add.at(sums, codes, _copy_hashes(rows))
        with np.errstate(over="ignore"):
            sums += np.uint64(CityHash64(prices_json.encode()))
        equal = (sums == np.array([int(digests[t]) for t in ids], dtype=np.uint64)) & (np.bincount(codes, minlength=len(ids)) > 0)
        if not equal.any():
            return []
        self._grown = rows.filter(pa.array(equal[codes]))
        return [ids[i] for i in np.flatnonzero(equal).tolist()]

    def spans_of(self, trace_ids: list[str], prices_json: str) -> pa.Table:
        """Every stored copy of these traces' spans with the columns (and values)
        ``summary_arrays.spans_sql`` reads from ``spans``: each a trace of the window that is new, or
        one the last ``grown`` found whole (``trace_ids`` holds all of those)."""
        rows = self.table
        if len(trace_ids) != self._traces:  # not every trace of the window
            rows = rows.filter(pc.is_in(rows.column("trace_id"), value_set=pa.array(trace_ids, pa.string())))
        if self._grown is not None and self._grown.num_rows:
            rows = (pa.concat_tables([self._grown.select(rows.column_names), rows], promote_options="permissive")
                    if rows.num_rows else self._grown)
        sid = rows.column("span_id")
        digest = _copy_hashes(rows)

        def filled(name: str, value, arrow_type) -> pa.Array:
            return pc.fill_null(rows.column(name), value).cast(arrow_type)

        def present(name: str) -> pa.Array:
            return pc.is_valid(rows.column(name)).cast(pa.uint8())

        n = rows.num_rows
        return pa.table({
            "trace_id": rows.column("trace_id"), "sid": sid, "parent": rows.column("parent_span_id"),
            "name": rows.column("name"), "raw_phase": rows.column("phase"), "service": rows.column("service"),
            "model": rows.column("model"), "st": pc.cast(rows.column("start_time"), pa.int64()),
            "dur": rows.column("duration_ns").cast(pa.int64()),
            "error": pc.equal(rows.column("status"), "error").cast(pa.uint8()),
            "status_message": rows.column("status_message"),
            "has_ttft": present("ttft_ns"), "ttft": filled("ttft_ns", 0, pa.int64()),
            "input_tokens": filled("input_tokens", 0, pa.uint64()), "output_tokens": filled("output_tokens", 0, pa.uint64()),
            "has_cost": present("cost_usd"), "cost": filled("cost_usd", 0.0, pa.float64()),
            "loadtest": rows.column("loadtest"), "fallback": rows.column("phase_fallback").cast(pa.uint8()),
            "cache_state": rows.column("cache").cast(pa.uint8()), "h": pa.array(digest, pa.uint64()),
            "ingested": pc.multiply(rows.column("ingested_ms"), 1_000_000),
            "prices_hash": pa.array(np.full(n, CityHash64(prices_json.encode()), dtype=np.uint64), pa.uint64()),
        })


def _copy_hashes(rows: pa.Table) -> np.ndarray:
    """Each stored copy's part of its trace's digest: ``cityHash64(span_id, ingested_at)``."""
    return combine(city_hash64_16(_fixed_bytes(rows.column("span_id"), SPAN_ID_BYTES)),
                   rows.column("stamp_hash").to_numpy().astype(np.uint64))


class FreshSpans:
    """The recent inserts into ``spans`` of one embedded store (see the module's docstring): the
    store's write listener and the summariser's source. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inserts: list[_Insert] = []
        self._rows = 0
        self._since_ms = _next_ms()  # every insert stamped from here on is recorded (until a reset)
        self._floor: dict[int, int] = {}  # per project: stamps below this were let go unsummarised
        self._quiet: dict[int, int] = {}  # per project: from here on, what the memory missed held none of its spans
        self._writing = 0  # statements that write ``spans`` running now
        self._kept: list[_Kept] = []  # rootless traces' spans from summarised inserts, oldest first
        self.stats = {"windows": 0, "store": 0, "resets": 0, "evicted": 0, "grown": 0, "grown_read": 0}

    # --- the store's write listener ------------------------------------------------------------
    def on_stored(self, table: str, arrow, stamp_ms: int, tag: str) -> None:
        if table != TABLE:
            return
        if arrow is None:
            self.reset()
            return
        with self._lock:
            if stamp_ms < self._since_ms:
                return
        loadtest = pc.not_equal(pc.fill_null(pc.map_lookup(arrow.column("attributes"), pa.scalar(LOADTEST_KEY),
                                                           "first"), ""), "").cast(pa.uint8())
        kept = arrow.select(list(KEPT)).append_column("loadtest", loadtest)
        projects, counts = np.unique(kept.column("project_id").to_numpy(), return_counts=True)
        with self._lock:
            if stamp_ms < self._since_ms:  # a reset came in between
                return
            self._inserts.append(_Insert(stamp_ms, kept, dict(zip(projects.tolist(), counts.tolist())), len(projects)))
            self._rows += kept.num_rows
            while self._inserts and (self._rows > MAX_ROWS or self._oldest().stamp_ms < stamp_ms - MAX_AGE_MS):
                self._evict_oldest()

    def on_command_start(self, sql: str, tag: str) -> None:
        if _WRITES_SPANS.search(sql):
            with self._lock:
                self._writing += 1

    def on_command(self, sql: str, tag: str) -> None:
        if _WRITES_SPANS.search(sql):
            self._written()

    def on_command_failed(self, sql: str, tag: str) -> None:
        if _WRITES_SPANS.search(sql):
            self._written()

    def _written(self) -> None:
        with self._lock:
            self._writing = max(0, self._writing - 1)
        self.reset()

    def reset(self) -> None:
        """Forget every insert: the window is served again from the next stamp on."""
        with self._lock:
            self._inserts.clear()
            self._rows = 0
            self._kept.clear()
            self._floor.clear()
            self._quiet.clear()
            self._since_ms = _next_ms()
            self.stats["resets"] += 1

    def _oldest(self) -> _Insert:
        return min(self._inserts, key=lambda i: i.stamp_ms)

    def _evict_oldest(self) -> None:
        gone = self._oldest()
        self._inserts.remove(gone)
        self._rows -= gone.table.num_rows
        for project_id in gone.counts:
            self._floor[project_id] = max(self._floor.get(project_id, 0), gone.stamp_ms + 1)
        self.stats["evicted"] += 1

    # --- the summariser ------------------------------------------------------------------------
    def window(self, project_id: int, since_ms: int, until_ms: int, limit: int) -> Window | None:
        """The project's spans stamped in [since_ms, until_ms), where every insert stamped there is
        known (``until_ms`` at most the start of the oldest insert still running:
        ``Store.settled_until_ms``), else None (read the store). ``until_ms`` comes back lower when
        more than ``limit`` spans arrived, exactly where the summariser's ``bound`` read would put
        it: before the arrival of the span past the limit, or just after the first arrival when
        that is the same one."""
        with self._lock:
            start = min(self._since_ms, self._quiet.get(project_id, self._since_ms))
            if self._writing or since_ms < max(start, self._floor.get(project_id, 0)):
                self.stats["store"] += 1
                return None
            picked = sorted((i for i in self._inserts if since_ms <= i.stamp_ms < until_ms and project_id in i.counts),
                            key=lambda i: i.stamp_ms)
            self.stats["windows"] += 1
        if sum(i.counts[project_id] for i in picked) > limit:
            seen = 0
            for insert in picked:
                seen += insert.counts[project_id]
                if seen > limit:
                    until_ms = min(until_ms, max(insert.stamp_ms, picked[0].stamp_ms + 1))
                    break
            picked = [i for i in picked if i.stamp_ms < until_ms]
        parts = []
        for insert in picked:
            part = insert.table
            if len(insert.counts) > 1:
                part = part.filter(pc.equal(part.column("project_id"), pa.scalar(project_id, pa.uint64())))
            parts.append(_stamped(part, insert.stamp_ms))
        table = pa.concat_tables(parts) if parts else _EMPTY
        with self._lock:
            earlier = [k.table for k in self._kept if k.project_id == project_id and k.stamp_ms < since_ms]
        return Window(project_id, until_ms, table, pa.concat_tables(earlier) if earlier else None, stats=self.stats)

    def quiet(self, project_id: int, since_ms: int, until_ms: int) -> None:
        """The store holds none of the project's spans stamped in [since_ms, until_ms) (a run that
        read it found none): where that reaches the memory's start, the memory serves the project's
        windows from ``since_ms`` on (a project's first runs after a start read the store until
        one finds spans otherwise, and that one would read all of them)."""
        with self._lock:
            if since_ms <= until_ms and until_ms >= self._since_ms:
                self._quiet[project_id] = min(since_ms, self._quiet.get(project_id, since_ms))

    def consumed(self, project_id: int, until_ms: int, keep: list[str] | None = None) -> None:
        """The project's arrivals before ``until_ms`` are summarised (its watermark is there).
        ``keep``: the traces their summaries left without a root, whose spans are kept (a copy of
        them) in case they grow (``Window.grown``)."""
        wanted = pa.array(sorted(set(keep)), pa.string()) if keep else None
        with self._lock:
            held, done = [], []
            for insert in self._inserts:
                if insert.stamp_ms < until_ms and project_id in insert.counts:
                    del insert.counts[project_id]
                    done.append(insert)
                if insert.counts:
                    held.append(insert)
                else:
                    self._rows -= insert.table.num_rows
            self._inserts = held
            since_ms = self._since_ms
        if wanted is None:
            return
        parts = []
        for insert in done:
            part = insert.table
            mask = pc.is_in(part.column("trace_id"), value_set=wanted)
            if insert.projects > 1:
                mask = pc.and_(mask, pc.equal(part.column("project_id"), pa.scalar(project_id, pa.uint64())))
            part = part.filter(mask)
            if part.num_rows:
                parts.append(_stamped(part, insert.stamp_ms))
        # One table a run, in one piece (a copy: the inserts' tables, every column of each, are let go;
        # and the reads of it take each column at once, not insert by insert).
        kept = [_Kept(max(i.stamp_ms for i in done), project_id,
                      pa.concat_tables(parts).combine_chunks())] if parts else []
        with self._lock:
            if since_ms != self._since_ms:  # a reset came in between: what was held may be gone from spans
                return
            self._kept.extend(kept)
            size = self.kept_bytes
            newest = max((k.stamp_ms for k in self._kept), default=0)
            while self._kept and (size > MAX_HISTORY_BYTES or self._kept[0].stamp_ms < newest - HISTORY_MS):
                size -= self._kept.pop(0).table.nbytes

    @property
    def rows(self) -> int:
        """Spans held for runs still to come (``kept_rows``: those kept for traces that grow)."""
        return self._rows

    @property
    def kept_rows(self) -> int:
        return sum(k.table.num_rows for k in self._kept)

    @property
    def kept_bytes(self) -> int:
        return sum(k.table.nbytes for k in self._kept)

    @property
    def since_ms(self) -> int:
        """The first stamp from which every insert is held (until a reset)."""
        return self._since_ms


def _next_ms() -> int:
    """The first whole ms after now: an insert registered from now on is stamped there or later."""
    return time.time_ns() // 1_000_000 + 1


_EMPTY_FIELDS = [("project_id", pa.uint64()), ("trace_id", pa.string()), ("start_time", pa.timestamp("ns", "UTC"))]
_EMPTY = pa.table({name: pa.array([], t) for name, t in _EMPTY_FIELDS})

def fresh_for(store) -> FreshSpans | None:
    """The store's FreshSpans, registered as its write listener on first use (it serves arrivals
    stamped after that); None where the store is written by other processes too (a server)."""
    if store.kind != "embedded":
        return None
    return store.write_listener("analytics.fresh_spans", FreshSpans)
