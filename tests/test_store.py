"""The store on both backends: the embedded one always, the native one against the server named
by TRACEDASH_TEST_CLICKHOUSE_URL (skipped, with the reason, when it is unset)."""

from __future__ import annotations

import os
import secrets
import threading
import time
from datetime import datetime, timezone

import pytest
from django.conf import settings

from config.env import parse_clickhouse_url
from store import Store, StoreError, StoreUnavailable
from store.backends import EmbeddedBackend, NativeBackend
from store.migrator import MigrationContext, migrate
from store.schema import TABLES

NATIVE_URL = os.environ.get("TRACEDASH_TEST_CLICKHOUSE_URL")


@pytest.fixture(params=["embedded", "native"])
def backend_store(request, clickhouse_store):
    """A store on a throwaway database of each backend, with the production schema."""
    if request.param == "embedded":
        if settings.TRACEDASH_CLICKHOUSE is not None:
            pytest.skip("the embedded backend is not the configured store in this run")
        store = Store(EmbeddedBackend(settings.TRACEDASH_CLICKHOUSE_PATH, f"tracedash_t_{secrets.token_hex(4)}"))
    else:
        if not NATIVE_URL:
            pytest.skip("native backend: set TRACEDASH_TEST_CLICKHOUSE_URL=clickhouse://user:pass@host:9000/db "
                        "to run against a modern ClickHouse server (README, Tests: the compose stack's)")
        store = Store(NativeBackend(parse_clickhouse_url(NATIVE_URL, "TRACEDASH_TEST_CLICKHOUSE_URL"),
                                    f"tracedash_t_{secrets.token_hex(4)}"))
    migrate(store, MigrationContext(retention_days=30))
    yield store
    store.command(f"DROP DATABASE IF EXISTS `{store.database}`", tag="tests.drop")
    store.close()


