"""The journal: under concurrent load span batches are acknowledged once they are in the fsync'd
journal and inserted together a moment later. Nothing acknowledged is lost or stored twice: not
when ClickHouse refuses the journal insert, not when the process dies with batches journaled or
with a journal insert sent, and a lone request is still readable when it is answered."""

from __future__ import annotations

import threading

import pytest

import store
from ingest.spool import JOURNAL, JOURNAL_GROUP, Spool
from ingest.writer import IngestWriter, Outcome
from store import Columns, Store, get_store
from tests.conftest import wait_until
from tests.test_ingest_durability import HeldStore, down_store, rows_for
from tests.test_spool_replay import stored_rows

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def concurrently(writer: IngestWriter, batches: list) -> list[Outcome]:
    """Every batch submitted at once (the writer groups them), each answer awaited."""
    futures = [writer.submit("spans", batch) for batch in batches]
    return [future.result(60) for future in futures]


def held_writer(tmp_path, **options) -> IngestWriter:
    """A journaling writer whose inserter waits (an hour, 10**9 rows) until flushed or stopped."""
    return IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), journal=True, journal_linger=3600,
                        journal_rows=10**9, replay_interval=3600, **options)


def journal_files(tmp_path, suffix: str = JOURNAL) -> list:
    return sorted((tmp_path / "slot-0").glob("*" + suffix))


def test_concurrent_batches_are_acknowledged_from_the_journal_and_inserted_together(tmp_path, project_with_key):
    project, _ = project_with_key()
    slow = HeldStore(get_store().backend, hold=0.2)  # the first insert runs while the rest queue
    real = store.set_store(slow)
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), journal=True, journal_linger=0.3)
    try:
        outcomes = concurrently(writer, [rows_for(project.pk) for _ in range(30)])
        assert Outcome.JOURNALED in outcomes and set(outcomes) <= {Outcome.STORED, Outcome.JOURNALED}
        assert writer.flush(30)
        assert stored_rows(project.pk) == 150  # every acknowledged row, once
        assert writer.stats["rows_journaled"] >= 5 and writer.stats["journal_inserts"] >= 1
        assert writer.stats["rows_stored"] == 150
        assert writer.stats["batches"] <= 6  # 30 requests, a handful of inserts
        assert not journal_files(tmp_path) and not journal_files(tmp_path, JOURNAL_GROUP)
        assert not list((tmp_path / "slot-0").glob("*.done")) and writer.spool.pending() == 0
    finally:
        writer.stop()
        store.set_store(real)


def test_a_lone_request_is_stored_before_it_is_answered(tmp_path, project_with_key):
    project, _ = project_with_key()
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), journal=True, journal_linger=3600)
    try:
        for n in range(1, 4):
            assert writer.write("spans", rows_for(project.pk)) == Outcome.STORED
            assert stored_rows(project.pk) == 5 * n  # readable when answered, no flush
        assert writer.stats["rows_journaled"] == 0 and not journal_files(tmp_path)
    finally:
        writer.stop()


def test_a_batch_arriving_while_journaled_rows_wait_is_journaled_behind_them(tmp_path, project_with_key):
    project, _ = project_with_key()
    writer = held_writer(tmp_path)
    try:
        assert set(concurrently(writer, [rows_for(project.pk) for _ in range(4)])) == {Outcome.JOURNALED}
        # A lone request now would overtake the journaled rows: it is journaled too.
        assert writer.write("spans", rows_for(project.pk)) == Outcome.JOURNALED
        assert stored_rows(project.pk) == 0 and writer.health()["journaled_rows"] == 25
        assert writer.flush(30)
        assert stored_rows(project.pk) == 25
    finally:
        writer.stop()


def test_stopping_inserts_what_the_journal_holds(tmp_path, project_with_key):
    project, _ = project_with_key()
    writer = held_writer(tmp_path)
    assert set(concurrently(writer, [rows_for(project.pk, 2) for _ in range(5)])) == {Outcome.JOURNALED}
    assert writer.stop(60)
    assert stored_rows(project.pk) == 50 and not journal_files(tmp_path)


