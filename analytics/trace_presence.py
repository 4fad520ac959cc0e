"""Which touched traces may already have a summary, answered in memory on the embedded store.

Every summariser run looks up the latest summary of the traces it touches (their earlier spans'
range, their start, whether they have a root). ``traces`` is ordered by trace id in granules of
1,024 rows and a run's ids are random, so that lookup reads a granule of nearly every part: its
cost grows with the whole table (``bench/trace_lookup.py``: 39 ms of CPU for 4,700 ids among
300,000 summaries, 391 among 6 M), until it outlasts the 2 s between runs. Neither a
``bloom_filter`` skipping index (834 ms) nor an ``EmbeddedRocksDB`` key-value table (520 ms, with
keys written in many small inserts) keeps it flat.

On the embedded store this process makes every write to ``traces``, so it can keep two things
that answer most of a run's ids without reading the table:

- a **Bloom filter** of every (project, trace) that has a summary: built once from the table (its
  ids only), then fed by every insert into ``traces`` through ``Store.insert`` (the store's write
  listeners). A trace it does not hold has no summary: the run treats it as new without a read.
  It can answer "maybe" for a trace that has none (about one in 70,000 when full, far fewer after
  a build, and any deleted since), which
  costs a read, never a wrong answer. A statement that writes ``traces`` other than the
  summariser's own (``INSERT … SELECT`` in a script or migration) or removes its rows makes it
  start over from the table.
- the **recent summaries** this process wrote (the last ``RECENT_SECONDS``, at most
  ``RECENT_MAX`` traces), with what the lookup would return: a trace that grows over a few runs
  (its spans exported as they end) is answered from here. A summary written by anyone else makes
  it forget them all (they may no longer be the latest).

Only the ids the filter holds and the recent summaries do not (a late span of an older trace, a
false positive) are read from ``traces``, by id: a few granules, whatever the table's size. A
ClickHouse server is written by other processes too (Celery workers, other web workers): there
the summariser reads every id, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import numpy as np

from store import column_values, writes_table

log = logging.getLogger(__name__)

TABLE = "traces"
SUMMARY_WRITE_TAG = "analytics.summarizer.write"  # the summariser's writes of ``traces``: it reports their ids itself
RECENT_SECONDS = 60.0  # a trace's spans mostly arrive within this (exporters send every few seconds)
RECENT_MAX = 200_000  # summaries remembered at most (~16 MB)
# Bits of the filter per trace at capacity (it is built for twice the traces it holds, and again
# once it holds that many), and bits each trace sets. A summariser run asks for ~4,700 new ids at
# 20,000 spans/s, and a single false positive costs that run a read of ``traces`` by id (~20 ms of
# CPU). Bits anywhere in the array, 24 per trace and 12 a trace: false positives 1.4e-5 at
# capacity, 1.4e-8 just after a build, so that at most a few runs in a hundred read. The one-word
# blocked filter it replaces (12 bits a trace, 7 in one 64-bit word) answered 0.33 % of new ids
# "maybe", and 44 of 50 runs read (docs/BENCHMARKS.md, "2026-12-08"). Positions are scaled from
# 32 bits, so up to 2**32 bits (~170 M traces) they spread evenly; beyond, still no false negative.
BITS_PER_TRACE = 24
HASHES = 12
MIN_CAPACITY = 1 << 16
SYNC_BUILD_MAX = 200_000  # summaries the filter is built from in the lookup itself; more: on BUILD_THREAD
BUILD_THREAD = "trace-presence-build"
# The filter is built a range of trace ids at a time: '' ≤ id < '1', …, 'f' ≤ id (ids are lowercase hex).
_ID_RANGES = [("" if i == 0 else f"{i:x}", f"{i + 1:x}" if i < 15 else "") for i in range(16)]
FIELDS = ("spans_start_ns", "spans_end_ns", "start_ns", "has_root", "version", "spans_digest")

_NIBBLE = np.zeros(256, dtype=np.uint8)  # a hex digit's value (anything else: 0; only hashes matter)
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _NIBBLE[_c] = 10 + _i
_WRITES_TRACES = writes_table(TABLE)


def _mix(x: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix64's): ids that are not random (counters) spread all the same."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def trace_hashes(project_id: int, trace_ids) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes of each (project, trace id): the 32 hex digits read as two numbers,
    mixed with the project. ``trace_ids``: text, or an (n, 32) array of their bytes."""
    digits = _NIBBLE[_id_bytes(trace_ids)]
    packed = np.ascontiguousarray((digits[:, 0::2] << 4) | digits[:, 1::2])  # (n, 16) bytes
    halves = packed.view(">u8").astype(np.uint64)  # (n, 2): the id as two numbers
    with np.errstate(over="ignore"):
        project = _mix(np.uint64(project_id) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1))
        h1 = _mix(halves[:, 0] ^ project)
        h2 = _mix(halves[:, 1] + h1)
    return h1, h2