# A recent whole second plus 123456789 ns: rows older than the retention TTL are dropped on insert.
BASE_NS = (time.time_ns() // 10**9 - 3600) * 10**9 + 123_456_789
BASE_DT = datetime.fromtimestamp(BASE_NS // 10**9, tz=timezone.utc)


def _span_row(**overrides):
    row = {
        "project_id": 1, "trace_id": secrets.token_hex(16), "span_id": secrets.token_hex(8), "parent_span_id": "",
        "name": "chat", "phase": "inference", "phase_fallback": 0, "cache": 0, "service": "api", "model": "m", "start_time": BASE_NS,
        "duration_ns": 5_000_000, "status": "ok", "status_message": "", "ttft_ns": None, "input_tokens": 3,
        "output_tokens": 4, "cost_usd": None, "attributes": {}, "resource_attributes": {},
        "event_times": [], "event_names": [], "event_attributes": [],
    }
    row.update(overrides)
    return row


pytestmark = pytest.mark.clickhouse


def test_parameters_are_typed_and_never_spliced(backend_store):
    tricky = "it's \"quoted\" \\ {not:String} '; DROP TABLE spans; --"
    result = backend_store.query(
        "SELECT {s:String} AS s, {n:UInt64} + 1 AS n, {f:Float64} * 2 AS f",
        {"s": tricky, "n": 41, "f": 1.25},
        tag="tests.params",
    )
    assert result.columns == ["s", "n", "f"]
    assert result.rows == [(tricky, 42, 2.5)]
    assert backend_store.query("SELECT count() FROM spans", tag="tests.count").scalar() == 0  # still there


def test_batch_insert_round_trips_every_column_type(backend_store):
    rows = [
        _span_row(
            span_id=f"{i:016x}", start_time=BASE_NS + i, ttft_ns=210_000_000 if i % 2 else None,
            cost_usd=0.5 if i % 2 else None, attributes={"k": f"v{i}", "quote": "a'b\"c"},
            resource_attributes={"host.name": "gpu-1"}, event_times=[BASE_NS - 123_456_788],
            event_names=["first_token"], event_attributes=[{"i": str(i)}], name=f"n<{i}>",
        )
        for i in range(1, 2001)
    ]
    assert backend_store.insert("spans", rows, tag="tests.insert") == 2000
    result = backend_store.query(
        "SELECT span_id, toUnixTimestamp64Nano(start_time) AS ns, start_time, ttft_ns, cost_usd, attributes,"
        " resource_attributes, event_times, event_names, event_attributes, name"
        " FROM spans WHERE project_id = {p:UInt64} ORDER BY span_id LIMIT 2",
        {"p": 1},
        tag="tests.read",
    )
    first, second = result.dicts()
    assert first["span_id"] == f"{1:016x}"
    assert first["ns"] == BASE_NS + 1  # nanoseconds survive
    assert first["start_time"] == BASE_DT.replace(microsecond=123456)
    assert first["ttft_ns"] == 210_000_000 and second["ttft_ns"] is None  # missing stays missing
    assert first["cost_usd"] == 0.5 and second["cost_usd"] is None
    assert first["attributes"] == {"k": "v1", "quote": "a'b\"c"}
    assert first["resource_attributes"] == {"host.name": "gpu-1"}
    assert first["event_times"] == [BASE_DT]
    assert first["event_names"] == ["first_token"] and first["event_attributes"] == [{"i": "1"}]
    assert first["name"] == "n<1>"
    assert backend_store.query("SELECT count() FROM spans", tag="tests.count").scalar() == 2000


def test_columns_insert_as_rows_do_and_reads_come_back_as_arrow(backend_store):
    """``store.Columns`` (lists, numpy and Arrow columns) stores what the same rows store; a read
    as Arrow gives each column's values and type."""
    import numpy as np
    import pyarrow as pa

    from store import Columns

    rows = [_span_row(span_id=f"{i:016x}", start_time=BASE_NS + i, ttft_ns=i if i % 2 else None,
                      attributes={"k": f"v{i}"}) for i in range(3)]
    names = [c.name for c in TABLES["spans"].insert_columns]
    columns = {name: [row[name] for row in rows] for name in names}
    columns["start_time"] = np.array([r["start_time"] for r in rows], dtype=np.int64)  # numpy, ns
    columns["duration_ns"] = np.array([r["duration_ns"] for r in rows], dtype=np.int64)
    columns["name"] = pa.array(["a", "b", "c"])  # Arrow, in the column's shape
    columns["trace_id"] = [rows[0]["trace_id"]] * 3
    assert backend_store.insert("spans", Columns(columns, 3), tag="tests.columns") == 3
    table = backend_store.query_arrow(
        "SELECT toString(span_id) AS span_id, toInt64(toUnixTimestamp64Nano(start_time)) AS ns, duration_ns, name,"
        " ttft_ns, attributes['k'] AS k FROM spans ORDER BY span_id", tag="tests.arrow")
    assert table.column_names == ["span_id", "ns", "duration_ns", "name", "ttft_ns", "k"]
    assert table.column("ns").to_pylist() == [BASE_NS, BASE_NS + 1, BASE_NS + 2]
    assert table.column("name").to_pylist() == ["a", "b", "c"]
    assert table.column("ttft_ns").to_pylist() == [None, 1, None]
    assert table.column("k").to_pylist() == ["v0", "v1", "v2"]
    assert table.column("duration_ns").type == pa.uint64()
    del columns["status"]
    with pytest.raises(StoreError, match="lacks column 'status'"):
        backend_store.insert("spans", Columns(columns, 3), tag="tests.columns")
    empty = backend_store.query_arrow("SELECT 1 AS x WHERE 0", tag="tests.arrow")
    assert empty.num_rows == 0


def test_an_embedded_insert_declares_nullable_only_what_holds_a_null(clickhouse_store):
    """chdb types an insert's source from its Arrow schema: a field without a null is declared not
    nullable (so the insert converts nothing back), one with a null stays nullable, and what is
    stored is the same either way."""
    import pyarrow as pa

    from store import backends

    if not isinstance(clickhouse_store.backend, EmbeddedBackend):
        pytest.skip("the embedded backend's Arrow source")
    names = [c.name for c in TABLES["spans"].insert_columns]
    types = [c.type for c in TABLES["spans"].insert_columns]
    rows = [_span_row(span_id=f"{i:016x}", ttft_ns=None if i else 7, attributes={"k": "v"},
                      event_times=[BASE_NS], event_names=["e"], event_attributes=[{"a": "b"}]) for i in range(2)]
    loose = backends.arrow_table(names, types, rows)
    tight = backends.tight_schema(loose)
    fields = {f.name: f for f in tight.schema}
    assert fields["ttft_ns"].nullable and fields["cost_usd"].nullable  # a null in each
    assert not fields["span_id"].nullable and not fields["start_time"].nullable
    assert not fields["attributes"].type.item_field.nullable
    assert not fields["event_names"].type.value_field.nullable
    assert tight.to_pylist() == loose.to_pylist()
    assert all(f.nullable for f in loose.schema)  # what the caller keeps is untouched
    inferred = dict(row[:2] for row in clickhouse_store.backend.query("DESCRIBE Python(tight)", None,
                                                                      "tests.describe").rows)
    assert inferred["span_id"] == "String" and inferred["attributes"] == "Map(String, String)"
    assert inferred["ttft_ns"] == "Nullable(UInt64)"
    backends.TIGHT_NULLABILITY = False
    try:
        assert backends.tight_schema(loose) is loose
    finally:
        backends.TIGHT_NULLABILITY = True
    clickhouse_store.insert("spans", rows, tag="tests.insert")
    stored = clickhouse_store.query("SELECT ttft_ns, cost_usd, attributes, event_names FROM spans ORDER BY span_id",
                                    tag="tests.read").rows
    assert stored == [(7, None, {"k": "v"}, ["e"]), (None, None, {"k": "v"}, ["e"])]


def test_columns_from_tuples_rows_and_parts_of_both():
    """The ingest path's ``Columns``: built from per-row tuples in one transposition, turned back into
    the same rows, and concatenated with batches of rows (the writer's group commit)."""
    from store import Columns

    names = ("a", "b", "m")
    tuples = [(1, "x", {"k": "1"}), (2, "y", {})]
    columns = Columns.from_tuples(names, tuples)
    assert len(columns) == 2 and columns.column("a") == [1, 2] and columns.column("m") == [{"k": "1"}, {}]
    assert isinstance(columns.column("b"), list)  # the native driver takes lists as they are
    rows = [dict(zip(names, t)) for t in tuples]
    assert columns.rows() == rows
    assert Columns.from_rows(names, rows).columns == columns.columns
    empty = Columns.from_tuples(names, [])
    assert len(empty) == 0 and empty.rows() == [] and empty.column("a") == []
    joined = Columns.concat([columns, [{"a": 3, "b": "z", "m": {"q": "r"}, "extra": 0}], empty, columns])
    assert len(joined) == 5 and list(joined.columns) == list(names)
    assert joined.column("a") == [1, 2, 3, 1, 2]
    assert joined.rows()[2] == {"a": 3, "b": "z", "m": {"q": "r"}}  # a row's other keys are not columns


def test_columns_reach_the_native_driver_as_the_rows_would():
    """The native backend hands the driver Python lists: numpy and Arrow columns are turned into
    the values rows would hold (an Arrow map into dicts)."""
    import numpy as np
    import pyarrow as pa

    from store.backends import python_values

    assert python_values(np.array([1, 2], dtype=np.uint64)) == [1, 2]
    maps = pa.MapArray.from_arrays(pa.array([0, 1, 1], type=pa.int32()), pa.array(["m"]), pa.array([3], pa.uint64()))
    assert python_values(maps) == [{"m": 3}, {}]
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 2], type=pa.int32()), pa.array(["a", "b"]))
    assert python_values(lists) == [["a", "b"], []]
    assert python_values(["x"]) == ["x"]
    # times as the integer ns a parsed row holds (the native driver's insert divides them)
    assert python_values(pa.array([5, None], pa.int64()).cast(pa.timestamp("ns", tz="UTC"))) == [5, None]
    times = pa.ListArray.from_arrays(pa.array([0, 1], type=pa.int32()), pa.array([7]).cast(pa.timestamp("ns", tz="UTC")))
    assert python_values(times) == [[7]]


