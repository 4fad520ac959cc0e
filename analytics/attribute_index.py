"""The attribute index: the keys a project groups by, and which value each trace carries.

Grouping a chart by an attribute, the Variants view and grouped latency rules assign each trace of
a window to the value of a key: the value on its earliest span carrying the key (analytics.grouping).
Without an index that read scans every span of the window lying in a granule that holds the key
(``spans.dims``); over a week of 10 M spans it was most of the query. With one, it reads that
key's rows of ``span_key_values`` in the window: one per trace and value.

- **Declared on first use.** ``key_declare`` records a key for a project (``dim_keys``) the first
  time a grouped chart, the Variants view or a grouped rule asks for it, up to ``MAX_KEYS`` keys
  per project (the others are read by the scan, with the same results). ``key_remove`` stops
  indexing a key and deletes its rows.
- **Indexed by the summariser.** Each run looks up the project's declared keys and, after writing
  the summaries of a batch of traces, writes each value of each key a trace carries, with the
  start of the first span carrying it (``traces_index_sql``), from the same spans. An index row is
  as fresh as the trace's summary, which the grouped reads join it to anyway. A project that declared no key pays one small read
  per run that had work (none on the embedded store, where the declared keys are known in memory
  until the table is written: ``KnownKeys``).
- **Backfilled once.** ``index_backfill`` (the beat entry ``attribute-index``, task
  analytics.tasks.index_attributes) indexes the spans stored before, a day at a time, then marks
  the key ``ready``. It waits ``BACKFILL_DELAY_SECONDS`` after the declaration, longer than a
  summariser run and the overlap it re-reads (config.settings), so every span the summariser read
  without knowing of the key is stored by then and read by the backfill.
- **Read only when complete.** The assignment (grouping.trace_value_sql) reads the index when the
  key is ready and not removed, and scans the spans otherwise: one statement decides, so a read
  never sees a half-built index. A trace indexed twice (summarised again, or summarised while the
  backfill ran) changes nothing: each trace takes the value that starts first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from store import get_store
from store.client import writes_table
from store.errors import StoreError

log = logging.getLogger("tracedash.attribute_index")

MAX_KEYS = 20  # declared keys per project
MAX_KEY = 256  # characters of a key (as grouping.MAX_KEY)
BACKFILL_DELAY_SECONDS = 30.0
# How long a process trusts that a key it saw declared still is (key_declare is called on every
# grouped read; a key removed meanwhile is only read by the scan until then, with the same results).
KNOWN_SECONDS = 60.0

_known: dict[tuple[int, str], float] = {}
_known_lock = threading.Lock()


@dataclass(frozen=True)
class IndexedKey:
    key: str
    declared_at: datetime
    ready: bool


@dataclass
class IndexReport:
    projects: int = 0
    keys: int = 0  # keys backfilled and marked ready
    rows: int = 0  # rows the backfills wrote (one per trace, value and day)
    seconds: float = 0.0
    backfilled: list[tuple[int, str]] = field(default_factory=list)


def ready_sql(key: str) -> str:
    """A scalar subquery, 1 when the project's key ``key`` (SQL: a parameter or a literal) is indexed
    and backfilled, else 0: the guard of a read's two branches (the index, the span scan), which
    ClickHouse evaluates first, so the branch whose guard is false reads no granule."""
    return (f"(SELECT count() FROM dim_keys FINAL WHERE project_id = {{project_id:UInt64}}"
            f" AND key = {key} AND ready = 1 AND removed = 0)")


def _ns(when: datetime) -> int:
    """``dim_keys.declared_at`` (read back naive, UTC, ms) as the unix ns the store writes."""
    return int(when.replace(tzinfo=timezone.utc).timestamp() * 1000) * 1_000_000


_LATEST_SQL = ("SELECT key, declared_at, ready, removed, version FROM dim_keys FINAL"
               " WHERE project_id = {project_id:UInt64} ORDER BY key")
_WRITES = writes_table("dim_keys")


class KnownKeys:
    """Each project's ``dim_keys`` rows as ``_latest`` reads them, read once and read again after any
    write of the table (a write listener of the embedded store, which this process alone writes):
    the summariser asks for the declared keys on every run (every 2 s), a FINAL read of ~2 ms of
    CPU, and they change when a key is declared, backfilled or removed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows: dict[int, list[dict]] = {}
        self._generation = 0

    def get(self, store, project_id: int) -> list[dict]:
        with self._lock:
            rows = self._rows.get(project_id)
            generation = self._generation
        if rows is None:
            rows = _read_latest(store, project_id)
            with self._lock:
                if generation == self._generation:  # no write ended meanwhile: what was read still holds
                    self._rows[project_id] = rows
        return [dict(r) for r in rows]

    def on_insert(self, table: str, rows, tag: str) -> None:
        if table == "dim_keys":
            self.reset()

    def on_insert_failed(self, table: str, tag: str) -> None:
        if table == "dim_keys":
            self.reset()

    def on_command(self, sql: str, tag: str) -> None:
        if _WRITES.search(sql):
            self.reset()

    on_command_start = on_command_failed = on_command

    def reset(self) -> None:
        with self._lock:
            self._rows.clear()
            self._generation += 1