def test_a_journal_insert_clickhouse_refuses_is_replayed_from_the_spool(tmp_path, project_with_key):
    project, _ = project_with_key()
    writer = held_writer(tmp_path)
    try:
        assert set(concurrently(writer, [rows_for(project.pk) for _ in range(6)])) == {Outcome.JOURNALED}
        real = store.set_store(down_store())
        try:
            assert writer.flush(60)  # the insert failed: the batches went to the spool
            adopted = writer.stats["journal_adopted"]  # the six requests were journaled in a batch or a few
            assert adopted >= 1 and writer.spool.pending() == adopted
            assert list((tmp_path / "slot-0").glob("*.grp"))  # the tried insert, re-sent first with its token
            assert not journal_files(tmp_path) and not journal_files(tmp_path, JOURNAL_GROUP)
            # While the spool holds them, new batches go behind them, not into the journal.
            assert set(concurrently(writer, [rows_for(project.pk) for _ in range(3)])) == {Outcome.SPOOLED}
        finally:
            store.set_store(real)
        assert writer.replay(writer.spool)
        assert writer.spool.pending() == 0
        assert stored_rows(project.pk) == 45  # no FINAL: nothing doubled
    finally:
        writer.stop()


def _kill(writer: IngestWriter) -> None:
    """The process dies: its threads stop without finishing anything, its slot's lock goes."""
    with writer._cond:
        writer._queue.clear()
    with writer._journal_cond:
        writer._journaled.clear()
        writer._journaled_rows = 0
    writer.stop(30)


@pytest.mark.parametrize("restart", ["in the same slot", "in another slot, draining the dead one's"])
def test_a_journal_left_by_a_dead_process_is_replayed_once(tmp_path, project_with_key, restart):
    project, _ = project_with_key()
    root = tmp_path / "spool"
    other = Spool.claim(root, max_bytes=10**8) if restart.startswith("in another") else None  # holds slot-0
    dead = IngestWriter(Spool.claim(root, max_bytes=10**8), journal=True, journal_linger=3600, journal_rows=10**9,
                        replay_interval=3600)
    assert set(concurrently(dead, [rows_for(project.pk) for _ in range(5)])) == {Outcome.JOURNALED}
    slot = dead.spool.directory
    _kill(dead)
    assert list(slot.glob("*" + JOURNAL)) and stored_rows(project.pk) == 0
    writer = IngestWriter(other or Spool.claim(root, max_bytes=10**8), spool_root=root)
    try:
        assert (writer.spool.directory == slot) is (other is None)
        wait_until(lambda: stored_rows(project.pk) == 25, timeout=30, message="the dead process's journal to replay")
        wait_until(lambda: not list(root.glob("slot-*/*.seg")), timeout=10, message="its segments to go")
        assert not list(root.glob("slot-*/*" + JOURNAL))
    finally:
        writer.stop()
    assert stored_rows(project.pk) == 25


class DiesAfterInsert(Store):
    """The real store; the journal insert is stored, then the process dies before it marks it done."""

    def __init__(self, backend):
        super().__init__(backend)
        self.died = threading.Event()

    def insert(self, table, rows, *, tag, dedup_token=None):
        super().insert(table, rows, tag=tag, dedup_token=dedup_token)
        self.died.set()
        raise SystemExit  # the thread ends here, as the process would


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the inserter's end
def test_a_journal_insert_stored_before_a_crash_is_not_stored_twice(tmp_path, project_with_key):
    project, _ = project_with_key()
    root = tmp_path / "spool"
    spool = Spool.claim(root, max_bytes=10**8)
    dead = IngestWriter(spool, journal=True, journal_linger=3600, journal_rows=10**9, replay_interval=3600)
    assert set(concurrently(dead, [rows_for(project.pk) for _ in range(4)])) == {Outcome.JOURNALED}
    dying = DiesAfterInsert(get_store().backend)
    real = store.set_store(dying)
    try:
        with dead._journal_cond:
            dead._flushes += 1
            dead._journal_cond.notify_all()
        assert dying.died.wait(30)
    finally:
        store.set_store(real)
    assert stored_rows(project.pk) == 20
    assert journal_files(root, JOURNAL_GROUP) and journal_files(root)  # the insert's manifest and its batches
    _kill(dead)
    writer = IngestWriter(Spool.claim(root, max_bytes=10**8), spool_root=root, replay_interval=3600)
    try:
        assert writer.replay(writer.spool)  # the group again, with the token of the insert that was stored
        assert writer.spool.pending() == 0
    finally:
        writer.stop()
    assert stored_rows(project.pk) == 20  # no FINAL: the re-sent group was deduplicated


