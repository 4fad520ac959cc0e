"""The two ClickHouse backends. Both take the same SQL text with ``{name:Type}`` placeholders.

- ``NativeBackend``: a ClickHouse server through clickhouse-driver (native protocol, lz4,
  server-side parameters, timeouts).
- ``EmbeddedBackend``: chdb, the ClickHouse engine in this process. One data path per process.

Neither a driver ``Client`` nor a chdb connection may serve two calls at once (parameters on a
shared connection race), so each call borrows one from a ``ConnectionPool`` and gives it back:
as many connections as calls run at once, reused by whichever thread calls next. (They were once
kept per thread; the web server runs each page request in a thread of its own, so every request
opened one more and the embedded store kept them all: ~110 KiB a request.)

Values crossing the boundary are normalised so callers see the same Python values from both:
DateTime/DateTime64 come back as aware UTC ``datetime`` (microseconds; select
``toUnixTimestamp64Nano(col)`` where nanoseconds matter) and go in as integer nanoseconds.
"""

from __future__ import annotations

import itertools
import logging
from contextlib import contextmanager
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import msgspec

from config import priority

from .errors import DataDirLocked, StoreAuthError, StoreBusy, StoreError, StoreTimeout, StoreUnavailable, query_error

log = logging.getLogger("tracedash.store")

UTC = timezone.utc


class Result:
    """Rows of a query with their column names and ClickHouse types."""

    __slots__ = ("columns", "types", "rows")

    def __init__(self, columns: list[str], types: list[str], rows: list[tuple]):
        self.columns = columns
        self.types = types
        self.rows = rows

    def dicts(self) -> list[dict[str, Any]]:
        columns = self.columns
        return [dict(zip(columns, row)) for row in self.rows]

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None

    def __len__(self) -> int:
        return len(self.rows)


class Columns:
    """Rows given column by column, for ``Store.insert``: ``{name: values}``, each a list, a numpy
    array (numbers; datetimes as integer ns) or an Arrow array of one value per row; numpy and
    Arrow columns reach the embedded store without passing through Python objects."""

    __slots__ = ("columns", "count")

    def __init__(self, columns: dict, count: int):
        self.columns = columns
        self.count = count

    def __len__(self) -> int:
        return self.count

    def column(self, name: str):
        return self.columns[name]  # KeyError: Store.insert names the missing column

    @classmethod
    def from_tuples(cls, names: Sequence[str], values: list[tuple]) -> "Columns":
        """Rows given as tuples of ``names``' values, in that order, turned into list columns (one
        transposition in C: the ingest path builds its rows this way, with no dict per row)."""
        if not values:
            return cls({name: [] for name in names}, 0)
        return cls(dict(zip(names, map(list, zip(*values)))), len(values))

    @classmethod
    def from_rows(cls, names: Sequence[str], rows: Sequence[dict]) -> "Columns":
        return cls({name: [row[name] for row in rows] for name in names}, len(rows))

    @classmethod
    def from_arrow(cls, table) -> "Columns":
        """A pyarrow table built by :func:`arrow_table` (in another process, say), its columns kept
        as Arrow arrays: the embedded insert takes them as they are."""
        return cls({name: table.column(name).combine_chunks() for name in table.column_names}, table.num_rows)

    @classmethod
    def concat(cls, parts: Sequence) -> "Columns":
        """One batch of several, each ``Columns`` (of list, numpy or Arrow columns) or a list of row
        mappings, with the columns of the first ``Columns`` among them (the ingest writer's group
        commit, the summaries of a batch's reads). A column stays Arrow, or numpy, where every part
        has it so; else it becomes a list."""
        import numpy as np

        names = next(list(p.columns) for p in parts if isinstance(p, Columns))
        parts = [p if isinstance(p, Columns) else cls.from_rows(names, p) for p in parts]
        columns = {}
        for name in names:
            values = [p.columns[name] for p in parts]
            if all(hasattr(v, "to_pylist") for v in values):
                import pyarrow as pa

                columns[name] = pa.concat_arrays(values)
            elif all(isinstance(v, np.ndarray) for v in values):
                columns[name] = np.concatenate(values)
            else:
                columns[name] = list(itertools.chain.from_iterable(map(python_values, values)))
        return cls(columns, sum(p.count for p in parts))

    @property
    def arrow(self) -> bool:
        """Whether the columns are Arrow arrays (from :meth:`from_arrow`)."""
        return bool(self.columns) and all(hasattr(v, "to_pylist") for v in self.columns.values())

    def values(self, name: str) -> list:
        """Column ``name`` as a list of the values a parsed row holds (:func:`python_values`)."""
        return python_values(self.columns[name])

    def rows(self) -> list[dict]:
        """The rows as mappings (where a batch must be written out as rows: the ingest spool)."""
        names = list(self.columns)
        return [dict(zip(names, values)) for values in zip(*(self.values(n) for n in names))]