def test_errors_are_wrapped_and_name_the_caller(backend_store):
    with pytest.raises(StoreError) as caught:
        backend_store.query("SELECT no_such_function(1)", tag="tests.broken_query")
    assert caught.value.tag == "tests.broken_query"
    assert "no_such_function" in str(caught.value) and "[tests.broken_query]" in str(caught.value)
    assert caught.value.__cause__ is not None  # re-raised from the driver's error
    with pytest.raises(StoreError, match="lacks column 'name'"):
        row = _span_row()
        del row["name"]
        backend_store.insert("spans", [row], tag="tests.bad_row")
    with pytest.raises(StoreError, match="unknown table"):
        backend_store.insert("nope", [{"a": 1}], tag="tests.bad_table")


def test_queries_carry_their_tag_to_the_server(backend_store):
    seen = backend_store.query(
        "SELECT query FROM system.processes WHERE is_initial_query AND query LIKE '%tests.tagged%'",
        tag="tests.tagged.selector",
    ).scalar()
    assert seen.startswith("/* tracedash:tests.tagged.selector */ SELECT")


def test_threads_each_get_correct_parameter_substitutions(backend_store):
    errors = []

    def worker(n):
        try:
            for k in range(40):
                value = n * 1000 + k
                got = backend_store.query("SELECT {v:UInt32} AS v, {s:String} AS s", {"v": value, "s": str(value)},
                                          tag="tests.threads").rows
                if got != [(value, str(value))]:
                    errors.append((value, got))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_connections_follow_the_calls_running_at_once_not_the_threads_that_made_them(backend_store):
    """A web server runs each page request in a thread of its own: a store that kept a connection
    per thread opened one more on every request and kept them all (the embedded server's memory
    grew ~170 MiB a minute under four polling users). Calls borrow from a pool instead."""
    pool = backend_store.backend._pool
    for n in range(60):  # sixty short-lived threads, one after another
        thread = threading.Thread(target=backend_store.query, args=("SELECT {n:UInt32}", {"n": n}),
                                  kwargs={"tag": "tests.pool"})
        thread.start()
        thread.join()
    assert pool.open == 1

    barrier = threading.Barrier(6)

    def together():
        barrier.wait()
        backend_store.query("SELECT sleep(0.2)", tag="tests.pool")

    for _ in range(3):  # six at once, three times over: the same six connections serve each round
        threads = [threading.Thread(target=together) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert 1 < pool.open <= 6
    assert pool.idle == pool.open


def test_a_pool_keeps_at_most_max_idle_connections_and_closes_the_rest():
    from store.backends import ConnectionPool

    made, closed = [], []

    def make():
        made.append(object())
        return made[-1]

    pool = ConnectionPool(make, closed.append, max_idle=2)
    lent = [pool.take() for _ in range(4)]
    assert pool.open == 4 and pool.idle == 0
    for conn in lent:
        pool.give(conn)
    assert pool.idle == 2 and pool.open == 2 and closed == lent[2:]
    assert pool.take() is lent[1]  # the most recently given back
    assert pool.drain() == [lent[0]] and pool.open == 1


def test_unreachable_server_raises_store_unavailable():
    # A closed local port: the native backend must fail fast with the project's own error.
    url = parse_clickhouse_url("clickhouse://default@127.0.0.1:1/db?connect_timeout=1")
    unreachable = Store(NativeBackend(url))
    with pytest.raises(StoreUnavailable, match="unreachable"):
        unreachable.ping()
