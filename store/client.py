"""The one place every ClickHouse query goes through.

``get_store()`` gives the process's ``Store``, built lazily from settings on first use (so a
command that never touches ClickHouse never opens the embedded data directory). Every call
names the code that runs it (``tag``); the tag is written as a leading comment into the SQL text
(and as ``log_comment`` on a server), so ``system.query_log`` leads back to the caller.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Mapping, Sequence

from .backends import EmbeddedBackend, NativeBackend, Result, tag_comment
from .errors import StoreError
from .schema import TABLES, ddl_target

log = logging.getLogger("tracedash.store")

SLOW_READ_MS = 1000  # TRACEDASH_SLOW_QUERY_MS: a read (SELECT) slower than this is logged
SLOW_WRITE_MS = 5000  # TRACEDASH_SLOW_WRITE_MS: inserts, DDL, OPTIMIZE/ALTER (merges) are judged separately
SLOW_LOG_WINDOW = 60.0  # seconds: at most one line per caller tag in this long
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
ARRIVAL_COLUMN, ARRIVAL_DEFAULT = "ingested_at", "now64(3)"  # a row's arrival, stamped at insert


def writes_table(table: str) -> re.Pattern:
    """A statement that writes ``table`` (or its ``_local`` table on a cluster) other than by
    ``Store.insert``: what a write listener keeping state derived from ``table`` must start over on."""
    return re.compile(r"\b(INSERT\s+INTO|TRUNCATE\s+TABLE(\s+IF\s+EXISTS)?|ALTER\s+TABLE|DELETE\s+FROM|"
                      r"DROP\s+TABLE(\s+IF\s+EXISTS)?|OPTIMIZE\s+TABLE|EXCHANGE\s+TABLES|RENAME\s+TABLE)\s+`?"
                      + table + r"(_local)?`?(\s|\(|$|;)", re.IGNORECASE)


class SlowQueryLog:
    """Logs queries slower than their threshold, at most one line per caller tag and minute.

    The first slow call of a tag is logged at once; further ones within ``window`` seconds are
    counted, and the next slow call after the window (or ``flush()``, e.g. at close) writes one
    line: "N slow ClickHouse reads from <tag> in the last minute, max X ms". Lines are INFO; a
    call over ten times its threshold makes the line a WARNING. A threshold of 0 turns the kind off.
    """

    def __init__(self, *, read_ms: float = SLOW_READ_MS, write_ms: float = SLOW_WRITE_MS,
                 window: float = SLOW_LOG_WINDOW, clock=time.monotonic, logger: logging.Logger = log):
        self.read_ms, self.write_ms, self.window = read_ms, write_ms, window
        self.clock, self.log = clock, logger
        self._lock = threading.Lock()
        self._last_line: dict[tuple[str, str], float] = {}  # (kind, tag) -> when its last line was written
        self._pending: dict[tuple[str, str], list] = {}  # (kind, tag) -> [count, max ms] not yet written

    def threshold(self, kind: str) -> float:
        return self.read_ms if kind == "read" else self.write_ms

    def record(self, kind: str, tag: str, elapsed_ms: float) -> None:
        threshold = self.threshold(kind)
        if not threshold or elapsed_ms < threshold:
            return
        now = self.clock()
        lines = []
        with self._lock:
            lines += self._due(now)
            key = (kind, tag)
            last = self._last_line.get(key)
            if last is None or now - last >= self.window:
                self._last_line[key] = now
                lines.append((kind, tag, 1, elapsed_ms, False))
            else:
                pending = self._pending.setdefault(key, [0, 0.0])
                pending[0] += 1
                pending[1] = max(pending[1], elapsed_ms)
        self._write(lines)

    def flush(self) -> None:
        """Write every counted-but-unwritten summary now."""
        with self._lock:
            lines = [(kind, tag, count, worst, True) for (kind, tag), (count, worst) in self._pending.items()]
            self._pending.clear()
        self._write(lines)

    def _due(self, now: float) -> list:
        due = [key for key in self._pending if now - self._last_line[key] >= self.window]
        lines = []
        for key in due:
            count, worst = self._pending.pop(key)
            self._last_line[key] = now
            lines.append((*key, count, worst, True))
        return lines

    def _write(self, lines: list) -> None:
        for kind, tag, count, worst, summary in lines:
            threshold = self.threshold(kind)
            level = logging.WARNING if worst >= 10 * threshold else logging.INFO
            noun = "read" if kind == "read" else "write"
            if summary:
                self.log.log(level, "%d slow ClickHouse %ss from %s in the last minute, max %.0f ms (threshold %.0f ms)",
                             count, noun, tag, worst, threshold)
            else:
                self.log.log(level, "slow ClickHouse %s from %s took %.0f ms (threshold %.0f ms; more from this "
                             "caller are summed up once a minute)", noun, tag, worst, threshold)


class Store:
    def __init__(self, backend, *, slow_log: SlowQueryLog | None = None, cluster: str | None = None):
        self.backend = backend
        self.slow_log = slow_log or SlowQueryLog()
        # TRACEDASH_CLICKHOUSE_CLUSTER: the canonical table names are then Distributed tables over
        # ``<name>_local`` (store.schema); reads and inserts use the canonical names unchanged.
        self.cluster = cluster or None
        self._write_listeners: list = []
        self._listeners_by_key: dict[str, object] = {}
        self._listeners_lock = threading.Lock()

    def add_write_listener(self, listener) -> None:
        """Tell ``listener`` of every write: ``on_insert(table, rows, tag)`` after an ``insert``
        that succeeded, ``on_insert_failed(table, tag)`` after one that raised (its rows may be
        stored all the same), ``on_command(sql, tag)`` after a ``command`` that succeeded and
        ``on_command_failed(sql, tag)`` after one that raised (the statement as the caller wrote
        it). A listener keeps state derived from the tables (analytics.trace_presence); one that
        fails is told to ``reset()``, and the write's outcome stands. Optional, where the listener
        has them: ``on_command_start(sql, tag)`` before a ``command`` runs, and, on the embedded
        store, ``on_stored(table, arrow, stamp_ms, tag)`` while an insert still counts as running
        (``EmbeddedBackend.insert``): its rows as the Arrow table they were stored from and the
        ``ingested_at`` they got, or ``None`` when it raised (analytics.fresh_spans)."""
        self._write_listeners.append(listener)

    def write_listener(self, key: str, make):
        """The write listener registered under ``key``, made by ``make()`` and added
        (``add_write_listener``) on first use: state a package derives from this store's tables
        and keeps once per store (analytics.trace_presence, analytics.fresh_spans)."""
        with self._listeners_lock:
            listener = self._listeners_by_key.get(key)
            if listener is None:
                listener = self._listeners_by_key[key] = make()
                self.add_write_listener(listener)
            return listener

    def _tell(self, method: str, *args) -> None:
        for listener in self._write_listeners:
            call = getattr(listener, method, None)
            if call is None:
                continue
            try:
                call(*args)
            except Exception:  # noqa: BLE001 - the write succeeded; the listener starts over
                log.exception("store write listener %r failed on %s", listener, method)
                listener.reset()

    def ddl_target(self, table: str) -> str:
        """What an ALTER, OPTIMIZE, mutation or lightweight DELETE of ``table`` must name: its
        ``_local`` table ON CLUSTER on a cluster (a Distributed table holds no rows), else itself."""
        return ddl_target(table, self.cluster)

    @property
    def database(self) -> str:
        return self.backend.database

    @property
    def kind(self) -> str:
        return self.backend.name

    def describe(self) -> str:
        return self.backend.describe()

    def query(self, sql: str, params: Mapping | None = None, *, tag: str) -> Result:
        """Run a read; ``params`` fill ``{name:Type}`` placeholders on the server side."""
        started = time.perf_counter()
        result = self.backend.query(tag_comment(tag) + sql, dict(params) if params else None, tag)
        self._timed("read", tag, started)
        return result

    def query_arrow(self, sql: str, params: Mapping | None = None, *, tag: str):
        """Run a read and return its columns as a ``pyarrow.Table`` (for columnar work in numpy:
        no row passes through Python objects on the embedded store)."""
        started = time.perf_counter()
        result = self.backend.query_arrow(tag_comment(tag) + sql, dict(params) if params else None, tag)
        self._timed("read", tag, started)
        return result

    def command(self, sql: str, params: Mapping | None = None, *, tag: str) -> None:
        """Run a statement that returns nothing (DDL, ALTER, TRUNCATE)."""
        started = time.perf_counter()
        if self._write_listeners:
            self._tell("on_command_start", sql, tag)
        try:
            self.backend.command(tag_comment(tag) + sql, dict(params) if params else None, tag)
        except BaseException:
            if self._write_listeners:  # it may have written part of its rows all the same
                self._tell("on_command_failed", sql, tag)
            raise
        self._timed("write", tag, started)
        if self._write_listeners:
            self._tell("on_command", sql, tag)

    def insert(self, table: str, rows: Sequence[Mapping], *, tag: str, dedup_token: str | None = None,
               defaulted: Sequence[str] = ()) -> int:
        """Insert many rows in one statement. ``rows`` are mappings holding every insert column of
        the table (and the columns with a DEFAULT named in ``defaulted``), or ``store.Columns``
        holding those columns (lists or numpy arrays); DateTime64 values are
        integer nanoseconds since the epoch. A ``dedup_token`` (letters, digits, - and _) makes
        ClickHouse store a re-sent batch once."""
        if dedup_token is not None and not _TOKEN.match(dedup_token):
            raise StoreError(f"bad dedup token {dedup_token!r}", tag=tag)
        if not rows:
            return 0
        spec = TABLES.get(table)
        if spec is None:
            raise StoreError(f"unknown table {table!r}; known: {', '.join(TABLES)}", tag=tag)
        columns = spec.insert_columns + tuple(c for c in spec.columns if c.default and c.name in defaulted)
        # The arrival stamp (``ingested_at``): the embedded store fills it itself and tells the
        # listeners which value it got (a server stamps it, and is written by other processes too).
        stamp = next((c.name for c in spec.columns if c.name == ARRIVAL_COLUMN and c.default == ARRIVAL_DEFAULT
                      and c not in columns), None)
        stored = None
        if stamp is not None:
            # Always passed, and the listeners looked up when it is called: a listener added while
            # this insert runs learns of it (analytics.fresh_spans serves the stamps after its start).
            def stored(arrow, stamp_ms):
                if self._write_listeners:
                    self._tell("on_stored", table, arrow, stamp_ms, tag)
        started = time.perf_counter()
        try:
            self.backend.insert(table, [c.name for c in columns], [c.type for c in columns], rows, tag, dedup_token,
                                stamp=stamp, stored=stored)
        except KeyError as exc:
            raise StoreError(f"row for {table} lacks column {exc.args[0]!r}", tag=tag) from exc
        except BaseException:
            if self._write_listeners:  # it may have been stored all the same (a timeout after the write)
                self._tell("on_insert_failed", table, tag)
            raise
        self._timed("write", tag, started)
        if self._write_listeners:
            self._tell("on_insert", table, rows, tag)
        return len(rows)

    def settled_until_ms(self, table: str) -> int | None:
        """Unix ms (ClickHouse's clock) before which every row of ``table`` with an ``ingested_at``
        below it is already visible, where the store can tell (embedded: this process makes every
        insert); None where it cannot (a server: other processes insert too), and a reader of
        ``ingested_at`` ranges re-reads an overlap instead."""
        settled = getattr(self.backend, "settled_until_ns", None)
        return None if settled is None else settled(table) // 1_000_000

    def release_memory(self) -> bool:
        """Return the memory the embedded ClickHouse freed to the system (EmbeddedBackend.release_memory);
        False where there is nothing to do (a server manages its own memory)."""
        release = getattr(self.backend, "release_memory", None)
        return bool(release and release())

    def ping(self) -> None:
        self.query("SELECT 1", tag="store.ping")

    def _timed(self, kind: str, tag: str, started: float) -> None:
        self.slow_log.record(kind, tag, (time.perf_counter() - started) * 1000)

    def close(self, timeout: float = 60.0) -> bool:
        """Close the backend's connections (the embedded one waits up to ``timeout`` seconds for
        calls still running, and refuses new ones). True when it closed cleanly."""
        self.slow_log.flush()
        return self.backend.close(timeout) is not False


def store_from_settings(database: str | None = None) -> Store:
    from django.conf import settings

    url = settings.TRACEDASH_CLICKHOUSE
    database = database or settings.TRACEDASH_CLICKHOUSE_DATABASE
    env = getattr(settings, "ENV", None)
    slow_log = SlowQueryLog(read_ms=getattr(env, "slow_query_ms", SLOW_READ_MS),
                            write_ms=getattr(env, "slow_write_ms", SLOW_WRITE_MS))
    cluster = getattr(settings, "TRACEDASH_CLICKHOUSE_CLUSTER", None) or None
    if url is None:
        backend = EmbeddedBackend(settings.TRACEDASH_CLICKHOUSE_PATH, database,
                                  merge_nice=getattr(env, "background_nice", 0))
        return Store(backend, slow_log=slow_log, cluster=cluster)
    return Store(NativeBackend(url, database, cluster=cluster), slow_log=slow_log, cluster=cluster)


_store: Store | None = None
_store_lock = threading.Lock()


def get_store() -> Store:
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                _store = store_from_settings()
    return _store


def set_store(store: Store | None) -> Store | None:
    """Replace the process's store (tests point it at their own database); returns the old one."""
    global _store
    with _store_lock:
        previous, _store = _store, store
    return previous