def _read_latest(store, project_id: int) -> list[dict]:
    return store.query(_LATEST_SQL, {"project_id": int(project_id)}, tag="analytics.attribute_index.latest").dicts()


def _latest(project_id: int, key: str | None = None) -> list[dict]:
    """The project's keys (``key``: that one alone), the latest row of each; from memory on the
    embedded store (``KnownKeys``)."""
    store = get_store()
    known = store.write_listener("analytics.attribute_index", KnownKeys) if store.kind == "embedded" else None
    rows = known.get(store, int(project_id)) if known is not None else _read_latest(store, project_id)
    return rows if key is None else [r for r in rows if r["key"] == key]


def _write(project_id: int, key: str, *, declared_at_ns: int, ready: int, removed: int, version: int) -> None:
    get_store().insert("dim_keys", [{"project_id": int(project_id), "key": key, "declared_at": declared_at_ns,
                                     "ready": ready, "removed": removed, "version": version}],
                       tag="analytics.attribute_index.write")


def indexed_keys(*, project_id: int) -> list[IndexedKey]:
    """The project's declared keys (not removed), by key."""
    return [IndexedKey(r["key"], r["declared_at"].replace(tzinfo=timezone.utc), bool(r["ready"]))
            for r in _latest(project_id) if not r["removed"]]


def key_declare(*, project_id: int, key: str) -> bool:
    """Index ``key`` for the project from now on (idempotent; cheap when this process saw it
    declared within ``KNOWN_SECONDS``). False when the project already has ``MAX_KEYS`` keys, the
    key is not one that groups (empty, too long) or the store refused the declaration (a read-only
    user, say: logged): its reads keep scanning the spans."""
    if not key or len(key) > MAX_KEY:
        return False
    now = time.monotonic()
    with _known_lock:
        if _known.get((project_id, key), 0.0) > now:
            return True
    try:
        return key_add(project_id=project_id, key=key)
    except StoreError as exc:  # the read that asked goes on by the scan; the next one declares
        log.warning("project %s: attribute key %r not declared: %s", project_id, key, exc)
        return False


def key_add(*, project_id: int, key: str) -> bool:
    """Declare ``key`` (a key that groups: 1 to MAX_KEY characters) unless it is declared already:
    what ``key_declare`` does, for a caller that reports the store's errors (StoreError is raised:
    the settings page). False when the project already has ``MAX_KEYS`` other keys."""
    active = [r for r in _latest(project_id) if not r["removed"]]
    if not any(r["key"] == key for r in active):
        if len(active) >= MAX_KEYS:
            return False
        stamp = time.time_ns()
        _write(project_id, key, declared_at_ns=stamp, ready=0, removed=0, version=stamp)
        log.info("project %s: attribute key %r declared for the index", project_id, key)
    with _known_lock:
        _known[(project_id, key)] = time.monotonic() + KNOWN_SECONDS
    return True


def key_remove(*, project_id: int, key: str) -> bool:
    """Stop indexing ``key`` and delete its rows; reads scan the spans again. False if it was not declared."""
    rows = [r for r in _latest(project_id, key) if not r["removed"]]
    if not rows:
        return False
    _write(project_id, key, declared_at_ns=_ns(rows[0]["declared_at"]), ready=0, removed=1, version=time.time_ns())
    store = get_store()
    store.command(f"DELETE FROM {store.ddl_target('span_key_values')} WHERE project_id = {{project_id:UInt64}}"
                  " AND key = {key:String}", {"project_id": int(project_id), "key": key},
                  tag="analytics.attribute_index.remove")
    with _known_lock:
        _known.pop((project_id, key), None)
    return True


def forget_known() -> None:
    """Drop this process's memory of declared keys (tests; a store that was emptied)."""
    with _known_lock:
        _known.clear()