def _python_list(array) -> list:
    """An Arrow array built by ``_arrow_array`` back to the Python values it was built from."""
    import pyarrow as pa

    def plain(t):  # timestamps as their integer ns, everything else as it is
        if pa.types.is_timestamp(t):
            return pa.int64()
        if pa.types.is_list(t):
            return pa.list_(plain(t.value_type))
        return t

    kind = array.type
    if plain(kind) != kind:
        array = array.cast(plain(kind))
    values = array.to_pylist()
    if pa.types.is_map(kind):
        return [{} if v is None else dict(v) for v in values]
    if pa.types.is_list(kind) and pa.types.is_map(kind.value_type):
        return [[{} if m is None else dict(m) for m in v] for v in values]
    return values


def column_values(rows, name: str):
    """The values of column ``name`` of ``rows`` (mappings, or ``Columns``)."""
    return rows.column(name) if isinstance(rows, Columns) else [row[name] for row in rows]


def python_values(values) -> list:
    """A column's values as a Python list (the native driver's input): from a list as it is, from
    numpy or Arrow (an Arrow ``Map`` gives dicts and a timestamp integer ns, as rows hold them)."""
    if isinstance(values, list):
        return values
    if hasattr(values, "to_pylist"):
        return _python_list(values)
    return values.tolist()


_DT64_SCALE = re.compile(r"^DateTime64\((\d+)")


def _unwrap(ch_type: str) -> str:
    for wrapper in ("Nullable(", "LowCardinality("):
        while ch_type.startswith(wrapper):
            ch_type = ch_type[len(wrapper):-1]
    return ch_type


def _datetime_scale(ch_type: str) -> int | None:
    """9 for DateTime64(9, ...), 0 for DateTime, None for anything else."""
    base = _unwrap(ch_type)
    match = _DT64_SCALE.match(base)
    if match:
        return int(match.group(1))
    if base == "DateTime" or base.startswith("DateTime("):
        return 0
    return None


def _array_inner(ch_type: str) -> str | None:
    base = _unwrap(ch_type)
    return base[len("Array("):-1] if base.startswith("Array(") else None


def _parse_datetime_text(text: str) -> datetime:
    # ClickHouse text form: 'YYYY-MM-DD hh:mm:ss[.fffffffff]' in the column's zone (UTC here).
    head, _, frac = text.partition(".")
    value = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    if frac:
        value = value.replace(microsecond=int(frac[:6].ljust(6, "0")))
    return value


def _make_converter(ch_type: str, *, from_text: bool):
    """A function normalising one output value of ``ch_type``, or None when none is needed."""
    if _datetime_scale(ch_type) is not None:
        if from_text:
            return lambda v: None if v is None else _parse_datetime_text(v)
        return lambda v: None if v is None else (v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC))
    inner = _array_inner(ch_type)
    if inner is not None:
        convert = _make_converter(inner, from_text=from_text)
        if convert is not None:
            return lambda v: [convert(x) for x in v]
        return None if from_text else list
    if not from_text and _unwrap(ch_type).startswith("Tuple("):
        return list  # JSON gives tuples as lists; make the driver agree
    return None


def _convert_rows(rows, types: list[str], *, from_text: bool) -> list[tuple]:
    converters = [_make_converter(t, from_text=from_text) for t in types]
    if not any(converters):
        return [tuple(r) for r in rows]
    pairs = list(enumerate(converters))
    out = []
    for row in rows:
        row = list(row)
        for i, convert in pairs:
            if convert is not None:
                row[i] = convert(row[i])
        out.append(tuple(row))
    return out


