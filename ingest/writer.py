"""Group commit: every ingest request hands its rows to one writer thread, which turns whatever
has queued up meanwhile into one insert per table. A request is answered once its rows are in
ClickHouse, or, when ClickHouse cannot take them, in the fsync'd spool (``ingest.spool``), which a
replayer thread drains in order when ClickHouse is back.

No artificial delay is added: while one insert runs, the next requests queue, so batches grow
with load by themselves and a lone request is written at once.

The journal (spans, on by default with the embedded store). A batch that groups several requests,
or arrives while journaled rows wait, is acknowledged once it is in the fsync'd journal
(``Spool.journal``: its Arrow table, ~1 ms of fsync) and inserted by the *inserter* thread together
with the batches journaled meanwhile: when ``journal_rows`` rows wait, or the oldest has waited
``journal_linger`` seconds. Under a closed loop of clients (each sends again once answered) the
insert no longer holds every client: eight clients of 100 spans made one ~800-row insert per round
trip, each insert's fixed cost of ~12 ms of CPU paid per 800 spans, and parsing and storing took
turns. Journaled rows are visible to readers at most ``journal_linger`` (plus one insert) after
their answer; a lone request (one client sending one batch at a time, as the SDKs and the tests do)
is still written straight into ClickHouse and is readable when answered. At most
``journal_max_rows`` rows wait for the inserter; a writer thread with more to journal waits for it.
A journal insert that ClickHouse refuses hands its files to the spool (``Spool.adopt_journal``): they
are replayed as any spooled batch, the tried group first with its token.

Two inserts may run at once, the second only for a batch of at least ``parallel_min_rows`` rows.
With one insert at a time, the clients it answers all wait on it and send their next batches
together once it returns: parsing (Python, one core) and inserting (ClickHouse) take turns instead
of overlapping, and half of a two-core machine idles (``bench/ingest.py``: json-1000 at 1.3 of 2
cores). A second insert of small batches would only split them: more parts for the same rows, each
with its fixed cost and later merges, so small batches still wait for the running insert and
group behind it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from config import priority
from store import Columns, StoreError, StoreUnavailable, get_store
from store.schema import TABLES

from .spool import Spool, SpoolFull, group_token

log = logging.getLogger("tracedash.ingest.writer")


MAX_SEGMENT_REFUSALS = 5
RECENT_BATCHES = 8  # batches whose request counts set how many requests the next one waits for


class Outcome(str, enum.Enum):
    STORED = "stored"  # in ClickHouse
    SPOOLED = "spooled"  # in the local spool, replayed when ClickHouse is back
    JOURNALED = "journaled"  # in the fsync'd journal, inserted with the next journal insert


class Overloaded(Exception):
    """More rows are waiting for the writer than it may hold in memory: answer 503."""


@dataclass
class _Request:
    table: str
    rows: list
    future: Future = field(default_factory=Future)


@dataclass
class _Journaled:
    table: str
    rows: Columns  # of Arrow arrays: what the insert reads in place
    path: Path  # the journal segment
    token: str
    at: float  # time.monotonic() when journaled
    inserted: Future = field(default_factory=Future)  # done once inserted (or handed to the spool)


def _settle(entries) -> None:
    """Mark journaled batches inserted (or handed on): their waiters go on."""
    for entry in entries:
        if not entry.inserted.done():
            entry.inserted.set_result(None)


def _group_rows(group):
    """A replay group's rows as one batch: rows, or ``Columns`` where a segment came from the journal
    (older row segments completed with the columns added since)."""
    parts = [segment.rows for segment in group.segments]
    if not any(isinstance(part, Columns) for part in parts):
        return [row for part in parts for row in part]
    table = TABLES.get(group.table)
    return _batch_rows([part if isinstance(part, Columns) or table is None else table.rows_completed(part)
                        for part in parts])


def new_token() -> str:
    return secrets.token_hex(16)


def _batch_rows(parts: list):
    """The rows of the requests of one batch as one: a list of row mappings, or ``store.Columns``
    where any request handed its rows column by column (the native endpoint does)."""
    if len(parts) == 1:
        return parts[0]
    if any(isinstance(part, Columns) for part in parts):
        return Columns.concat(parts)
    return [row for part in parts for row in part]


class IngestWriter:
    def __init__(self, spool: Spool, *, spool_root=None, max_batch_rows: int = 50_000, target_batch_rows: int = 10_000,
                 linger: float = 0.03, max_queued_rows: int = 400_000, replay_interval: float = 0.5,
                 tail_bytes: int = 8 << 20, tail_wait: float = 2.0, replay_group_rows: int | None = None,
                 write_threads: int = 2, parallel_min_rows: int = 2_000, journal: bool = False,
                 journal_rows: int = 20_000, journal_linger: float = 0.5, journal_max_rows: int = 50_000):
        self.spool = spool
        self.spool_root = spool_root
        self.max_batch_rows = max_batch_rows
        self.target_batch_rows = target_batch_rows
        self.linger = linger
        # A writer thread starts an insert while another runs only for at least this many rows.
        self.parallel_min_rows = parallel_min_rows
        self._inserting = 0  # inserts (or spool writes) running now, under _cond
        self._stats_lock = threading.Lock()
        self._busy = False  # the last batch grouped several requests: more are likely on the way
        # Requests per batch of the last few batches: under a steady load the same clients send
        # again as soon as they are answered, so the next batch waits (at most ``linger``) for as
        # many requests as recent batches carried, then goes at once (see ``_take``).
        self._recent_requests: deque[int] = deque(maxlen=RECENT_BATCHES)
        self.max_queued_rows = max_queued_rows
        self.replay_interval = replay_interval
        # The writer thread replays the spool itself when at most ``tail_bytes`` are left, the last
        # insert reached ClickHouse (never during an outage) and no segment is being refused (those
        # are counted by the replayer's rounds, with its backoff); it waits up to ``tail_wait`` s for
        # the replayer's round in progress.
        self.tail_bytes = tail_bytes
        self.tail_wait = tail_wait
        # At most this many rows per replay insert (0: one segment per insert, as before groups).
        self.replay_group_rows = max_batch_rows if replay_group_rows is None else replay_group_rows
        self._store_ok = True
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._replay_wakeup = threading.Event()
        self._stopping = False
        self.stats = {"batches": 0, "rows_stored": 0, "rows_spooled": 0, "segments_replayed": 0, "replay_inserts": 0,
                      "replay_rounds": 0, "tail_drains": 0, "replay_failures": 0, "segments_quarantined": 0}
        self._refusals: dict = {}
        self.journal = journal
        # 20,000 rows or 0.5 s, not 5,000 or 0.2 s: json-1000 then went to ~21,000 rows an insert
        # (from ~7,700) and the store's merges, a third of the server's CPU with the beat on, fell
        # from 13.8 to 8.3 CPU-seconds in 25 s (docs/BENCHMARKS.md "2026-12-06, night").
        self.journal_rows = journal_rows
        self.journal_linger = journal_linger
        self.journal_max_rows = journal_max_rows
        self._journaled: list[_Journaled] = []  # acknowledged, waiting for the inserter
        self._journaled_rows = 0
        self._journal_inserting = 0  # rows the inserter is inserting now
        self._journal_cond = threading.Condition()
        self._inserter_stop = False
        self._flushes = 0  # callers of flush() waiting: the inserter goes at once
        self._last_journaled: Future | None = None  # the newest journaled batch's ``inserted``
        self.stats.update(rows_journaled=0, journal_inserts=0, journal_adopted=0)
        self._threads = [
            *(threading.Thread(target=self._write_loop, name=f"tracedash-writer-{n}", daemon=True)
              for n in range(1, max(1, write_threads) + 1)),
            threading.Thread(target=self._replay_loop, name="tracedash-replayer", daemon=True),
        ]
        self._inserter = threading.Thread(target=self._insert_loop, name="tracedash-inserter", daemon=True)
        for thread in (*self._threads, self._inserter):
            thread.start()

    # --- submitting --------------------------------------------------------------------------
    def submit(self, table: str, rows: list) -> Future:
        request = _Request(table, rows)
        with self._cond:
            if self._stopping:
                raise Overloaded("the server is shutting down")
            if self._queued_rows and self._queued_rows + len(rows) > self.max_queued_rows:
                raise Overloaded(f"{self._queued_rows} rows are already waiting to be written")
            self._queue.append(request)
            self._queued_rows += len(rows)
            self._cond.notify_all()  # the lingering writer thread, not only the one waiting for a slot
        return request.future

    async def submit_async(self, table: str, rows: list) -> Outcome:
        return await asyncio.wrap_future(self.submit(table, rows))

    def write(self, table: str, rows: list, timeout: float = 120.0) -> Outcome:
        return self.submit(table, rows).result(timeout)

    # --- the writer thread -------------------------------------------------------------------
    def _count(self, **increments: int) -> None:
        with self._stats_lock:  # several writer threads and the replayer update the same counters
            for name, n in increments.items():
                self.stats[name] += n

    def _may_start(self) -> bool:
        """Under ``_cond``: whether a writer thread may take a batch now (see the module's doc)."""
        return bool(self._queue) and (not self._inserting or self._queued_rows >= self.parallel_min_rows
                                      or self._stopping)

    def _take(self) -> list[_Request] | None:
        with self._cond:
            while True:
                while not self._may_start():
                    if self._stopping and not self._queue:
                        return None
                    self._cond.wait()
                self._inserting += 1  # the slot is this thread's while it lingers: no second small batch
                # Under concurrent load each insert has a large fixed cost (a new part, merges
                # later): wait a few milliseconds for a fuller batch, but only until as many
                # requests are queued as recent batches carried (the clients answered by the last
                # insert have sent again): waiting longer cannot fill the batch further, since those
                # clients wait for this insert. A lone request is never held back.
                if self._busy and self.linger:
                    deadline = time.monotonic() + self.linger
                    expected = max(self._recent_requests, default=0)
                    while (self._queued_rows < self.target_batch_rows and len(self._queue) < expected
                           and not self._stopping):
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                if self._queue:
                    break
                self._inserting -= 1  # another writer thread took the queue meanwhile
                self._cond.notify_all()
            taken, rows = [], 0
            while self._queue and (not taken or rows + len(self._queue[0].rows) <= self.max_batch_rows):
                request = self._queue.popleft()
                taken.append(request)
                rows += len(request.rows)
            self._queued_rows -= rows
            self._busy = len(taken) > 1 or bool(self._queue)
            self._recent_requests.append(len(taken) + len(self._queue))
            return taken

    def _write_loop(self) -> None:
        priority.name_thread()
        while True:
            taken = self._take()
            if taken is None:
                return
            try:
                by_table: dict[str, list[_Request]] = {}
                for request in taken:
                    by_table.setdefault(request.table, []).append(request)
                for table, requests in by_table.items():
                    self._write_batch(table, requests)
            finally:
                with self._cond:
                    self._inserting -= 1
                    self._cond.notify_all()  # small batches queued behind this insert may go now

    def _write_batch(self, table: str, requests: list[_Request]) -> None:
        rows = _batch_rows([request.rows for request in requests])
        if self._journals(table, requests) and self._journal_batch(table, rows, requests):
            return
        token = new_token()
        try:
            outcome = self._store_or_spool(table, token, rows)
        except Exception as exc:  # noqa: BLE001 - every waiting request gets the error
            for request in requests:
                request.future.set_exception(exc)
            return
        for request in requests:
            request.future.set_result(outcome)

    # --- the journal (see the module's doc) ----------------------------------------------------
    def _journals(self, table: str, requests: list[_Request]) -> bool:
        """Whether this batch goes through the journal: spans under concurrent load (several
        requests in the batch, or journaled rows still waiting, which it must not overtake), while
        ClickHouse takes inserts and nothing waits in the spool (that order is the spool's)."""
        return (self.journal and table == "spans" and not self._stopping and self._store_ok
                and not self.spool.pending() and (len(requests) > 1 or self._journaled_rows > 0)
                and self._inserter.is_alive())

    def _journal_batch(self, table: str, rows, requests: list[_Request]) -> bool:
        """Journal the batch and answer its requests; False when it could not be journaled (the
        caller then writes it as before)."""
        from store.backends import arrow_table

        with self._journal_cond:  # room first: at most journal_max_rows wait for the inserter
            while self._journaled_rows and self._journaled_rows + len(rows) > self.journal_max_rows:
                self._journal_cond.wait(1.0)
        spec = TABLES[table]
        token = new_token()
        try:
            arrow = arrow_table([c.name for c in spec.insert_columns], [c.type for c in spec.insert_columns], rows)
            path = self.spool.journal(table, token, arrow)
        except (StoreError, OSError) as exc:  # values the table cannot take, a full disk: as before
            log.warning("could not journal %d %s rows (%s); writing them directly", len(rows), table, exc)
            return False
        entry = _Journaled(table, Columns.from_arrow(arrow), path, token, time.monotonic())
        with self._journal_cond:
            self._journaled.append(entry)
            self._journaled_rows += len(rows)
            self._last_journaled = entry.inserted
            self._journal_cond.notify_all()
        self._count(rows_journaled=len(rows))
        for request in requests:
            request.future.set_result(Outcome.JOURNALED)
        return True

    def _insert_loop(self) -> None:
        priority.name_thread()
        while True:
            with self._journal_cond:
                while True:
                    if self._journaled:
                        waited = time.monotonic() - self._journaled[0].at
                        if (self._journaled_rows >= self.journal_rows or waited >= self.journal_linger
                                or self._stopping or self._flushes):
                            break
                        self._journal_cond.wait(self.journal_linger - waited)
                    elif self._inserter_stop:
                        return
                    else:
                        self._journal_cond.wait()
                taken, rows = [], 0
                while self._journaled and (not taken or rows + len(self._journaled[0].rows) <= self.max_batch_rows):
                    entry = self._journaled.pop(0)
                    taken.append(entry)
                    rows += len(entry.rows)
                self._journaled_rows -= rows
                self._journal_inserting = rows
            try:
                self._insert_journaled(taken)
            except Exception:  # noqa: BLE001 - never seen; the files stay, adopted at the next start
                log.exception("journal insert of %d rows failed; its files stay for the next start", rows)
            finally:
                with self._journal_cond:
                    self._journal_inserting = 0
                    self._journal_cond.notify_all()
                _settle(taken)

    def _insert_journaled(self, taken: list[_Journaled]) -> None:
        table = taken[0].table
        if self.spool.pending():  # older rows wait in the spool: these go behind them
            self._adopt(taken, None)
            return
        paths = [entry.path for entry in taken]
        token = group_token([entry.token for entry in taken])
        try:
            manifest = self.spool.fix_journal_group(table, token, paths)
        except OSError as exc:  # no room for the manifest: nothing was sent, the spool replays them
            log.warning("cannot write a journal insert's manifest (%s); spooling its %d batches", exc, len(taken))
            self._adopt(taken, None)
            return
        rows = _batch_rows([entry.rows for entry in taken])
        try:
            get_store().insert(table, rows, tag=f"ingest.writer.{table}", dedup_token=token)
        except Exception as exc:  # noqa: BLE001 - acknowledged rows: to the spool, whatever went wrong
            self._store_ok = not isinstance(exc, StoreUnavailable)
            log.warning("ClickHouse did not take %d journaled %s rows (%s); spooling them", len(rows), table, exc)
            self._adopt(taken, manifest)
            return
        self._store_ok = True
        self._count(batches=1, rows_stored=len(rows), journal_inserts=1)
        self.spool.finish_journal_group(manifest)

    def _adopt(self, taken: list[_Journaled], manifest) -> None:
        """Hand journal files to the spool, whose replayer inserts them, and every batch journaled
        after them too, so that the spool keeps their order."""
        with self._journal_cond:
            later, self._journaled = self._journaled, []
            self._journaled_rows = 0
            self._journal_cond.notify_all()
        entries = [*taken, *later]
        try:
            self.spool.adopt_journal([entry.path for entry in taken], manifest)
            self.spool.adopt_journal([entry.path for entry in later])
        except OSError:
            log.exception("cannot move %d journal batches to the spool; they stay in the journal until the "
                          "next start", len(entries))
            return
        finally:
            _settle(later)  # (``taken`` by the inserter's loop)
        self._count(journal_adopted=len(entries), rows_spooled=sum(len(entry.rows) for entry in entries))
        self._replay_wakeup.set()

    def journal_barrier(self) -> Future | None:
        """A future done once every batch journaled until now is inserted (or handed to the spool),
        or None when none waits: what a live event announcing journaled spans waits for, so that
        the page it makes read finds them. The inserter takes batches in order, so the newest
        batch's insertion covers every earlier one."""
        last = self._last_journaled
        return None if last is None or last.done() else last

    def flush(self, timeout: float = 30.0) -> bool:
        """Insert every journaled batch now and wait for it (or its hand-off to the spool): what
        was acknowledged before the call is then readable. True when done within ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._journal_cond:
            self._flushes += 1
            self._journal_cond.notify_all()
            try:
                while self._journaled or self._journal_inserting:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._journal_cond.wait(remaining)
            finally:
                self._flushes -= 1
        return True

    def _store_or_spool(self, table: str, token: str, rows: list) -> Outcome:
        # While older rows wait in the spool, new ones queue behind them: the spool is drained in
        # order, so ClickHouse never sees a batch before one acknowledged before it was taken (two
        # inserts running at once were taken together: neither waits for the other's outcome).
        if (self.spool.pending() and self._store_ok and not self._refusals
                and self.spool.size_bytes <= self.tail_bytes):
            self._drain_tail()
        tried = self.spool.pending() == 0
        if tried:
            try:
                get_store().insert(table, rows, tag=f"ingest.writer.{table}", dedup_token=token)
                self._store_ok = True
                self._count(batches=1, rows_stored=len(rows))
                return Outcome.STORED
            except StoreError as exc:
                self._store_ok = not isinstance(exc, StoreUnavailable)
                log.warning("ClickHouse did not take %d %s rows (%s); spooling them", len(rows), table, exc)
        # A batch that was tried may be in ClickHouse already (a timeout after the commit): only its
        # own token dedups it, so it is replayed alone; one never sent may join a replay group.
        # The spool holds rows: a batch given as columns is written out as rows. Raises SpoolFull.
        self.spool.append(table, token, rows.rows() if isinstance(rows, Columns) else rows, solo=tried)
        self._count(rows_spooled=len(rows))
        self._replay_wakeup.set()
        return Outcome.SPOOLED

    def _drain_tail(self) -> None:
        """ClickHouse is back and only a little is left in the spool: replay it here, before this
        batch, so that the batch (and the next ones) go straight in again. Under steady traffic the
        replayer alone never sees an empty spool: every batch arriving during its last insert is
        spooled behind it, round after round."""
        if not self.spool.replay_lock.acquire(timeout=self.tail_wait):
            return  # the replayer is busy with a long round: this batch is spooled as before
        try:
            if self.spool.pending():
                self._replay_locked(self.spool)
                self._count(tail_drains=1)
        finally:
            self.spool.replay_lock.release()

    # --- the replayer thread -----------------------------------------------------------------
    def _replay_loop(self) -> None:
        priority.name_thread()
        backoff = self.replay_interval
        while not self._stopping:
            spools = [self.spool]
            if self.spool_root is not None:
                spools += Spool.orphans(self.spool_root, max_bytes=self.spool.max_bytes)
            ok = all(self.replay(spool) for spool in spools)
            for spool in spools[1:]:
                spool.release()
            self._count(replay_rounds=1)
            backoff = self.replay_interval if ok else min(backoff * 2, 30.0)
            self._replay_wakeup.wait(backoff)
            self._replay_wakeup.clear()

    def replay(self, spool: Spool) -> bool:
        """Insert ``spool``'s segments oldest first; stop at the first failure. True when drained.

        Consecutive segments of one table that were never sent directly go in one insert (a replay
        group of at most ``replay_group_rows`` rows, by default ``max_batch_rows``, fixed by a
        manifest so that a retry re-sends the same rows with the same token: see ``ingest.spool``);
        so the replay drains many segments per insert and keeps up with traffic arriving meanwhile.
        A group ClickHouse refuses as data is replayed segment by segment, which finds the bad one.

        A segment ClickHouse keeps refusing while it is reachable (not an outage: the data itself)
        would block every later one forever; after ``MAX_SEGMENT_REFUSALS`` it is moved aside to
        ``quarantine/`` (kept, logged) and the replay goes on."""
        with spool.replay_lock:
            return self._replay_locked(spool)

    def _replay_locked(self, spool: Spool) -> bool:
        group = spool.pending_group()  # fixed by a replay that failed or died: re-sent first, as it was
        if group is not None:
            outcome = self._replay_group(spool, group)
            if outcome is False or (outcome is None and not self._replay_alone(spool, group.segments)):
                return False
        paths = spool.segments()
        i = 0
        while i < len(paths):
            if self._stopping:
                return False  # stopping: the rest stays in the spool (on disk) for the next start
            try:
                first = spool.read(paths[i])
            except FileNotFoundError:  # removed meanwhile (a finished group)
                i += 1
                continue
            i += 1
            members, rows = [first], len(first.rows)
            while not first.solo and i < len(paths):
                try:
                    following = spool.read(paths[i])
                except FileNotFoundError:
                    i += 1
                    continue
                if (following.solo or following.table != first.table
                        or rows + len(following.rows) > self.replay_group_rows):
                    break  # read again as the next group's first
                members.append(following)
                rows += len(following.rows)
                i += 1
            if len(members) == 1:
                if not self._replay_alone(spool, members):
                    return False
                continue
            try:
                group = spool.fix_group(members)
            except OSError as exc:  # no room for the manifest (a full disk): one segment per insert
                log.warning("cannot write a replay group's manifest (%s); replaying %d segments one by one", exc,
                            len(members))
                if not self._replay_alone(spool, members):
                    return False
                continue
            outcome = self._replay_group(spool, group)
            if outcome is False or (outcome is None and not self._replay_alone(spool, members)):
                return False
        return True

    def _insert(self, table_name: str, rows: list, token: str) -> None:
        table = TABLES.get(table_name)
        if table is not None and not isinstance(rows, Columns):  # a journal segment's columns are whole
            rows = table.rows_completed(rows)
        get_store().insert(table_name, rows, tag="ingest.writer.replay", dedup_token=token)

    def _replay_group(self, spool: Spool, group) -> bool | None:
        """True: stored and removed. False: ClickHouse is away (the group stays fixed, for a re-send
        with its token). None: refused as data (the manifest is dropped; replay its segments alone)."""
        try:
            self._insert(group.table, _group_rows(group), group.token)
        except StoreUnavailable as exc:
            self._store_ok = False
            self._count(replay_failures=1)
            log.warning("spool replay of %d segments from %s waits for ClickHouse: %s", len(group.segments),
                        group.manifest.name, exc)
            return False
        except StoreError as exc:
            self._count(replay_failures=1)
            log.warning("ClickHouse refused a replay group of %d segments from %s (%s); replaying them one by one",
                        len(group.segments), group.manifest.name, exc)
            spool.drop_group(group)
            return None
        self._store_ok = True
        spool.finish_group(group)
        self._count(segments_replayed=len(group.segments), replay_inserts=1)
        log.info("replayed %d %s rows from %d spool segments (%s)", sum(len(s.rows) for s in group.segments),
                 group.table, len(group.segments), group.manifest.name)
        return True

    def _replay_alone(self, spool: Spool, segments: list) -> bool:
        """Each segment in its own insert, with its own token; False at the first that must wait."""
        for segment in segments:
            path = segment.path
            try:
                self._insert(segment.table, segment.rows, segment.token)
            except StoreUnavailable as exc:
                self._store_ok = False
                self._count(replay_failures=1)
                log.warning("spool replay of %s waits for ClickHouse: %s", path.name, exc)
                return False
            except StoreError as exc:
                self._count(replay_failures=1)
                refusals = self._refusals[path] = self._refusals.get(path, 0) + 1
                if refusals < MAX_SEGMENT_REFUSALS:
                    log.warning("ClickHouse refused spool segment %s (%d/%d): %s", path.name, refusals,
                                MAX_SEGMENT_REFUSALS, exc)
                    return False
                moved = spool.quarantine(path)
                self._refusals.pop(path, None)
                self._count(segments_quarantined=1)
                log.error("spool segment %s refused %d times; moved to %s for inspection: %s", path.name, refusals,
                          moved, exc)
                continue
            self._store_ok = True
            self._refusals.pop(path, None)
            spool.remove(path)
            self._count(segments_replayed=1, replay_inserts=1)
            log.info("replayed %d %s rows from the spool (%s)", len(segment.rows), segment.table, path.name)
        return True

    def health(self) -> dict:
        with self._cond:
            queued = self._queued_rows
        return {"queued_rows": queued, "journaled_rows": self._journaled_rows, "spooled_segments": self.spool.pending(),
                "spool_bytes": self.spool.size_bytes, "spool_limit_bytes": self.spool.max_bytes, "spool_disk_full": self.spool.disk_full, **self.stats}

    def stop(self, timeout: float = 120.0) -> bool:
        """Finish what is queued (every queued request is answered: stored or spooled), then stop
        both threads. True when both have ended within ``timeout`` seconds."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._replay_wakeup.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._journal_cond:  # the writer threads journal nothing more: the inserter ends once empty
            self._inserter_stop = True
            self._journal_cond.notify_all()
        self._inserter.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in (*self._threads, self._inserter) if thread.is_alive()]
        if alive:
            log.warning("ingest writer: %s still running after %.0f s of waiting", ", ".join(alive), timeout)
            return False
        self.spool.release()
        return True


_writer: IngestWriter | None = None
_writer_lock = threading.Lock()


def get_writer() -> IngestWriter:
    """The process's writer, started on first use (its spool slot claimed then)."""
    global _writer
    if _writer is None:
        with _writer_lock:
            if _writer is None:
                from django.conf import settings

                root = settings.DATA_DIR / "spool"
                spool = Spool.claim(root, max_bytes=settings.TRACEDASH_SPOOL_MAX_BYTES)
                _writer = IngestWriter(spool, spool_root=root, write_threads=settings.ENV.ingest_write_threads,
                                       journal=settings.ENV.ingest_journal)
    return _writer


def current_writer() -> IngestWriter | None:
    """The process's writer if one was started (none is started by asking)."""
    return _writer


def stop_writer(timeout: float = 120.0) -> bool:
    """Stop the process's writer (if started): True when its threads have ended."""
    global _writer
    with _writer_lock:
        if _writer is None:
            return True
        stopped = _writer.stop(timeout)
        _writer = None
        return stopped


__all__ = ["IngestWriter", "Outcome", "Overloaded", "SpoolFull", "current_writer", "get_writer", "stop_writer",
           "new_token"]