class BloomFilter:
    """A Bloom filter over (project, trace id) pairs: each id sets ``HASHES`` bits of one array of
    bits, at positions h1 + i·h2 (double hashing of the id's two hashes; numpy over all the ids at
    once)."""

    def __init__(self, capacity: int):
        self.capacity = max(MIN_CAPACITY, int(capacity))
        self.words = max(1, -(-self.capacity * BITS_PER_TRACE // 64))
        self.bits = np.uint64(self.words * 64)
        self._array = np.zeros(self.words, dtype=np.uint64)
        self.count = 0

    def _slots(self, project_id: int, trace_ids):
        """Each id's ``HASHES`` (word, bit mask) pairs, one per hash."""
        h1, h2 = trace_hashes(project_id, trace_ids)
        h2 = h2 | np.uint64(1)  # odd: the positions of one id never all coincide
        one, low, shift = np.uint64(1), np.uint64(63), np.uint64(32)
        with np.errstate(over="ignore"):
            for i in range(HASHES):
                # the top 32 bits of h1 + i·h2, scaled to the bit count (a multiply, not a division)
                position = ((h1 + np.uint64(i) * h2) >> shift) * self.bits >> shift
                yield (position >> np.uint64(6)).astype(np.int64), one << (position & low)

    def add(self, project_id: int, trace_ids) -> None:
        if not len(trace_ids):
            return
        for word, mask in self._slots(project_id, trace_ids):
            np.bitwise_or.at(self._array, word, mask)  # (unbuffered: two ids of one word both count)
        self.count += len(trace_ids)

    def may_contain(self, project_id: int, trace_ids) -> np.ndarray:
        found = np.ones(len(trace_ids), dtype=bool)
        if not len(trace_ids):
            return found
        for word, mask in self._slots(project_id, trace_ids):
            found &= (self._array[word] & mask) != 0
        return found

    @property
    def full(self) -> bool:
        return self.count > self.capacity


class TracePresence:
    """The summariser's memory of which traces have a summary, for one embedded store (see the
    module's docstring). Thread-safe: the summariser, the ingest writer's inserts and any other
    writer call it from their own threads."""

    def __init__(self, store):
        self._store = store
        self._lock = threading.Lock()
        self._filter: BloomFilter | None = None  # None: build from the table on the next lookup
        self._building: BloomFilter | None = None  # being filled from the table (not yet answering)
        self._epoch = 0  # raised by every reset: a build that raced one is thrown away
        # The recent summaries, a chunk per summariser write: (when, project, ids sorted as 32-byte
        # strings, their lookup fields as int64 columns, their digests), oldest first. Arrays, not
        # a dict of tuples: ~80 bytes a trace instead of ~400.
        self._recent: deque[tuple[float, int, np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._recent_count = 0
        self.stats = {"builds": 0, "asked": 0, "recent": 0, "absent": 0, "read": 0}

    # --- the store's write listener ------------------------------------------------------------
    def on_insert(self, table: str, rows, tag: str) -> None:
        if table != TABLE:
            return
        projects, trace_ids = column_values(rows, "project_id"), column_values(rows, "trace_id")
        if isinstance(projects, np.ndarray) and len(projects) and (projects == projects[0]).all():
            by_project = {int(projects[0]): trace_ids}  # one project's summaries (the summariser's writes)
        else:
            by_project: dict[int, list[str]] = {}
            for project_id, trace_id in zip(projects, trace_ids):
                by_project.setdefault(int(project_id), []).append(str(trace_id))
        with self._lock:
            for project_id, ids in by_project.items():
                self._filter_add(project_id, ids)
            if tag != SUMMARY_WRITE_TAG:
                self._forget_recent()  # someone else wrote summaries: the recent ones may be older

    def on_insert_failed(self, table: str, tag: str) -> None:
        if table == TABLE:
            self.reset()

    def on_command(self, sql: str, tag: str) -> None:
        if tag != SUMMARY_WRITE_TAG and _WRITES_TRACES.search(sql):
            self.reset()

    def on_command_failed(self, sql: str, tag: str) -> None:
        if _WRITES_TRACES.search(sql):  # the summariser's own too: it reports no ids for it
            self.reset()

    def reset(self) -> None:
        with self._lock:
            self._filter = self._building = None
            self._epoch += 1
            self._forget_recent()

    def _filter_add(self, project_id: int, trace_ids) -> None:
        for bloom in (self._filter, self._building):
            if bloom is not None:
                bloom.add(project_id, trace_ids)

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_count = 0

    # --- the summariser ------------------------------------------------------------------------
    def written(self, project_id: int, trace_ids: list[str], rows=None) -> None:
        """The summariser wrote these traces' summaries (``rows``: their ``traces`` columns, when it
        has them; without, e.g. an ``INSERT … SELECT``, only the filter learns the ids)."""
        now = time.monotonic()
        if rows is not None:
            ids = _id_keys(trace_ids)
            order = np.argsort(ids)
            fields = np.column_stack([np.asarray(column_values(rows, name), dtype=np.int64)[order] for name in
                                      ("spans_start", "spans_end", "start_time", "has_root", "version")])
            digests = np.asarray(column_values(rows, "spans_digest"), dtype=np.uint64)[order]
        with self._lock:
            if rows is None:
                # an INSERT … SELECT: only the filter learns the ids (rows inserted through
                # Store.insert reached it by on_insert), and the recent summaries of these traces
                # are no longer their latest
                self._filter_add(project_id, trace_ids)
                self._forget_recent()
                return
            self._recent.append((now, project_id, ids[order], fields, digests))
            self._recent_count += len(ids)
            self._expire(now)

    def _expire(self, now: float) -> None:
        while self._recent and (now - self._recent[0][0] > RECENT_SECONDS or self._recent_count > RECENT_MAX):
            self._recent_count -= len(self._recent.popleft()[2])

    def split(self, project_id: int, trace_ids: list[str]) -> tuple[dict[str, dict], list[str]]:
        """({trace id: its latest summary's lookup fields} for those answered from memory, [ids to
        read from ``traces``]). A trace in neither has no summary.

        The filter is asked first: every summary in the recent chunks reached it too (``on_insert``;
        a reset clears both), so an id it does not hold is new, and only the ones it may hold (the
        traces that grow, and the rare false positive) are looked for among the recent summaries. Under
        traffic whose traces arrive whole nearly every id is new, and the search of a minute of
        chunks (a sorted search of text per chunk) is skipped for it."""
        self._ensure_filter()
        known: dict[str, dict] = {}
        wanted = _id_keys(trace_ids)
        with self._lock:
            self._expire(time.monotonic())
            bloom = self._filter
            maybe = bloom.may_contain(project_id, wanted) if bloom is not None else np.ones(len(wanted), dtype=bool)
            open_ = maybe.copy()  # may have a summary, and not found in a newer chunk yet
            for _, chunk_project, ids, fields, digests in reversed(self._recent):
                if chunk_project != project_id:
                    continue
                look = np.flatnonzero(open_)
                if not len(look):
                    break
                at = np.minimum(np.searchsorted(ids, wanted[look]), len(ids) - 1)
                hit = ids[at] == wanted[look]
                for i, row in zip(look[hit].tolist(), at[hit].tolist()):
                    known[trace_ids[i]] = dict(zip(FIELDS, (*fields[row].tolist(), int(digests[row]))),
                                               trace_id=trace_ids[i])
                open_[look[hit]] = False
        ask = [trace_ids[i] for i in np.flatnonzero(open_).tolist()]
        self.stats["asked"] += len(trace_ids)
        self.stats["recent"] += len(known)
        self.stats["absent"] += len(trace_ids) - int(maybe.sum())
        self.stats["read"] += len(ask)
        return known, ask

    def _ensure_filter(self) -> None:
        """Build the filter from every trace id in ``traces`` (once, again after a reset, and a
        bigger one once it holds more ids than it was sized for). The new filter receives the ids
        of every insert from before its read starts (``on_insert``), and answers only once the
        read has filled it: meanwhile a full one keeps answering (more false positives, never a
        false negative), and without one every id is read from the table. A table of up to
        ``SYNC_BUILD_MAX`` summaries is read here (a fraction of a second); a bigger one on a
        thread of its own (``BUILD_THREAD``), so that the run that finds the filter full is not
        held up by a read of the whole table (3.8-5.8 s at 6 M summaries)."""
        with self._lock:
            if (self._filter is not None and not self._filter.full) or self._building is not None:
                return
            epoch = self._epoch
            least = self._filter.count if self._filter is not None else 0
        total = int(self._store.query(f"SELECT count() FROM {TABLE}", tag="analytics.trace_presence.count").scalar())
        with self._lock:
            if self._epoch != epoch or self._building is not None:
                return
            bloom = self._building = BloomFilter(2 * max(total, least))
        if total <= SYNC_BUILD_MAX:
            self._build(bloom, epoch)
            return
        threading.Thread(target=self._build, args=(bloom, epoch), name=BUILD_THREAD, daemon=True).start()

    def _build(self, bloom: BloomFilter, epoch: int) -> None:
        """Fill ``bloom`` from the table and make it the filter, unless a reset came meanwhile. A
        failed read (the store stopping) leaves things as they were: the next lookup tries again."""
        try:
            projects = self._store.query(f"SELECT DISTINCT project_id FROM {TABLE}",
                                         tag="analytics.trace_presence.projects").rows
            for (project_id,) in projects:
                # A sixteenth of the project's ids at a time (a range of the sort key: only its
                # granules are read), so the read never holds the whole column at once.
                for low, high in _ID_RANGES:
                    ids = self._store.query_arrow(
                        f"SELECT trace_id FROM {TABLE} WHERE project_id = {{p:UInt64}} AND trace_id >= {{low:String}}"
                        + (" AND trace_id < {high:String}" if high else ""),
                        {"p": int(project_id), "low": low, "high": high}, tag="analytics.trace_presence.build")
                    with self._lock:
                        if self._epoch != epoch or self._building is not bloom:
                            return  # reset meanwhile: the next lookup builds again
                        bloom.add(int(project_id), _fixed_ids(ids.column("trace_id")))
            with self._lock:
                if self._epoch == epoch and self._building is bloom:
                    self._filter = bloom
                    self.stats["builds"] += 1
        except Exception:  # noqa: BLE001 - logged; the lookup reads by id meanwhile, which is always right
            log.exception("building the summariser's trace filter failed; the next run tries again")
        finally:
            with self._lock:
                if self._building is bloom:
                    self._building = None

    def wait_built(self, timeout: float = 60.0) -> bool:
        """Wait until no build is running (tests, benchmarks); True when none is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._building is None:
                    return True
            time.sleep(0.01)
        return False


def _fixed_ids(column) -> np.ndarray:
    """A column of 32-character trace ids as an (n, 32) array of their bytes."""
    import pyarrow as pa

    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if pa.types.is_fixed_size_binary(array.type) and array.type.byte_width == 32 and array.null_count == 0:
        data = np.frombuffer(array.buffers()[1], dtype=np.uint8)[array.offset * 32:(array.offset + len(array)) * 32]
        return data.reshape(-1, 32)
    return _id_bytes([str(v) for v in array.to_pylist()])


def _id_keys(trace_ids: list[str]) -> np.ndarray:
    """Trace ids as sortable, comparable ``S32`` keys (UTF-8, cut at 32 bytes; numpy converts them
    in C, not a loop of ``encode``)."""
    try:
        return np.array(trace_ids, dtype="S32")
    except UnicodeEncodeError:  # not ASCII (never a valid id)
        return np.array([t.encode() for t in trace_ids], dtype="S32")


def _id_bytes(trace_ids) -> np.ndarray:
    """Trace ids (text, or their ``_id_keys``) as an (n, 32) array of bytes (other lengths padded
    with "0" or cut: only their hashes matter)."""
    if isinstance(trace_ids, np.ndarray) and trace_ids.dtype == np.uint8:
        return trace_ids  # already (n, 32) bytes (``_fixed_ids``)
    keys = trace_ids.astype("S32", copy=False) if isinstance(trace_ids, np.ndarray) and trace_ids.dtype.kind == "S" \
        else _id_keys(trace_ids)
    data = keys.view(np.uint8).reshape(-1, 32).copy()
    data[data == 0] = ord("0")  # padded with "0" (a valid id holds no NUL)
    return data


def presence_for(store) -> TracePresence | None:
    """The store's TracePresence, registered as its write listener on first use; None where the
    store is written by other processes too (a ClickHouse server)."""
    if store.kind != "embedded":
        return None
    return store.write_listener("analytics.trace_presence", lambda: TracePresence(store))