# --------------------------------------------------------------------------------------------
class ConnectionPool:
    """Connections lent to one call at a time. ``open()`` makes one when none is idle; at most
    ``max_idle`` are kept between calls (the rest are closed as they come back), so the number of
    open connections follows the calls running at once, not the threads that ever made one.
    ``drain()`` takes every connection not lent out, for closing."""

    def __init__(self, open_connection, close_connection, max_idle: int = 16):
        self._open = open_connection
        self._close = close_connection
        self.max_idle = max_idle
        self._idle: list = []
        self._lock = threading.Lock()
        self.open = 0  # connections made and not yet closed (lent out or idle)

    def take(self):
        with self._lock:
            if self._idle:
                return self._idle.pop()  # the most recently used: its caches are warm
        conn = self._open()
        with self._lock:
            self.open += 1
        return conn

    def give(self, conn) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
            self.open -= 1
        self._close(conn)

    @contextmanager
    def lent(self):
        """A connection for the duration of one call, given back after it."""
        conn = self.take()
        try:
            yield conn
        finally:
            self.give(conn)

    def drain(self) -> list:
        """Every idle connection, taken out of the pool for the caller to close."""
        with self._lock:
            idle, self._idle = self._idle, []
            self.open -= len(idle)
        return idle

    @property
    def idle(self) -> int:
        return len(self._idle)


# Every statement runs without ClickHouse's "optimize on insert": for a Replacing or Aggregating
# table it merges the rows of each new block that share a sorting key before the part is written, a
# pass that copies every row (with its attribute maps) once more. Rows of one insert rarely share a
# key (an INSERT ... SELECT that groups by the key never), and every reader deduplicates anyway
# (FINAL, LIMIT 1 BY, argMax, GROUP BY), as it must for rows of the same key that arrive in separate
# inserts; merges fold them as they always do. A session setting, so that it also reaches the
# summariser's and the rollups' INSERT ... SELECT and the materialized views they feed. An insert
# of 4,000 spans: 70 -> 36 ms of CPU; the summary statement over 14,000 spans: -6 %
# (docs/BENCHMARKS.md, "optimize on insert").
SESSION_SETTINGS = {"optimize_on_insert": 0}

# The embedded ClickHouse's merge threads: its background executor's, which the engine starts once per
# process, when the first MergeTree table is created or loaded, and which run nothing else.
MERGE_THREAD_NAME = "MergeMutate"
_MERGES_LOWERED: list[int] = []  # their ids, once lowered in this process (config.priority)
_MERGES_LOCK = threading.Lock()
_MERGES_NEXT_LOOK = [0.0]  # monotonic time before which a statement does not look for them again

# Inserts running now in this process, per (database, table): {insert number: its start, unix ns}.
# chdb opens a data directory in one process only, so in the embedded mode these are all the
# inserts there are (``EmbeddedBackend.settled_until_ns``).
_INFLIGHT: dict[tuple[str, str], dict[int, int]] = {}
_INFLIGHT_LOCK = threading.Lock()
_INFLIGHT_NUMBERS = itertools.count(1)


