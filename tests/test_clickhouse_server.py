"""The native backend and the ingest writer against a real ClickHouse server process.

No chdb test reaches the production path's driver-level behaviour: a login, a refused password, a
query that outlives ``send_receive_timeout``, a server restarted in the middle of an insert stream,
a server that is down while ingestion goes on. Here a ``clickhouse-server`` of the test's own
(tests/support/clickhouse_server.py: own config, free port, own data dir, a user with a password)
is started once for the module, and the app's own code talks to it: ``store.Store`` over
``NativeBackend`` (clickhouse-driver), and ``ingest.writer.IngestWriter`` with its fsync'd
``ingest.spool.Spool``.

The server is whatever ``clickhouse-server`` the machine has; on Debian that is 18.16, a real
native-protocol server but too old for tracedash's schema (no DateTime64, Map, codecs or
``{name:Type}`` parameters) and for the ``log_comment`` / ``insert_deduplication_token``
settings (clickhouse-driver drops settings an old server cannot take, with a warning). So the
tests create the one table they write, ``engine_samples``, themselves: the app's insert columns
with the types the native insert path turns them into (``DateTime64(3)`` goes over the wire as
integer milliseconds, ``LowCardinality(String)`` as ``String``). Everything else is the real code:
``Store.insert`` checks the row against ``store.schema.TABLES`` and the writer, spool and replay
are unchanged. Because that server cannot deduplicate by token, "nothing doubled" here rests on the
spool alone (a segment is removed once ClickHouse took it); a re-sent batch whose first insert did
arrive is deduplicated only on a server that knows ``insert_deduplication_token`` (the
``TRACEDASH_TEST_CLICKHOUSE_URL`` tests in tests/test_store.py).

Skipped, naming the install command, when no ``clickhouse-server`` is installed; failed instead
under ``TRACEDASH_REQUIRE_SERVICES=1`` (.ci/run installs the package).
"""

from __future__ import annotations

import secrets
import threading
import time

import pytest

import store as store_module
from config.env import parse_clickhouse_url
from ingest.spool import Spool
from ingest.writer import MAX_SEGMENT_REFUSALS, IngestWriter, Outcome
from store import Store, StoreAuthError, StoreError, StoreTimeout, StoreUnavailable
from store.backends import NativeBackend
from store.schema import TABLES
from tests.conftest import wait_until
from tests.support.clickhouse_server import ClickHouseServer, server_binary

TABLE = "engine_samples"
# The app's insert columns of engine_samples, in 18.16 types (time: DateTime64(3) sent as integer ms).
OLD_SERVER_TYPES = {"UInt64": "UInt64", "Float64": "Float64", "LowCardinality(String)": "String",
                    "DateTime64(3, 'UTC')": "UInt64"}
BASE_NS = 1_700_000_000_123_456_789


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    binary = server_binary()
    process = ClickHouseServer(tmp_path_factory.mktemp("clickhouse-server"), binary=binary)
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def database(server):
    """A database on the server holding the test's engine_samples table (made through the app's store)."""
    name = f"tracedash_srv_{secrets.token_hex(4)}"
    setup = _store(server, name)
    columns = ", ".join(f"`{c.name}` {OLD_SERVER_TYPES[c.type]}" for c in TABLES[TABLE].insert_columns)
    setup.command(f"CREATE TABLE {TABLE} ({columns}) ENGINE = MergeTree ORDER BY (project_id, time)",
                  tag="tests.server.create")
    yield name
    if server.running:
        setup.command(f"DROP DATABASE IF EXISTS `{name}`", tag="tests.server.drop")
    setup.close()


@pytest.fixture
def server_up(server):
    """The server, running (a test that stopped it and failed must not leave the next one without it)."""
    if not server.running:
        server.start()
    yield server
    if not server.running:
        server.start()


def _store(server, database, **url) -> Store:
    password = url.pop("password", None)
    user = url.pop("user", None)
    return Store(NativeBackend(parse_clickhouse_url(server.url(database, password=password, user=user, **url))))


def _rows(batch: str, n: int = 3) -> list[dict]:
    return [{"project_id": 7, "time": BASE_NS + i * 1_000_000, "host": "gpu-1", "engine": "vllm", "target": f"{batch}/{i}",
             "model": "m", "metric": "requests_running", "le": 0.0, "value": float(i)} for i in range(n)]


def _copies(store: Store, prefix: str) -> dict[str, int]:
    """target -> how many stored rows carry it, for the rows of this test."""
    result = store.query(f"SELECT target, count() FROM {TABLE} WHERE startsWith(target, '{prefix}') GROUP BY target",
                         tag="tests.server.copies")
    return dict(result.rows)