def test_journal_segments_read_back_as_the_columns_journaled(tmp_path, project_with_key):
    from store.backends import arrow_table
    from store.schema import SPANS

    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    rows = rows_for(project.pk, 3)
    names, types = [c.name for c in SPANS.insert_columns], [c.type for c in SPANS.insert_columns]
    path = spool.journal("spans", "tok-1", arrow_table(names, types, rows))
    assert path.suffix == JOURNAL and spool.pending() == 0  # not the replayer's while its process lives
    reopened = Spool(tmp_path / "slot-0", max_bytes=10**8)  # as a restart opens it
    assert reopened.pending() == 1 and not journal_files(tmp_path)
    segment = reopened.read(reopened.segments()[0])
    assert (segment.table, segment.token, segment.solo, len(segment.rows)) == ("spans", "tok-1", False, len(rows))
    assert isinstance(segment.rows, Columns)
    assert segment.rows.column("span_id").to_pylist() == [row["span_id"] for row in rows]
    assert segment.rows.column("attributes").to_pylist()[0] == list(rows[0]["attributes"].items())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("remembered_keys")
def test_concurrent_posts_are_answered_from_the_journal_and_all_stored(project_with_key):
    """Through the ASGI application and the process's own writer (journal on: the embedded store's
    default): concurrent POSTs while an insert holds the store are journaled, each answered 200,
    shown in /healthz, and every span is stored once after the flush."""
    import json

    from django.conf import settings as django_settings

    from ingest.writer import get_writer
    from tests.test_ingest_asgi import _call, _spans

    assert django_settings.ENV.ingest_journal
    project, raw = project_with_key()
    auth = {"authorization": f"Bearer {raw}"}
    writer = get_writer()
    journaled = writer.stats["rows_journaled"]
    slow = HeldStore(get_store().backend, hold=0.3)  # the first insert runs while the rest queue
    real = store.set_store(slow)
    answers = []
    try:
        threads = [threading.Thread(target=lambda: answers.append(_call("POST", "/api/v1/traces", _spans(2), auth)))
                   for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [status for status, _, _ in answers] == [200] * 12
        assert all(json.loads(body)["accepted"] == 10 for _, _, body in answers)
        assert writer.stats["rows_journaled"] > journaled
        status, _, body = _call("GET", "/healthz")
        assert status == 200 and "journaled_rows" in json.loads(body)["checks"]["ingest"]
        assert writer.flush(60)
    finally:
        store.set_store(real)
    assert stored_rows(project.pk) == 120


def test_the_live_event_of_journaled_spans_goes_once_they_are_readable(tmp_path, project_with_key, monkeypatch):
    """A page refreshes on the ``traces.ingested`` event by reading the store: for journaled spans
    the event waits for the journal's insert (the answer does not)."""
    import asyncio

    from channels.layers import InMemoryChannelLayer

    from ingest import services, writer as writer_module

    project, _ = project_with_key()
    writer = held_writer(tmp_path)
    monkeypatch.setattr(writer_module, "_writer", writer)  # the process's writer, as current_writer() finds it
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(services, "get_channel_layer", lambda: layer)
    readable_when_sent = []

    async def record(group, message):
        readable_when_sent.append(stored_rows(project.pk))

    monkeypatch.setattr(layer, "group_send", record)
    group = services.traces_group(project.pk)
    batches = [rows_for(project.pk) for _ in range(3)]

    async def scenario():
        await layer.group_add(group, "specific.test!page")
        assert set(concurrently(writer, batches)) == {Outcome.JOURNALED}
        await services.traces_notify_async(project_id=project.pk, rows=Columns.from_rows(list(batches[0][0]),
                                                                                          batches[0]))
        assert readable_when_sent == [] and len(services._DEFERRED) == 1  # answered; the event waits
        await asyncio.sleep(0.3)
        assert readable_when_sent == []
        await asyncio.get_running_loop().run_in_executor(None, writer.flush, 30)
        await asyncio.wait_for(asyncio.gather(*services._DEFERRED), 30)

    try:
        asyncio.run(scenario())
    finally:
        writer.stop()
    assert readable_when_sent == [15]  # sent once, after every journaled span was readable
    assert writer.journal_barrier() is None
