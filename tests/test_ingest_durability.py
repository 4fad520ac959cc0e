"""Acknowledged data is never lost: ClickHouse outages go to the fsync'd spool, which drains in
order, without duplicates, when ClickHouse returns; a full spool answers 503."""

from __future__ import annotations

import json
import threading
import time

import pytest

import store
from config.env import parse_clickhouse_url
from ingest.spool import Spool, SpoolFull
from ingest.writer import IngestWriter, Outcome, Overloaded, get_writer
from store import Store, get_store
from store.backends import NativeBackend
from tests.conftest import spool_drained, wait_until
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def down_store() -> Store:
    """A real driver pointed at a closed port: every call fails as an outage does."""
    return Store(NativeBackend(parse_clickhouse_url("clickhouse://127.0.0.1:1/x?connect_timeout=0.3")))


def count_spans(project_id=None) -> int:
    sql = "SELECT count() FROM spans FINAL" + (" WHERE project_id = {p:UInt64}" if project_id else "")
    return get_store().query(sql, {"p": project_id} if project_id else None, tag="tests.count").scalar()


def rows_for(project_id: int, n_traces: int = 1) -> list[dict]:
    from ingest.schemas import Limits, parse_span

    spans = [s for _ in range(n_traces) for s in llm_trace()]
    return [parse_span(json.dumps(s).encode(), project_id=project_id, limits=Limits()) for s in spans]


def test_outage_is_acknowledged_from_the_spool_and_replayed(client, project_with_key):
    project, key = project_with_key()
    real = store.set_store(down_store())
    try:
        response = client.post("/api/v1/traces", data=json.dumps({"spans": llm_trace()}),
                               content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 200 and response.json()["accepted"] == 5
        health = client.get("/healthz").json()
        assert health["checks"]["clickhouse"]["ok"] is False
        assert health["checks"]["ingest"]["spooled_segments"] >= 1
        # While the spool holds data, new batches queue behind it (order is kept).
        response = client.post("/api/v1/traces", data=json.dumps({"spans": llm_trace()}),
                               content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 200
    finally:
        store.set_store(real)
    spool_drained(get_writer(), timeout=30)
    assert count_spans(project.pk) == 10


def test_replaying_a_segment_twice_stores_it_once(tmp_path, project_with_key):
    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    writer = IngestWriter(spool)
    try:
        rows = rows_for(project.pk, 3)
        spool.append("spans", "segment-token-1", rows)
        assert writer.replay(spool) and spool.pending() == 0
        # A crash after ClickHouse took the segment but before it was deleted: it is sent again.
        spool.append("spans", "segment-token-1", rows)
        assert writer.replay(spool)
        assert get_store().query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": project.pk},
                                 tag="tests.count").scalar() == len(rows)  # no duplicate, even before merges
    finally:
        writer.stop()


@pytest.mark.parametrize("missing", [("cache",), ("phase_fallback", "cache")], ids=["before-0018", "before-0016"])
def test_a_segment_spooled_before_an_upgrade_added_a_column_is_replayed(tmp_path, project_with_key, missing):
    """A segment written by an earlier release lacks the columns added since (``cache``, migration
    0018; before 0016 also ``phase_fallback``): it is replayed with their value for old rows, not
    refused and quarantined."""
    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    writer = IngestWriter(spool)
    try:
        rows = [{k: v for k, v in row.items() if k not in missing} for row in rows_for(project.pk, 2)]
        assert all(name not in rows[0] for name in missing)
        spool.append("spans", "segment-before-upgrade", rows)
        assert writer.replay(spool) and spool.pending() == 0
        stored = get_store().query("SELECT phase_fallback, cache FROM spans WHERE project_id = {p:UInt64}",
                                   {"p": project.pk}, tag="tests.count").dicts()
        assert [(r["phase_fallback"], r["cache"]) for r in stored] == [(0, 0)] * len(rows)
    finally:
        writer.stop()


def test_a_full_spool_answers_503(client, project_with_key, settings):
    _, key = project_with_key()
    writer = get_writer()
    real = store.set_store(down_store())
    old_limit = writer.spool.max_bytes
    writer.spool.max_bytes = writer.spool.size_bytes + 100  # nearly full
    try:
        response = client.post("/api/v1/traces", data=json.dumps({"spans": llm_trace()}),
                               content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "spool_full" and response["Retry-After"]
        assert client.get("/healthz").status_code == 503
    finally:
        writer.spool.max_bytes = old_limit
        store.set_store(real)
    wait_until(lambda: writer.spool.pending() == 0, timeout=30, message="the spool to drain")


def test_a_restarted_process_replays_the_spool_a_dead_one_left(tmp_path, project_with_key):
    project, _ = project_with_key()
    root = tmp_path / "spool"
    dead = Spool.claim(root, max_bytes=10**8)
    rows = rows_for(project.pk, 2)
    dead.append("spans", "left-by-a-dead-process", rows)
    dead.release()  # the process died: its lock is gone, its segment stays
    writer = IngestWriter(Spool.claim(root, max_bytes=10**8), spool_root=root)
    try:
        wait_until(lambda: count_spans(project.pk) == len(rows), timeout=30, message="the orphaned segment to replay")
        wait_until(lambda: not list(root.glob("*/*.seg")), timeout=10, message="the segment to be removed")
    finally:
        writer.stop()


class HeldStore(Store):
    """The real store, each insert held ``hold`` s first (as a loaded server takes its time); counts the
    inserts running at once."""

    def __init__(self, backend, hold: float):
        super().__init__(backend)
        self.hold, self.running, self.most = hold, 0, 0
        self._lock = threading.Lock()

    def insert(self, *args, **kwargs):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.hold)
            return super().insert(*args, **kwargs)
        finally:
            with self._lock:
                self.running -= 1


def test_concurrent_requests_are_grouped_into_few_inserts(tmp_path, project_with_key):
    project, _ = project_with_key()
    slow = HeldStore(get_store().backend, hold=0.05)
    real = store.set_store(slow)
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8))
    try:
        batches = [rows_for(project.pk) for _ in range(20)]
        outcomes = []
        threads = [threading.Thread(target=lambda b=b: outcomes.append(writer.write("spans", b))) for b in batches]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes == [Outcome.STORED] * 20
        assert writer.stats["rows_stored"] == 100
        assert writer.stats["batches"] <= 5  # 20 requests, a handful of inserts
    finally:
        writer.stop()
        store.set_store(real)
    assert count_spans(project.pk) == 100


