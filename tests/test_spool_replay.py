"""The spool replays many segments per insert (replay groups), so it drains while traffic keeps
arriving after an outage, and a group is re-sent exactly as it was, with the same token, after a
failure or a crash between the insert and the deletions: nothing doubled, nothing lost."""

from __future__ import annotations

import pytest

import store
from ingest.spool import Spool
from ingest.writer import MAX_SEGMENT_REFUSALS, IngestWriter, Outcome
from store import Store, StoreUnavailable, get_store
from tests.conftest import wait_until
from tests.test_ingest_durability import down_store, rows_for

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

REPLAY_TAG = "ingest.writer.replay"


def idle_writer(spool: Spool, **options) -> IngestWriter:
    """A writer whose replayer thread has done its first round (on a spool still empty) and then
    sleeps: the test's own ``replay`` calls are the only ones (a spool's appends do not wake it)."""
    writer = IngestWriter(spool, replay_interval=3600, **options)
    wait_until(lambda: writer.stats["replay_rounds"] >= 1, timeout=30, message="the replayer's first round")
    return writer


def stored_rows(project_id: int) -> int:
    # No FINAL: a duplicate would show before any merge.
    return get_store().query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": project_id},
                             tag="tests.count").scalar()


class ArrivingStore(Store):
    """The real store; every replay insert is counted, and meanwhile two new batches arrive at
    the writer (faster than one segment per insert could drain)."""

    def __init__(self, backend, arrive):
        super().__init__(backend)
        self.arrive = arrive
        self.replay_rows: list[int] = []

    def insert(self, table, rows, *, tag, dedup_token=None):
        if tag == REPLAY_TAG:
            self.replay_rows.append(len(rows))
            self.arrive()
            self.arrive()
        return super().insert(table, rows, tag=tag, dedup_token=dedup_token)


def test_the_spool_drains_while_batches_keep_arriving(tmp_path, project_with_key):
    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    writer = IngestWriter(spool, max_batch_rows=50, replay_interval=3600)
    futures = []
    real = store.set_store(down_store())
    try:
        # Distinct traces (spans is a ReplacingMergeTree: copies of one span would merge away).
        outcomes = [writer.write("spans", rows_for(project.pk)) for _ in range(100)]  # 5 spans each  # the outage: all spooled
        assert outcomes == [Outcome.SPOOLED] * 100 and spool.pending() == 100
        arriving = ArrivingStore(real.backend, lambda: futures.append(writer.submit("spans", rows_for(project.pk))))
        store.set_store(arriving)
        rounds = 0
        while rounds < 30 and len(arriving.replay_rows) < 150:
            rounds += 1
            writer.replay(spool)
            for future in list(futures):
                future.result(60)
            if spool.pending() == 0:
                break
        assert spool.pending() == 0, (f"{spool.pending()} segments left after {rounds} rounds, "
                                      f"{len(arriving.replay_rows)} replay inserts")
        assert max(arriving.replay_rows) <= 50  # bounded rows per insert
        segments = writer.stats["segments_replayed"]
        assert segments >= 100 and len(arriving.replay_rows) * 5 <= segments  # many segments per insert
    finally:
        store.set_store(real)
        writer.stop()
    assert stored_rows(project.pk) == 5 * (100 + len(futures))  # every acknowledged row, once


class CommitThenDrop(Store):
    """The real store, whose first replay insert is stored but answered with a lost connection
    (the server committed; the reply never came)."""

    def __init__(self, backend):
        super().__init__(backend)
        self.dropped = False
        self.tokens: list[str] = []

    def insert(self, table, rows, *, tag, dedup_token=None):
        result = super().insert(table, rows, tag=tag, dedup_token=dedup_token)
        if tag == REPLAY_TAG:
            self.tokens.append(dedup_token)
            if not self.dropped:
                self.dropped = True
                raise StoreUnavailable("connection lost after the insert", tag=tag)
        return result


