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
from .schema import TABLES

log = logging.getLogger("tracedash.store")

SLOW_QUERY_SECONDS = 1.0
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class Store:
    def __init__(self, backend):
        self.backend = backend

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
        _log_slow(tag, started)
        return result

    def command(self, sql: str, params: Mapping | None = None, *, tag: str) -> None:
        """Run a statement that returns nothing (DDL, ALTER, TRUNCATE)."""
        started = time.perf_counter()
        self.backend.command(tag_comment(tag) + sql, dict(params) if params else None, tag)
        _log_slow(tag, started)

    def insert(self, table: str, rows: Sequence[Mapping], *, tag: str, dedup_token: str | None = None) -> int:
        """Insert many rows in one statement. ``rows`` are mappings holding every insert column of
        the table; DateTime64 values are integer nanoseconds since the epoch. A ``dedup_token``
        (letters, digits, - and _) makes ClickHouse store a re-sent batch once."""
        if dedup_token is not None and not _TOKEN.match(dedup_token):
            raise StoreError(f"bad dedup token {dedup_token!r}", tag=tag)
        if not rows:
            return 0
        spec = TABLES.get(table)
        if spec is None:
            raise StoreError(f"unknown table {table!r}; known: {', '.join(TABLES)}", tag=tag)
        columns = spec.insert_columns
        started = time.perf_counter()
        try:
            self.backend.insert(table, [c.name for c in columns], [c.type for c in columns], rows, tag, dedup_token)
        except KeyError as exc:
            raise StoreError(f"row for {table} lacks column {exc.args[0]!r}", tag=tag) from exc
        _log_slow(tag, started)
        return len(rows)

    def ping(self) -> None:
        self.query("SELECT 1", tag="store.ping")

    def close(self) -> None:
        self.backend.close()


def _log_slow(tag: str, started: float) -> None:
    elapsed = time.perf_counter() - started
    if elapsed > SLOW_QUERY_SECONDS:
        log.warning("slow ClickHouse query %s took %.2fs", tag, elapsed)


def store_from_settings(database: str | None = None) -> Store:
    from django.conf import settings

    url = settings.TRACEDASH_CLICKHOUSE
    database = database or settings.TRACEDASH_CLICKHOUSE_DATABASE
    if url is None:
        return Store(EmbeddedBackend(settings.TRACEDASH_CLICKHOUSE_PATH, database))
    return Store(NativeBackend(url, database))


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