def _columns_for(project_id: int, n_traces: int = 1, *, arrow: bool = False):
    """Rows as the native endpoint hands them over: list columns, or (``arrow``) the Arrow columns
    a parse worker returns (ingest.parse_pool)."""
    from ingest.schemas import SPAN_COLUMNS, SPAN_TYPES
    from store import Columns
    from store.backends import arrow_table

    columns = Columns.from_rows(SPAN_COLUMNS, rows_for(project_id, n_traces))
    return Columns.from_arrow(arrow_table(SPAN_COLUMNS, SPAN_TYPES, columns)) if arrow else columns


@pytest.mark.parametrize("arrow", [False, True], ids=["lists", "arrow"])
def test_requests_given_as_columns_and_as_rows_are_grouped_and_stored_whole(tmp_path, project_with_key, arrow):
    """The native endpoint hands its rows to the writer column by column, the OTLP one as rows: a
    batch of both is one insert of every row."""
    project, _ = project_with_key()
    held = HeldStore(get_store().backend, hold=0.5)
    real = store.set_store(held)
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), linger=0)
    try:
        first = writer.submit("spans", rows_for(project.pk))
        wait_until(lambda: held.running == 1, timeout=30, message="the first insert to start")
        behind = [writer.submit("spans", _columns_for(project.pk, 2, arrow=arrow)),
                  writer.submit("spans", rows_for(project.pk)), writer.submit("spans", _columns_for(project.pk, arrow=arrow))]
        assert [f.result(60) for f in [first, *behind]] == [Outcome.STORED] * 4
        assert writer.stats["batches"] == 2 and writer.stats["rows_stored"] == 25
    finally:
        writer.stop()
        store.set_store(real)
    assert count_spans(project.pk) == 25


@pytest.mark.parametrize("arrow", [False, True], ids=["lists", "arrow"])
def test_columns_spooled_in_an_outage_are_replayed_as_rows(tmp_path, project_with_key, arrow):
    """A batch given as columns (lists, or a parse worker's Arrow columns) that ClickHouse cannot
    take is spooled as the rows it was parsed into (the spool's format) and stored once ClickHouse
    is back."""
    project, _ = project_with_key()
    real = store.set_store(down_store())
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), replay_interval=0.2)
    columns = _columns_for(project.pk, 3, arrow=arrow)
    try:
        assert writer.write("spans", columns, timeout=60) == Outcome.SPOOLED
        segment = writer.spool.read(writer.spool.segments()[0])
        assert len(segment.rows) == 15 and segment.rows == columns.rows()
        assert all(type(row["start_time"]) is int and type(row["attributes"]) is dict for row in segment.rows)
    finally:
        store.set_store(real)
    try:
        spool_drained(writer, timeout=60)
    finally:
        writer.stop()
    assert count_spans(project.pk) == 15