def test_a_group_stored_but_unacknowledged_is_resent_with_its_token(tmp_path, project_with_key):
    project, _ = project_with_key()
    directory = tmp_path / "slot-0"
    spool = Spool(directory, max_bytes=10**8)
    writer = idle_writer(spool)
    first = [rows_for(project.pk) for _ in range(5)]
    for n, rows in enumerate(first):
        spool.append("spans", f"first-{n}", rows, solo=False)
    flaky = CommitThenDrop(get_store().backend)
    real = store.set_store(flaky)
    try:
        assert writer.replay(spool) is False  # stored, but we cannot know: the group stays fixed
        assert [p.suffix for p in directory.glob("*.grp")] == [".grp"] and spool.pending() == 5
        later = [rows_for(project.pk) for _ in range(3)]
        for n, rows in enumerate(later):  # arrive meanwhile: they must not join the fixed group
            spool.append("spans", f"later-{n}", rows, solo=False)
    finally:
        writer.stop()
    # A restart: a new process opens the same spool and replays it.
    again = Spool(directory, max_bytes=10**8)
    writer = IngestWriter(again, replay_interval=3600)
    try:
        assert writer.replay(again) is True and again.pending() == 0
    finally:
        writer.stop()
        store.set_store(real)
    assert flaky.tokens[0] == flaky.tokens[1] and flaky.tokens[2] != flaky.tokens[0]  # same group, same token
    assert not list(directory.glob("*.grp")) and not list(directory.glob("*.done"))
    assert stored_rows(project.pk) == sum(map(len, first + later))


class Died(BaseException):
    """The process stops here (a kill between two deletions)."""


class DyingSpool(Spool):
    def remove(self, path):
        if getattr(self, "removed", 0) >= 2:
            raise Died()
        self.removed = getattr(self, "removed", 0) + 1
        super().remove(path)


def test_a_crash_between_the_deletions_of_a_stored_group_resends_nothing(tmp_path, project_with_key):
    project, _ = project_with_key()
    directory = tmp_path / "slot-0"
    spool = DyingSpool(directory, max_bytes=10**8)
    writer = idle_writer(spool)
    batches = [rows_for(project.pk) for _ in range(6)]
    for n, rows in enumerate(batches):
        spool.append("spans", f"seg-{n}", rows, solo=False)
    try:
        with pytest.raises(Died):
            writer.replay(spool)
        assert spool.pending() == 4 and len(list(directory.glob("*.done"))) == 1
    finally:
        writer.stop()  # the dead process's threads (its spool object is not used again)
    again = Spool(directory, max_bytes=10**8)  # opening it finishes the stored group's deletions
    assert again.pending() == 0 and not list(directory.glob("*.done"))
    writer = IngestWriter(again, replay_interval=3600)
    try:
        assert writer.replay(again) is True
    finally:
        writer.stop()
    assert stored_rows(project.pk) == sum(map(len, batches))


def test_a_bad_segment_in_a_group_is_quarantined_alone(tmp_path, project_with_key):
    project, _ = project_with_key()
    directory = tmp_path / "slot-0"
    spool = Spool(directory, max_bytes=10**8)
    writer = idle_writer(spool)
    good_before, poison, good_after = rows_for(project.pk), rows_for(project.pk), rows_for(project.pk)
    del poison[0]["phase"]  # a row the store cannot write, whatever the server's state
    spool.append("spans", "good-before", good_before, solo=False)
    poisoned = spool.append("spans", "poison", poison, solo=False)
    spool.append("spans", "good-after", good_after, solo=False)
    try:
        for _ in range(MAX_SEGMENT_REFUSALS - 1):
            assert writer.replay(spool) is False  # blocked, retried: the data is kept
        assert stored_rows(project.pk) == len(good_before)  # the group fell back to one segment per insert
        assert writer.replay(spool) is True
        assert writer.stats["segments_quarantined"] == 1
    finally:
        writer.stop()
    assert [p.name for p in (directory / "quarantine").iterdir()] == [poisoned.name]
    assert not list(directory.glob("*.grp")) and spool.pending() == 0
    assert stored_rows(project.pk) == len(good_before) + len(good_after)