class EmbeddedBackend:
    """chdb: ClickHouse in-process, data under ``path``."""

    name = "embedded"

    def __init__(self, path: Path, database: str, *, merge_nice: int = 0):
        self.path = Path(path)
        self.database = database
        # How much lower the CPU priority of the engine's merges is than the process's (set once per
        # process, by the first backend that opens; config.priority; 0 where a thread has no priority of
        # its own): the server's TRACEDASH_BACKGROUND_NICE. A merge is background work: under load
        # the requests come first.
        self.merge_nice = merge_nice if priority.supported() else 0
        self._database_ready = False
        self._lock = threading.Lock()
        self._pool = ConnectionPool(self._open, _close_quietly)
        # Shutdown bookkeeping: the number of calls inside chdb right now, and whether close() has
        # begun (no new calls then; the connections are closed once the last call returned).
        self._state = threading.Condition()
        self._active = 0
        self._closed = False
        self._purge_unsupported = False

    def describe(self) -> str:
        return f"embedded chdb at {self.path} (database {self.database})"

    def _open(self):
        import chdb

        self.path.mkdir(parents=True, exist_ok=True)
        try:
            conn = chdb.connect(str(self.path))
        except Exception as exc:  # chdb raises RuntimeError; the real cause goes to stderr
            text = str(exc)
            holder = _lock_holder(self.path)
            if holder is not None or "Cannot lock file" in text:
                raise DataDirLocked(
                    f"the embedded ClickHouse data directory {self.path} is in use by another process"
                    f"{f' (pid {holder})' if holder else ''}; only one process can open it. Is `make run` "
                    "already serving from this data dir? Stop it, or set TRACEDASH_DATA_DIR to another directory"
                ) from exc
            if "already initialized with path" in text:
                raise StoreError(
                    f"this process already opened another embedded ClickHouse data directory; "
                    f"chdb opens one path per process, so {self.path} cannot be opened too"
                ) from exc
            raise StoreError(f"cannot open embedded ClickHouse at {self.path}: {text}") from exc
        try:
            self._ensure_database(conn)
            conn.query(f"USE `{self.database}`")
            for name, value in SESSION_SETTINGS.items():
                conn.query(f"SET {name} = {value}")
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def _lower_merges(self) -> None:
        """Lower the CPU priority of the engine's merge threads by ``merge_nice``, once per process:
        a statement looks for them (``/proc/self/task``, well under a millisecond) at most once a
        second until they have started."""
        now = time.monotonic()
        if now < _MERGES_NEXT_LOOK[0] or not _MERGES_LOCK.acquire(blocking=False):
            return
        try:
            if _MERGES_LOWERED:
                return
            _MERGES_NEXT_LOOK[0] = now + 1.0
            tids = priority.threads_named(MERGE_THREAD_NAME)
            if tids:
                lowered = [tid for tid in tids if priority.lower(self.merge_nice, tid)]
                _MERGES_LOWERED.extend(lowered or [0])  # [0]: found, and none could be lowered
                log.info("embedded ClickHouse: %d of %d merge thread(s) at nice +%d", len(lowered), len(tids),
                         self.merge_nice)
        finally:
            _MERGES_LOCK.release()

    def _ensure_database(self, conn) -> None:
        if self._database_ready:
            return
        with self._lock:
            conn.query(f"CREATE DATABASE IF NOT EXISTS `{self.database}`")
            self._database_ready = True

    def _closed_message(self) -> str:
        return f"the embedded ClickHouse store at {self.path} is closed (the server is stopping)"

    def _run(self, sql: str, params: dict | None, fmt: str, tag: str) -> bytes:
        with self._state:
            if self._closed:
                raise StoreUnavailable(self._closed_message(), tag=tag)
            self._active += 1
        if self.merge_nice > 0 and not _MERGES_LOWERED:
            self._lower_merges()
        try:
            with self._pool.lent() as conn:
                try:
                    result = conn.query(sql, fmt, params=params) if params else conn.query(sql, fmt)
                    return result.bytes()  # copied out before the connection serves another call
                except Exception as exc:
                    raise query_error(str(exc).strip(), tag=tag, code=_error_code(str(exc))) from exc
        finally:
            with self._state:
                self._active -= 1
                if not self._active:
                    self._state.notify_all()

    def query(self, sql: str, params: dict | None, tag: str) -> Result:
        raw = self._run(sql, params, "JSONCompact", tag)
        if not raw:
            return Result([], [], [])
        # msgspec: the same values as the json module (NaN comes as null, 64- and 128-bit integers
        # whole), 2.7x faster on a Variants read's 1.4 MB of sample arrays (20 -> 7.6 ms).
        payload = msgspec.json.decode(raw)
        meta = payload.get("meta", [])
        types = [m["type"] for m in meta]
        return Result([m["name"] for m in meta], types, _convert_rows(payload.get("data", []), types, from_text=True))

    def command(self, sql: str, params: dict | None, tag: str) -> None:
        self._run(sql, params, "CSV", tag)

    def query_arrow(self, sql: str, params: dict | None, tag: str):
        """A read as a ``pyarrow.Table``: ClickHouse writes Arrow and the columns are read in place
        (no value passes through Python objects)."""
        import pyarrow as pa

        raw = self._run(sql, params, "Arrow", tag)
        return pa.ipc.open_file(pa.py_buffer(raw)).read_all()

    def settled_until_ns(self, table: str) -> int:
        """A time (unix ns, ClickHouse's clock: the process's own) before which every row this store
        will ever stamp into ``table``'s ``ingested_at`` (``DEFAULT now64``) is already visible:
        now, or the start of the oldest insert into ``table`` still running. An incremental reader
        of ``ingested_at`` ranges that stops there needs no overlap for inserts that became
        visible late: an insert stamps its rows after it started, and this process makes every
        insert into this data directory (chdb opens it in one process only)."""
        now = time.time_ns()  # first: an insert that starts after this stamps its rows later
        with _INFLIGHT_LOCK:
            running = _INFLIGHT.get((self.database, table))
            oldest = min(running.values()) if running else now
        return min(now, oldest)

    def release_memory(self) -> bool:
        """Hand the memory ClickHouse has freed back to the system (``SYSTEM JEMALLOC PURGE``); True
        when done. chdb's allocator keeps the pages its threads freed until that thread allocates
        again, and runs no background thread that would return them after a while, as a server's
        does: one query building 250 MiB of intermediate data leaves the process that much bigger
        (tests/test_store_memory.py), and ingestion with the beat's tasks in one process held ~150
        MiB more after six minutes than with this call every 10 s (docs/BENCHMARKS.md, "Soak"). The
        embedded beat calls it every few seconds (store.tasks.release_memory). False, once and
        from then on, where the chdb build has no jemalloc."""
        if self._purge_unsupported:
            return False
        try:
            self.command("SYSTEM JEMALLOC PURGE", None, "store.release_memory")
        except StoreUnavailable:
            return False
        except StoreError as exc:
            self._purge_unsupported = True
            log.warning("embedded ClickHouse cannot return freed memory (SYSTEM JEMALLOC PURGE: %s); RSS may "
                        "stay above what it uses", exc)
            return False
        return True

    def insert(self, table: str, columns: Sequence[str], types: Sequence[str], rows: Sequence[dict], tag: str,
               dedup_token: str | None = None, *, stamp: str | None = None, stored=None) -> None:
        """``stamp``: a ``DEFAULT now64(3)`` column (``ingested_at``) that this insert fills itself,
        with the unix ms at which it registered as running: the value ClickHouse would stamp (the
        same clock, a moment earlier), but known here. ``stored(arrow, stamp_ms)``: called once the
        rows are stored (the Arrow table they travelled as), or with ``None`` when the insert
        raised (its rows may be stored all the same), while the insert still counts as running
        (``settled_until_ns``): a reader that stops before the running inserts never sees rows
        whose ``stored`` call has not returned."""
        key, number = (self.database, table), next(_INFLIGHT_NUMBERS)
        with _INFLIGHT_LOCK:
            started_ns = _INFLIGHT.setdefault(key, {})[number] = time.time_ns()
        stamp_ms = started_ns // 1_000_000
        try:
            try:
                arrow = self._insert(table, columns, types, rows, tag, dedup_token,
                                     stamp=(stamp, stamp_ms) if stamp else None)
            except BaseException:
                if stored is not None:
                    stored(None, stamp_ms)
                raise
            if stored is not None:
                stored(arrow, stamp_ms)
        finally:
            with _INFLIGHT_LOCK:
                del _INFLIGHT[key][number]

    def _insert(self, table: str, columns: Sequence[str], types: Sequence[str], rows: Sequence[dict], tag: str,
                dedup_token: str | None, stamp: tuple[str, int] | None = None):
        # Rows travel as an Arrow table that chdb reads in place (Python() table function): about
        # four times cheaper than JSONEachRow text on both the Python and the ClickHouse side.
        arrow_rows = arrow_table(columns, types, rows)
        tight_rows = tight_schema(arrow_rows)  # noqa: F841 - chdb finds it by name
        column_list = ", ".join(f"`{c}`" for c in columns)
        selected = "*"
        if stamp is not None:
            column_list += f", `{stamp[0]}`"
            selected = f"*, fromUnixTimestamp64Milli(toInt64({int(stamp[1])}), 'UTC')"
        # The token is checked by Store.insert (letters, digits, - and _), so it is safe as text.
        # chdb turns async_insert on by default, which makes every insert wait for a buffer flush;
        # callers batch already (the ingest writer's group commit), so insert synchronously. One
        # thread: the rows come from one Arrow table, and a second thread only splits the blocks
        # (an insert of 4,000-8,000 spans cost 20-25 % more CPU on two; 1,000: the same).
        settings = " SETTINGS async_insert = 0, max_threads = 1" + (f", insert_deduplication_token = '{dedup_token}'" if dedup_token else "")
        self.command(f"{tag_comment(tag)}INSERT INTO {table} ({column_list}){settings} SELECT {selected} FROM Python(tight_rows)",
                     None, tag)
        return arrow_rows

    def close(self, timeout: float = 60.0) -> bool:
        """Refuse new calls, wait up to ``timeout`` seconds for those inside chdb to return, then
        close every connection, once. True when nothing was still running; False leaves the
        connections open (closing one under a running query would crash the process).
        A second call returns at once."""
        with self._state:
            if self._closed and not self._pool.idle:
                return self._active == 0
            self._closed = True
            deadline = time.monotonic() + timeout
            while self._active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._state.wait(remaining)
            connections = self._pool.drain()
        for conn in connections:
            _close_quietly(conn)
        return True

    def reopen(self) -> None:
        """Accept calls again after ``close()`` (tests and scripts that close and go on)."""
        with self._state:
            self._closed = False