@pytest.mark.parametrize("traces, inserts_at_once", [(1, 1), (10, 2)], ids=["small-waits", "large-goes-beside"])
def test_a_second_insert_runs_beside_the_first_only_for_a_large_batch(tmp_path, project_with_key, traces,
                                                                       inserts_at_once):
    """While one insert runs, a batch of at least ``parallel_min_rows`` rows starts a second one
    (parsing and inserting overlap instead of taking turns); a smaller one waits for the running
    insert, as more small requests would group behind it (two small inserts: more parts, same rows)."""
    project, _ = project_with_key()
    held = HeldStore(get_store().backend, hold=1.0)
    real = store.set_store(held)
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), parallel_min_rows=40, linger=0)
    try:
        first = writer.submit("spans", rows_for(project.pk))
        wait_until(lambda: held.running == 1, timeout=30, message="the first insert to start")
        second = writer.submit("spans", rows_for(project.pk, traces))  # 5 or 50 rows
        assert first.result(60) == second.result(60) == Outcome.STORED
        assert held.most == inserts_at_once
        assert writer.stats["batches"] == 2 and writer.stats["rows_stored"] == 5 + 5 * traces
    finally:
        writer.stop()
        store.set_store(real)
    assert count_spans(project.pk) == 5 + 5 * traces


def test_closed_loop_clients_are_written_together_without_waiting_out_the_linger(tmp_path, project_with_key):
    """Clients that send again as soon as they are answered (bench/ingest.py's, an SDK's exporter
    threads) cannot fill a batch beyond what they keep in flight: once as many requests are queued
    as recent batches carried, the batch goes. With a linger of a minute, every batch would
    otherwise wait that minute (their rows never reach ``target_batch_rows``). Only when clients
    stop sending (fewer than the recent batches carried) does one batch wait out the linger: the
    test stops the writer for the last rounds, which ends that wait."""
    project, _ = project_with_key()
    clients, rounds = 8, 6
    writer = IngestWriter(Spool(tmp_path / "slot-0", max_bytes=10**8), linger=60.0, target_batch_rows=10**6)
    outcomes, errors = [], []

    def client():
        try:
            for _ in range(rounds):
                outcomes.append(writer.write("spans", rows_for(project.pk), timeout=300))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    try:
        for t in threads:
            t.start()
        # The rounds before the last two, while every client still sends: well under a second on
        # an idle machine (the ceiling is for a busy one; one linger alone is 60 s).
        wait_until(lambda: len(outcomes) >= clients * (rounds - 2), timeout=45,
                   message=f"{clients * (rounds - 2)} requests answered (one linger is 60 s)")
    finally:
        writer.stop()  # a batch waiting for clients that have finished goes now; later sends are refused
        for t in threads:
            t.join(timeout=300)
    assert all(isinstance(e, Overloaded) for e in errors), errors  # "shutting down", nothing else
    assert set(outcomes) == {Outcome.STORED}
    assert count_spans(project.pk) == len(outcomes) * 5  # every answered request, stored


def test_spool_segments_survive_a_reopen(tmp_path):
    spool = Spool(tmp_path / "s", max_bytes=10**6)
    spool.append("spans", "t1", [{"a": 1}])
    spool.append("spans", "t2", [{"a": 2}])
    again = Spool(tmp_path / "s", max_bytes=10**6)
    assert again.pending() == 2 and again.size_bytes == spool.size_bytes
    first = again.read(again.segments()[0])
    assert (first.table, first.token, first.rows) == ("spans", "t1", [{"a": 1}])
    with pytest.raises(SpoolFull):
        again.append("spans", "t3", [{"a": "x" * 2_000_000}])


def test_a_segment_clickhouse_keeps_refusing_is_quarantined_not_blocking(tmp_path, project_with_key):
    from ingest.writer import MAX_SEGMENT_REFUSALS

    project, _ = project_with_key()
    spool = Spool(tmp_path / "slot-0", max_bytes=10**8)
    writer = IngestWriter(spool)
    try:
        poison = rows_for(project.pk)
        del poison[0]["phase"]  # a row the store cannot write, whatever the server's state
        spool.append("spans", "poison", poison)
        good = rows_for(project.pk)
        spool.append("spans", "good", good)
        for _ in range(MAX_SEGMENT_REFUSALS - 1):
            assert writer.replay(spool) is False  # blocked, retried: the data is kept
        assert writer.replay(spool) is True
        assert writer.stats["segments_quarantined"] == 1
        assert [p.name for p in (tmp_path / "slot-0" / "quarantine").iterdir()] == ["0000000000000001.seg"]
        assert count_spans(project.pk) == len(good)
    finally:
        writer.stop()