def test_a_batch_tried_once_is_replayed_alone_with_its_own_token(tmp_path, project_with_key):
    """The writer's direct insert may have been stored before it failed (a timeout after the
    commit): its segment must keep its own token, not join a group under another."""
    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    writer = idle_writer(spool)
    tried = rows_for(project.pk)
    get_store().insert("spans", tried, tag="tests.first-try", dedup_token="tried-once")  # it did get in
    spool.append("spans", "tried-once", tried)  # solo (the default)
    never_sent = [rows_for(project.pk) for _ in range(3)]
    for n, rows in enumerate(never_sent):
        spool.append("spans", f"never-sent-{n}", rows, solo=False)
    try:
        assert writer.replay(spool) is True and spool.pending() == 0
        assert writer.stats["replay_inserts"] == 2  # the tried one alone, then the rest together
    finally:
        writer.stop()
    assert stored_rows(project.pk) == len(tried) + sum(map(len, never_sent))


def test_no_room_for_a_group_manifest_replays_one_segment_per_insert(tmp_path, project_with_key):
    """ClickHouse is back but the spool's disk is full (the outage filled it): the replay cannot
    write a group's manifest, so it sends each segment alone with its own token and frees the space."""
    import errno
    import os
    import subprocess

    project, _ = project_with_key()
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        spool = Spool(disk / "slot-0", max_bytes=10**8)
        writer = idle_writer(spool)
        batches = [rows_for(project.pk) for _ in range(3)]
        for n, rows in enumerate(batches):
            spool.append("spans", f"full-disk-{n}", rows, solo=False)
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # the rest of the disk
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        try:
            assert writer.replay(spool) is True and spool.pending() == 0
            assert writer.stats["replay_inserts"] == 3
        finally:
            writer.stop()
        assert not [p.name for p in (disk / "slot-0").iterdir() if p.suffix in (".grp", ".tmp", ".seg")]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert stored_rows(project.pk) == sum(map(len, batches))


class BusyStore(Store):
    """The real store, except that its next ``busy`` replay inserts meet ClickHouse's "not now"
    answer (built by the store's own classification of the error ClickHouse sends)."""

    def __init__(self, backend, busy: int):
        super().__init__(backend)
        self.busy = busy

    def insert(self, table, rows, *, tag, dedup_token=None):
        if tag == REPLAY_TAG and self.busy:
            self.busy -= 1
            raise store.errors.query_error("Code: 241. DB::Exception: Memory limit (total) exceeded: would use "
                                           "3.50 GiB (attempt to allocate chunk of 4194304 bytes)", tag=tag, code=241)
        return super().insert(table, rows, tag=tag, dedup_token=dedup_token)


def test_a_real_memory_limit_error_is_a_busy_store_not_a_refusal():
    """ClickHouse's own answer to a query over its memory limit is classified as "not now"."""
    with pytest.raises(store.StoreBusy) as caught:
        get_store().query("SELECT groupArray(number) FROM numbers(10000000) SETTINGS max_memory_usage = 1000000",
                          tag="tests.busy")
    assert caught.value.code == 241
    with pytest.raises(store.StoreError) as refused:  # a bad query stays a plain error
        get_store().query("SELECT no_such_function(1)", tag="tests.refused")
    assert not isinstance(refused.value, StoreUnavailable) and refused.value.code == 46


def test_a_busy_clickhouse_never_quarantines_a_segment(tmp_path, project_with_key):
    """Acknowledged rows that ClickHouse cannot take for now (memory, parts, queries) wait in the
    spool however often that happens: only a refusal of the data itself counts toward quarantine."""
    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    writer = idle_writer(spool)
    batches = [rows_for(project.pk) for _ in range(2)]
    spool.append("spans", "busy-solo", batches[0])  # replayed alone
    spool.append("spans", "busy-group", batches[1], solo=False)
    previous = store.set_store(BusyStore(get_store().backend, busy=3 * MAX_SEGMENT_REFUSALS))
    try:
        for _ in range(3 * MAX_SEGMENT_REFUSALS):
            assert writer.replay(spool) is False  # waits, like an outage
        assert writer.stats["segments_quarantined"] == 0 and spool.pending() == 2
        assert writer.replay(spool) is True
    finally:
        store.set_store(previous)
        writer.stop()
    assert not (tmp_path / "slot-0" / "quarantine").exists()
    assert stored_rows(project.pk) == sum(map(len, batches))