def _close_quietly(conn) -> None:
    """Close a chdb connection or disconnect a driver client; best effort (nothing uses it any more)."""
    try:
        (conn.disconnect if hasattr(conn, "disconnect") else conn.close)()
    except Exception:  # noqa: BLE001
        pass


def _lock_holder(path: Path) -> str | None:
    """The pid holding ClickHouse's lock on ``path/status`` ("" when unknown), or None if unlocked."""
    import fcntl

    status = path / "status"
    try:
        handle = open(status, "rb")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            match = re.search(rb"PID: (\d+)", handle.read(200))
            return match.group(1).decode() if match else ""
        except OSError:
            return None
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


_ARROW_SCALARS = {
    "UInt8": "uint8", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
    "Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64",
    "Float32": "float32", "Float64": "float64", "Bool": "bool_", "String": "string",
}


def _arrow_array(ch_type: str, values):
    """An Arrow array for ``values`` (a list, or a numpy array of numbers) of ClickHouse type
    ``ch_type`` (datetimes as integer ns)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(values, pa.Array):
        return values  # built by the caller in the column's shape
    base = _unwrap(ch_type)
    if isinstance(values, np.ndarray):
        if _datetime_scale(base) is not None:
            return pa.array(values.astype(np.int64, copy=False)).cast(pa.timestamp("ns", tz="UTC"))
        scalar = _ARROW_SCALARS.get(base)
        if scalar is None or scalar == "string":
            return _arrow_array(ch_type, values.tolist())
        return pa.array(values).cast(getattr(pa, scalar)())
    if _datetime_scale(base) is not None:
        return pa.array(values, type=pa.int64()).cast(pa.timestamp("ns", tz="UTC"))
    if base.startswith("FixedString("):
        return pa.array(values, type=pa.string())
    if base.startswith("Array("):
        offsets, flat = [0], []
        for value in values:
            flat.extend(value)
            offsets.append(len(flat))
        return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), _arrow_array(base[6:-1], flat))
    if base.startswith("Map("):
        key_type, value_type = _split_type_args(base[4:-1])
        offsets, keys, items = [0], [], []
        for mapping in values:
            keys.extend(mapping.keys())
            items.extend(mapping.values())
            offsets.append(len(keys))
        return pa.MapArray.from_arrays(pa.array(offsets, type=pa.int32()), _arrow_array(key_type, keys),
                                       _arrow_array(value_type, items))
    scalar = _ARROW_SCALARS.get(base)
    if scalar is None:
        raise StoreError(f"no Arrow mapping for ClickHouse type {ch_type}")
    return pa.array(values, type=getattr(pa, scalar)())


def _split_type_args(args: str) -> list[str]:
    depth, start, parts = 0, 0, []
    for i, char in enumerate(args):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
    parts.append(args[start:].strip())
    return parts


TIGHT_NULLABILITY = True  # tight_schema on (bench/insert_cost.py compares with it off)


def arrow_table(columns: Sequence[str], types: Sequence[str], rows: Sequence[dict]):
    """Rows as a pyarrow table of ``columns`` with the ClickHouse ``types``: the Python half of an
    embedded insert (chdb reads the table by its variable name; bench/ingest.py times it alone)."""
    import pyarrow as pa

    arrays = []
    for name, ch_type in zip(columns, types):
        values = column_values(rows, name)
        try:
            arrays.append(_arrow_array(ch_type, values))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise StoreError(f"values for column {name} ({ch_type}) do not fit: {exc}") from exc
    return pa.Table.from_arrays(arrays, names=list(columns))


def tight_schema(table):
    """``table`` as chdb should read it for an insert: each column (and the items of an array or map
    column) without a null declared not nullable. chdb infers the source's types from the Arrow
    schema, and a nullable field becomes a Nullable column that the insert then converts back,
    column by column: declared tight, a 45-column summary insert costs ~5 ms less of CPU, whatever
    its size (docs/BENCHMARKS.md, "2026-12-08"). The buffers are shared, not copied."""
    import pyarrow as pa

    if not TIGHT_NULLABILITY:
        return table
    fields = [pa.field(field.name, _tight_type(column), nullable=column.null_count > 0)
              for field, column in zip(table.schema, table.columns)]
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)


def _tight_type(array):
    """``array``'s type with each list item and map value declared not nullable where none is null
    (the same object when nothing changes)."""
    import pyarrow as pa

    kind = array.type
    if not (pa.types.is_list(kind) or pa.types.is_map(kind)) or array.null_count:
        return kind
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    if pa.types.is_map(kind):
        if kind.item_field.nullable and not any(chunk.items.null_count for chunk in chunks):
            return pa.map_(kind.key_field, kind.item_field.with_nullable(False))
        return kind
    if kind.value_field.nullable and not any(chunk.flatten().null_count for chunk in chunks):
        return pa.list_(kind.value_field.with_nullable(False))
    return kind


def _error_code(text: str) -> int | None:
    match = re.search(r"Code: (\d+)", text)
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------------------------
class NativeBackend:
    """A ClickHouse server over the native protocol (clickhouse-driver)."""

    name = "native"

    def __init__(self, url, database: str | None = None, cluster: str | None = None):
        self.url = url
        self.database = database or url.database
        self._pool = ConnectionPool(self._open, _close_quietly)
        self._database_ready = False
        self._lock = threading.Lock()
        self.cluster = cluster or None
        # On a cluster (docs/cluster.md) the canonical tables are Distributed. Every call then runs with:
        # - distributed_product_mode = 'global': an IN/JOIN subquery over another Distributed table
        #   (``trace_id IN (SELECT ... FROM traces_by_start ...)``) is refused by default ('deny');
        #   'global' runs it once and sends its result to every shard, right whichever way the inner
        #   table is sharded.
        # - distributed_foreground_insert = 1 (formerly insert_distributed_sync): an INSERT (rows, or
        #   the summariser's and rollups' INSERT … SELECT) sends each shard its part of the block
        #   within the statement, with the statement's settings, so what is acknowledged is stored
        #   on every shard it touches (not queued on the receiving node for a background send), and
        #   insert_deduplication_token reaches each shard's Replicated table, which keeps it in
        #   Keeper for all its replicas (replicated_deduplication_window…, store.schema). A retried
        #   batch splits the same way (every sharding key is a hash of supplied columns), so each
        #   shard drops its part as a duplicate.
        # - insert_deduplicate = 1: the default, set so a user profile cannot turn it off.
        self._cluster_settings = ({"distributed_product_mode": "global", "distributed_foreground_insert": 1,
                                   "insert_deduplicate": 1} if self.cluster else {})

    def describe(self) -> str:
        scheme = "clickhouses" if self.url.secure else "clickhouse"
        return f"{scheme}://{self.url.user}@{self.url.host}:{self.url.port}/{self.database}"

    def _new_client(self, database: str):
        from clickhouse_driver import Client

        return Client(
            host=self.url.host,
            port=self.url.port,
            user=self.url.user,
            password=self.url.password,
            database=database,
            secure=self.url.secure,
            connect_timeout=self.url.connect_timeout,
            send_receive_timeout=self.url.send_receive_timeout,
            sync_request_timeout=self.url.connect_timeout,
            compression="lz4",
            client_name="tracedash",
            settings={"server_side_params": True},
        )

    def _open(self):
        """A new client (it connects on its first call), once the database exists."""
        if not self._database_ready:
            with self._lock:
                if not self._database_ready:
                    bootstrap = self._new_client("default")
                    try:
                        # On a cluster every node needs the database before ON CLUSTER DDL runs there.
                        on_cluster = f" ON CLUSTER `{self.cluster}`" if self.cluster else ""
                        self._execute(bootstrap, f"CREATE DATABASE IF NOT EXISTS `{self.database}`{on_cluster}", None,
                                      "store.bootstrap")
                    finally:
                        bootstrap.disconnect()
                    self._database_ready = True
        return self._new_client(self.database)

    def _execute(self, client, sql, params, tag, extra_settings=None, **kwargs):
        from clickhouse_driver import errors as ch_errors

        settings = {"log_comment": tag, **SESSION_SETTINGS, **self._cluster_settings, **(extra_settings or {})}
        where = f"{self.url.host}:{self.url.port}"
        try:
            return client.execute(sql, params, settings=settings, **kwargs)
        except TimeoutError as exc:  # socket.timeout while the query ran (connect timeouts come as NetworkError)
            client.disconnect()
            raise StoreTimeout(f"ClickHouse at {where} did not answer within {self.url.send_receive_timeout:g} s "
                               "(send_receive_timeout of the ClickHouse URL)", tag=tag) from exc
        except (ch_errors.NetworkError, ch_errors.SocketTimeoutError, EOFError, OSError) as exc:
            client.disconnect()
            raise StoreUnavailable(f"ClickHouse at {where} is unreachable: {exc}", tag=tag) from exc
        except ch_errors.Error as exc:
            code = getattr(exc, "code", None)
            text = _server_message(exc)
            if code in _AUTH_CODES:
                client.disconnect()
                raise StoreAuthError(f"ClickHouse at {where} refused the login of user {self.url.user!r} ({text}): "
                                     "check the user and password of the ClickHouse URL", tag=tag, code=code) from exc
            raise query_error(text, tag=tag, code=code) from exc

    def _call(self, sql, params, tag, **kwargs):
        # Reads and DDL: one bounded retry, on network errors only (a server restart drops idle
        # connections). Not on a timeout (resending a slow query doubles the wait), a busy server
        # nor a refused login. Inserts never come through here: they are not resent blindly.
        with self._pool.lent() as client:
            try:
                return self._execute(client, sql, params, tag, **kwargs)
            except (StoreTimeout, StoreAuthError, StoreBusy):
                raise
            except StoreUnavailable:  # the client disconnected itself; it connects again for this
                return self._execute(client, sql, params, tag, **kwargs)

    def query(self, sql: str, params: dict | None, tag: str) -> Result:
        rows, meta = self._call(sql, params or {}, tag, with_column_types=True)
        types = [t for _, t in meta]
        return Result([n for n, _ in meta], types, _convert_rows(rows, types, from_text=False))

    def command(self, sql: str, params: dict | None, tag: str) -> None:
        self._call(sql, params or None, tag)

    def query_arrow(self, sql: str, params: dict | None, tag: str):
        """A read as a ``pyarrow.Table``, built from the driver's columns (numbers and strings; a
        column of another type comes as Arrow infers it from the driver's Python values)."""
        import pyarrow as pa

        columns, meta = self._call(sql, params or {}, tag, with_column_types=True, columnar=True)
        if not meta:
            return pa.table({})
        arrays = []
        for (name, ch_type), values in zip(meta, columns or [[] for _ in meta]):
            scalar = _ARROW_SCALARS.get(_unwrap(ch_type))
            arrays.append(pa.array(list(values), type=getattr(pa, scalar)() if scalar else None))
        return pa.Table.from_arrays(arrays, names=[name for name, _ in meta])

    def insert(self, table: str, columns: Sequence[str], types: Sequence[str], rows: Sequence[dict], tag: str,
               dedup_token: str | None = None, *, stamp: str | None = None, stored=None) -> None:
        # ``stamp`` and ``stored``: the embedded store's alone (EmbeddedBackend.insert); a server is
        # written by other processes too, and stamps ``ingested_at`` itself.
        data = []
        for name, ch_type in zip(columns, types):
            values = python_values(column_values(rows, name))
            scale = _datetime_scale(ch_type)
            inner = _array_inner(ch_type)
            if scale is not None:
                divisor = 10 ** (9 - scale)
                values = [None if v is None else int(v) // divisor for v in values]
            elif inner is not None and _datetime_scale(inner) is not None:
                divisor = 10 ** (9 - _datetime_scale(inner))
                values = [[int(x) // divisor for x in v] for v in values]
            data.append(values)
        column_list = ", ".join(f"`{c}`" for c in columns)
        sql = f"{tag_comment(tag)}INSERT INTO {table} ({column_list}) VALUES"
        settings = {"insert_deduplication_token": dedup_token} if dedup_token else None
        with self._pool.lent() as client:
            self._execute(client, sql, data, tag, columnar=True, types_check=False, extra_settings=settings)

    def close(self, timeout: float = 60.0) -> bool:
        """Disconnect the idle clients (one lent to a call running now goes back to the pool when
        that call returns)."""
        for client in self._pool.drain():
            _close_quietly(client)
        return True


# UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD (old servers), AUTHENTICATION_FAILED (since 21.x)
_AUTH_CODES = frozenset({192, 193, 194, 516})


def _server_message(exc) -> str:
    """A driver error's text without the server's C++ stack trace (clickhouse-driver appends it
    after ". Stack trace:"): ``Code: N. DB::Exception: what went wrong``."""
    text = str(exc).strip()
    head, sep, _ = text.partition(". Stack trace:")
    return " ".join((head + "." if sep else head).split())


_TAG_SAFE = re.compile(r"[^A-Za-z0-9_.:\-]")


def tag_comment(tag: str) -> str:
    """A leading comment naming the code, so ``system.query_log`` leads back to it."""
    return f"/* tracedash:{_TAG_SAFE.sub('_', tag)} */ "