_PENDING = """SELECT project_id, key, declared_at, version FROM dim_keys FINAL
WHERE project_id IN {project_ids:Array(UInt64)} AND ready = 0 AND removed = 0
  AND declared_at <= now64(3) - toIntervalMillisecond({delay_ms:UInt64})
ORDER BY project_id, key"""


def traces_index_sql(*, trace_filter: str, span_filter: str) -> str:
    """``INSERT INTO span_key_values … SELECT``: for each trace ``trace_filter`` selects (a condition
    on ``trace_id``), from its spans ``span_filter`` selects (a bound on ``start_time``), one row
    per declared key and value it carries (parameter ``keys``: a JSON array) with the start of its
    first span carrying that value. The granules without any of the keys are skipped (the bloom
    filter on ``dims`` keys, migration 0021). Parameters: ``project_id``, ``keys`` and what the
    filters name."""
    return f"""INSERT INTO span_key_values (project_id, key, trace_id, value, start_time)
SELECT project_id, key, trace_id, dims[key] AS value, min(start_time)
FROM spans ARRAY JOIN arrayFilter(k -> has(JSONExtract({{keys:String}}, 'Array(String)'), k), mapKeys(dims)) AS key
WHERE project_id = {{project_id:UInt64}} AND ({trace_filter}) AND ({span_filter})
  AND hasAny(mapKeys(dims), JSONExtract({{keys:String}}, 'Array(String)'))
GROUP BY project_id, key, trace_id, value"""


def keys_json(keys: list[str]) -> str:
    return json.dumps(list(keys))


def declared_keys(*, project_id: int) -> list[str]:
    """The keys the summariser indexes for the project: declared and not removed (ready or not)."""
    return [k.key for k in indexed_keys(project_id=project_id)]


# A day of the project's stored spans (a backfill's step: its memory is one day's traces).
_BACKFILL = traces_index_sql(trace_filter="1", span_filter=(
    "start_time >= fromUnixTimestamp64Nano({day_ns:Int64}) AND start_time < fromUnixTimestamp64Nano({day_ns:Int64} + 86400000000000)"))
_DAYS = """SELECT toUInt32(toDate(min(start_time))) AS first, toUInt32(toDate(max(start_time))) AS last, count() AS n
FROM spans WHERE project_id = {project_id:UInt64}"""  # days since 1970-01-01


def _backfill(params: dict) -> None:
    """Index one key (``params``: project_id, key) over every stored span, a day at a time."""
    store = get_store()
    params = {**params, "keys": keys_json([params["key"]])}
    first, last, n = store.query(_DAYS, params, tag="analytics.attribute_index.days").rows[0]
    if not n:
        return
    for day in range(int(first), int(last) + 1):
        store.command(_BACKFILL, {**params, "day_ns": day * 86400 * 1_000_000_000},
                      tag="analytics.attribute_index.backfill")


def index_backfill(*, project_ids: list[int], delay_seconds: float = BACKFILL_DELAY_SECONDS) -> IndexReport:
    """Backfill each key declared at least ``delay_seconds`` ago and not yet ready, then mark it
    ready. The mark's version is the declaration's + 1, so a removal made meanwhile (a later
    version) still wins. A run that stopped half-way runs again (copies are harmless)."""
    report = IndexReport()
    if not project_ids:
        return report
    started = time.perf_counter()
    store = get_store()
    pending = store.query(_PENDING, {"project_ids": [int(p) for p in project_ids],
                                     "delay_ms": int(delay_seconds * 1000)},
                          tag="analytics.attribute_index.pending").dicts()
    report.projects = len({r["project_id"] for r in pending})
    for r in pending:
        params = {"project_id": int(r["project_id"]), "key": r["key"]}
        before = _rows(params)
        _backfill(params)
        report.rows += _rows(params) - before
        _write(r["project_id"], r["key"], declared_at_ns=_ns(r["declared_at"]), ready=1, removed=0,
               version=int(r["version"]) + 1)
        report.keys += 1
        report.backfilled.append((int(r["project_id"]), r["key"]))
        log.info("project %s: attribute key %r indexed", r["project_id"], r["key"])
    report.seconds = time.perf_counter() - started
    return report


def _rows(params: dict) -> int:
    return int(get_store().query("SELECT count() FROM span_key_values WHERE project_id = {project_id:UInt64}"
                                 " AND key = {key:String}", params, tag="analytics.attribute_index.count").scalar())
