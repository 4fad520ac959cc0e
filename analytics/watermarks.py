"""The periodic tasks' watermarks (``task_watermarks``: where a job got to for a project), known in
memory where the store is this process's alone.

Every run of the summariser (every 2 s) and of the rollups (every 10 s) reads its watermarks and
writes the new ones: small statements, ~5 ms of CPU each on chdb, paid per run whatever the traffic.
On the embedded store every write goes through this process's ``Store``, so a write listener sees
each watermark written and the reads can come from memory: a value is read from the store once,
then kept up to date from every insert into ``task_watermarks`` (``ReplacingMergeTree(value)``: the
highest value of a key is the one that counts, as ``max(value)`` reads it). Anything else that
writes the table (a ``TRUNCATE``, an ``ALTER … DELETE``), or an insert that raised, makes it forget
everything and read again. The writes still go to the store: pages read the rollups' watermark in
SQL, and a restart starts from what is stored. The summariser's own watermark, which nothing reads in
SQL, is stored at most every ``STORE_EVERY_MS`` of its progress (``advance``): in between, it moves
in memory alone, and a restart (or anything that makes the memory forget) starts from the value
stored, at most that much earlier, and summarises those traces again (the same figures, a newer
version).

A ClickHouse server is written by other processes too (Celery workers): there every read goes to
the store (``known_for`` returns None).
"""

from __future__ import annotations

import threading

from store.client import writes_table

TABLE = "task_watermarks"
_WRITES = writes_table(TABLE)

STORE_EVERY_MS = 10_000  # ``advance``: a watermark this far past the value stored is stored again

READ_SQL = "SELECT max(value) FROM task_watermarks WHERE project_id = {project_id:UInt64} AND job = {job:String}"


class KnownWatermarks:
    """The highest stored value of each (project, job) read once or written since (a write listener)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._max: dict[tuple[int, str], int] = {}  # the highest value written (or read) per key
        self._known: set[tuple[int, str]] = set()  # keys whose stored value has been read since the last reset
        self._stored: dict[tuple[int, str], int] = {}  # the highest value known to be stored per key
        self._generation = 0

    def get(self, store, project_id: int, job: str, tag: str) -> int:
        key = (int(project_id), job)
        with self._lock:
            if key in self._known:
                return self._max.get(key, 0)
            generation = self._generation
        stored = int(store.query(READ_SQL, {"project_id": project_id, "job": job}, tag=tag).scalar() or 0)
        with self._lock:
            # An insert that ended while the read ran is in _max already (on_insert): keep the higher.
            value = max(stored, self._max.get(key, 0))
            if generation == self._generation:  # no reset meanwhile: what was read still holds
                self._max[key] = value
                self._stored[key] = max(stored, self._stored.get(key, 0))
                self._known.add(key)
        return value

    def advance(self, project_id: int, job: str, value: int, every_ms: int = STORE_EVERY_MS) -> bool:
        """Move a watermark to ``value`` in memory alone, where the value stored is known and less
        than ``every_ms`` behind; False: the caller stores it (an insert, which this then follows)."""
        key = (int(project_id), job)
        with self._lock:
            if key not in self._known or int(value) - self._stored.get(key, 0) >= every_ms:
                return False
            self._max[key] = max(self._max.get(key, 0), int(value))
            return True

    def on_insert(self, table: str, rows, tag: str) -> None:
        if table != TABLE:
            return
        if not isinstance(rows, (list, tuple)):  # columns (store.Columns): not read here, read the store again
            self.reset()
            return
        with self._lock:
            for row in rows:
                key = (int(row["project_id"]), row["job"])
                self._max[key] = max(self._max.get(key, 0), int(row["value"]))
                self._stored[key] = max(self._stored.get(key, 0), int(row["value"]))

    def on_insert_failed(self, table: str, tag: str) -> None:
        if table == TABLE:
            self.reset()

    def on_command_start(self, sql: str, tag: str) -> None:
        if _WRITES.search(sql):
            self.reset()

    def on_command(self, sql: str, tag: str) -> None:
        if _WRITES.search(sql):
            self.reset()

    def on_command_failed(self, sql: str, tag: str) -> None:
        if _WRITES.search(sql):
            self.reset()

    def reset(self) -> None:
        with self._lock:
            self._max.clear()
            self._stored.clear()
            self._known.clear()
            self._generation += 1


def known_for(store) -> KnownWatermarks | None:
    """The store's KnownWatermarks (registered as its write listener on first use); None where the
    store is written by other processes too (a server)."""
    if store.kind != "embedded":
        return None
    return store.write_listener("analytics.watermarks", KnownWatermarks)