@pytest.fixture
def writer_on(tmp_path):
    """Start IngestWriters on a store of the test's choosing (the process's store while it runs)."""
    started = []

    def start(store: Store, **options) -> IngestWriter:
        store_module.set_store(store)  # the conftest fixture puts the previous one back after the test
        writer = IngestWriter(Spool(tmp_path / f"spool-{len(started)}", max_bytes=64 << 20),
                              replay_interval=options.pop("replay_interval", 0.02), **options)
        started.append(writer)
        return writer

    yield start
    for writer in started:
        writer.stop(60)


def test_connects_creates_its_database_and_round_trips_an_insert(server_up, database):
    store = _store(server_up, database)
    try:
        # Logged in as the URL's user, in its database; the caller's tag travels in the SQL text.
        who = store.query("SELECT user, currentDatabase() AS db, query FROM system.processes "
                          "WHERE query LIKE '%tests.server.who%'",
                          tag="tests.server.who").dicts()
        assert [(w["user"], w["db"]) for w in who] == [(server_up.user, database)]
        assert who[0]["query"].startswith("/* tracedash:tests.server.who */ SELECT")
        rows = _rows("roundtrip")
        assert store.insert(TABLE, rows, tag="tests.server.insert") == 3
        got = store.query(f"SELECT target, time, value FROM {TABLE} WHERE startsWith(target, 'roundtrip/') ORDER BY target",
                          tag="tests.server.read").rows
        # DateTime64(3) columns leave the native insert path as whole milliseconds.
        assert got == [(r["target"], r["time"] // 1_000_000, r["value"]) for r in rows]
        # A database the URL names that does not exist yet is created on first use.
        fresh = _store(server_up, f"tracedash_srv_new_{secrets.token_hex(3)}")
        assert fresh.query("SELECT 1", tag="tests.server.fresh").scalar() == 1
        assert fresh.database in {r[0] for r in store.query("SELECT name FROM system.databases", tag="t.dbs").rows}
        fresh.command(f"DROP DATABASE `{fresh.database}`", tag="tests.server.drop_fresh")
        fresh.close()
    finally:
        store.close()


def test_columns_insert_and_arrow_reads_over_the_native_protocol(server_up, database):
    """``store.Columns`` (numpy and list columns) and ``Store.query_arrow`` through the driver, as
    the summariser's default engine uses them on a server."""
    import numpy as np

    from store import Columns

    store = _store(server_up, database)
    try:
        rows = _rows("columns")
        columns = {name: [r[name] for r in rows] for name in rows[0]}
        columns["time"] = np.array(columns["time"], dtype=np.int64)
        columns["value"] = np.array(columns["value"])
        assert store.insert(TABLE, Columns(columns, len(rows)), tag="tests.server.columns") == 3
        table = store.query_arrow(f"SELECT target, value, toUInt64(1) AS one FROM {TABLE} "
                                  "WHERE startsWith(target, 'columns/') ORDER BY target", tag="tests.server.arrow")
        assert table.column_names == ["target", "value", "one"]
        assert table.column("target").to_pylist() == [r["target"] for r in rows]
        assert table.column("value").to_pylist() == [r["value"] for r in rows]
        assert str(table.column("one").type) == "uint64"
        assert store.query_arrow("SELECT 1 AS x FROM system.one WHERE 0", tag="tests.server.empty").num_rows == 0
    finally:
        store.close()


@pytest.mark.parametrize("who", ["wrong password", "unknown user"])
def test_a_refused_login_is_a_clear_error_naming_user_and_server(server_up, database, who):
    credentials = {"password": "not-the-password"} if who == "wrong password" else {"user": "nobody"}
    refused = _store(server_up, database, **credentials)
    with pytest.raises(StoreAuthError) as caught:
        refused.query("SELECT 1", tag="tests.server.login")
    message = str(caught.value)
    user = credentials.get("user", server_up.user)
    assert f"ClickHouse at 127.0.0.1:{server_up.port} refused the login of user '{user}'" in message
    assert "check the user and password of the ClickHouse URL" in message
    assert "Stack trace" not in message and "libclickhouse" not in message and "\n" not in message
    assert server_up.password not in message
    assert isinstance(caught.value, StoreUnavailable) and caught.value.code in {192, 193, 194, 516}
    with pytest.raises(StoreAuthError):  # an insert too (the writer's path), not a data error
        refused.insert(TABLE, _rows("refused"), tag="tests.server.login_insert")


def test_migrate_clickhouse_with_a_refused_login_stops_with_that_error_not_a_traceback(server_up, database):
    from django.core.management import CommandError, call_command

    refused = _store(server_up, database, password="not-the-password")
    store_module.set_store(refused)  # the conftest fixture puts the previous one back after the test
    with pytest.raises(CommandError) as caught:
        call_command("migrate_clickhouse")
    message = str(caught.value)
    assert message.startswith(f"ClickHouse (clickhouse://{server_up.user}@127.0.0.1:{server_up.port}/{database}): ")
    assert f"refused the login of user '{server_up.user}'" in message and "check the user and password" in message
    assert "Stack trace" not in message and "not-the-password" not in message


def test_a_query_past_send_receive_timeout_raises_store_timeout_and_the_store_goes_on(server_up, database):
    store = _store(server_up, database, send_receive_timeout=1.5)  # sleep(3) always outlasts it
    try:
        with pytest.raises(StoreTimeout, match=r"did not answer within 1\.5 s \(send_receive_timeout") as caught:
            store.query("SELECT sleep(3)", tag="tests.server.slow")
        assert caught.value.tag == "tests.server.slow"
        assert store.query("SELECT 42", tag="tests.server.after_timeout").scalar() == 42  # a new connection
    finally:
        store.close()


def test_server_errors_keep_the_message_and_drop_the_stack_trace(server_up, database):
    store = _store(server_up, database)
    try:
        with pytest.raises(StoreError) as caught:
            store.query("SELECT no_such_function(1)", tag="tests.server.broken")
        assert not isinstance(caught.value, StoreUnavailable)
        assert "no_such_function" in str(caught.value) and caught.value.code == 46
        assert "Stack trace" not in str(caught.value)
    finally:
        store.close()


def test_server_restarted_mid_stream_the_writer_reconnects_and_stores_each_batch_once(server_up, database, writer_on):
    store = _store(server_up, database)
    writer = writer_on(store)
    prefix = f"restart-{secrets.token_hex(3)}"
    outcomes: dict[str, Outcome] = {}
    restarted = threading.Event()
    failures: list[BaseException] = []

    def stream():  # one request after another, as a client sends them, until ten after the restart
        n = after = 0
        try:
            while after < 10:
                batch = f"{prefix}/{n:04d}"
                seen_restart = restarted.is_set()
                outcomes[batch] = writer.write(TABLE, _rows(batch), timeout=120)
                after += seen_restart
                n += 1
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    thread = threading.Thread(target=stream, name="test-insert-stream")
    thread.start()
    try:
        wait_until(lambda: writer.stats["batches"] >= 5 or failures, message="five batches stored before the restart")
        server_up.restart()  # SIGTERM, exit, start again on the same port and data
        restarted.set()
    finally:
        thread.join(120)
    assert not failures, failures
    assert set(outcomes.values()) <= {Outcome.STORED, Outcome.SPOOLED}  # every request acknowledged
    # Batches the server could not take meanwhile went to the spool, and later ones queued behind
    # them; once it drains, the writer's own connection (reconnected) takes batches directly again.
    wait_until(lambda: writer.spool.pending() == 0, timeout=90, message="the spool drained")
    last = f"{prefix}/last"
    assert writer.write(TABLE, _rows(last)) is Outcome.STORED
    copies = _copies(store, prefix + "/")
    expected = {f"{batch}/{i}" for batch in [*outcomes, last] for i in range(3)}
    assert set(copies) == expected, "acknowledged rows are missing"
    assert {target for target, n in copies.items() if n != 1} == set(), "rows stored more than once"
    assert writer.stats["segments_quarantined"] == 0
    store.close()


def test_server_down_the_spool_takes_over_and_replays_once_it_is_back(server_up, database, writer_on):
    store = _store(server_up, database)
    writer = writer_on(store)
    prefix = f"outage-{secrets.token_hex(3)}"
    assert writer.write(TABLE, _rows(f"{prefix}/before")) is Outcome.STORED
    server_up.stop()
    during = [f"{prefix}/during-{n}" for n in range(4)]
    for batch in during:
        assert writer.write(TABLE, _rows(batch)) is Outcome.SPOOLED
    assert writer.spool.pending() == len(during)  # one fsync'd segment per batch
    server_up.start()
    # New batches queue behind the spooled ones (and wake the replayer): order is kept.
    assert writer.write(TABLE, _rows(f"{prefix}/after")) is Outcome.SPOOLED
    wait_until(lambda: writer.spool.pending() == 0, timeout=90, message="the spool replayed")
    assert writer.stats["segments_replayed"] == len(during) + 1
    copies = _copies(store, prefix + "/")
    expected = {f"{batch}/{i}" for batch in [f"{prefix}/before", *during, f"{prefix}/after"] for i in range(3)}
    assert copies == {target: 1 for target in expected}  # nothing lost, nothing doubled
    assert writer.write(TABLE, _rows(f"{prefix}/later")) is Outcome.STORED  # straight to ClickHouse again
    store.close()


def test_after_an_outage_the_spool_drains_while_a_batch_arrives_every_5_ms(server_up, database, writer_on):
    """A steady stream after an outage: the spool must reach zero while the stream goes on (replay
    groups, and the writer replaying the spool's last few segments itself), each row stored once,
    with many segments per replay insert. (On a slower server, one insert per segment fell behind
    such a stream for good; this local server is fast enough that only the insert count shows it.)"""
    store = _store(server_up, database)
    writer = writer_on(store)
    prefix = f"drain-{secrets.token_hex(3)}"
    server_up.stop()
    outage = [f"{prefix}/outage-{n:04d}" for n in range(300)]
    for batch in outage:
        assert writer.write(TABLE, _rows(batch)) is Outcome.SPOOLED
    server_up.start()
    outcomes: dict[str, Outcome] = {}
    drained, failures = threading.Event(), []

    def stream():  # a batch every 5 ms until 50 after the spool was seen empty
        n = after = 0
        try:
            while after < 50 and n < 100_000:
                batch = f"{prefix}/stream-{n:05d}"
                outcomes[batch] = writer.write(TABLE, _rows(batch), timeout=120)
                after += drained.is_set()
                n += 1
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    thread = threading.Thread(target=stream, name="test-steady-stream")
    thread.start()
    try:
        wait_until(lambda: writer.spool.pending() == 0 or failures or not thread.is_alive(), timeout=90,
                   message="the spool drained while the stream goes on")
        assert thread.is_alive() and not failures, failures  # it drained under load, not after it
        drained.set()
    finally:
        thread.join(120)
    assert not failures, failures
    assert list(outcomes.values())[-1] is Outcome.STORED  # straight to ClickHouse again
    wait_until(lambda: writer.spool.pending() == 0, timeout=90, message="the spool drained")
    assert writer.stats["segments_replayed"] >= len(outage)
    assert writer.stats["replay_inserts"] * 10 <= writer.stats["segments_replayed"]  # many segments per insert
    copies = _copies(store, prefix + "/")
    expected = {f"{batch}/{i}" for batch in [*outage, *outcomes] for i in range(3)}
    assert set(copies) == expected, "acknowledged rows are missing"
    assert {target for target, n in copies.items() if n != 1} == set(), "rows stored more than once"
    store.close()


def test_a_refused_login_spools_and_waits_instead_of_quarantining(server_up, database, writer_on):
    """A rotated password is an outage, not bad data: the replayer must wait (StoreUnavailable),
    never count it as a refusal of the segment and move it aside."""
    refused = _store(server_up, database, password="rotated-away")
    writer = writer_on(refused, replay_interval=0.01)
    prefix = f"login-{secrets.token_hex(3)}"
    assert writer.write(TABLE, _rows(f"{prefix}/0")) is Outcome.SPOOLED
    wait_until(lambda: writer.stats["replay_failures"] > MAX_SEGMENT_REFUSALS or writer.stats["segments_quarantined"],
               message="replays refused past the limit")
    assert writer.stats["segments_quarantined"] == 0 and writer.spool.pending() == 1
    good = _store(server_up, database)
    store_module.set_store(good)  # the password is fixed
    assert writer.write(TABLE, _rows(f"{prefix}/1")) is Outcome.SPOOLED  # behind the first; wakes the replayer
    wait_until(lambda: writer.spool.pending() == 0, timeout=90, message="the spool replayed with the right password")
    assert _copies(good, prefix + "/") == {f"{prefix}/{b}/{i}": 1 for b in range(2) for i in range(3)}
    good.close()


def test_a_missing_binary_skips_with_the_install_command_and_fails_under_ci(monkeypatch):
    import os
    import shutil

    from tests.support import clickhouse_server

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.delenv("TRACEDASH_REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y clickhouse-server"):
        clickhouse_server.server_binary()
    monkeypatch.setenv("TRACEDASH_REQUIRE_SERVICES", "1")
    with pytest.raises(pytest.fail.Exception, match="TRACEDASH_REQUIRE_SERVICES is set"):
        clickhouse_server.server_binary()
