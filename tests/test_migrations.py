"""ClickHouse migrations: numbered, recorded, idempotent, with --plan/--check and ON CLUSTER."""

from __future__ import annotations

import secrets
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import store
from store import store_from_settings
from store.migrator import MigrationContext, applied_names, discover, migrate, pending
from store.schema import TABLES

pytestmark = pytest.mark.clickhouse


@pytest.fixture
def fresh_store():
    """A store on a new, empty database (the global store is swapped for the commands)."""
    fresh = store_from_settings(database=f"tracedash_m_{secrets.token_hex(4)}")
    previous = store.set_store(fresh)
    yield fresh
    store.set_store(previous)
    fresh.command(f"DROP DATABASE IF EXISTS `{fresh.database}`", tag="tests.drop")


def test_check_plan_migrate_then_check_again(fresh_store):
    with pytest.raises(CommandError, match="pending ClickHouse migration"):
        call_command("migrate_clickhouse", "--check", stdout=StringIO())

    out = StringIO()
    call_command("migrate_clickhouse", "--plan", stdout=out)
    assert "-- 0001_initial" in out.getvalue()
    assert "CREATE TABLE IF NOT EXISTS spans" in out.getvalue()
    assert "ON CLUSTER" not in out.getvalue()
    assert pending(fresh_store, MigrationContext(retention_days=30))  # --plan applied nothing

    out = StringIO()
    call_command("migrate_clickhouse", stdout=out)
    assert f"Applied {len(discover())} ClickHouse migration(s)" in out.getvalue()
    out = StringIO()
    call_command("migrate_clickhouse", stdout=out)  # idempotent: nothing more to do
    assert "No ClickHouse migrations to apply" in out.getvalue()
    call_command("migrate_clickhouse", "--check", stdout=StringIO())
    assert applied_names(fresh_store, MigrationContext(retention_days=30)) == {m.name for m in discover()}


def test_statements_can_run_twice(fresh_store):
    ctx = MigrationContext(retention_days=30)
    migrate(fresh_store, ctx)
    for migration in discover():  # an interrupted run repeats statements: they must not fail
        for statement in migration.statements(ctx):
            fresh_store.command(statement, tag="tests.rerun")


def test_built_schema_matches_the_table_registry(clickhouse_store):
    for table in TABLES.values():
        result = clickhouse_store.query(
            "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} ORDER BY position",
            {"t": table.name}, tag="tests.columns")
        assert result.rows == [(c.name, c.type) for c in table.columns], table.name
        engine, sorting, partition = clickhouse_store.query(
            "SELECT engine, sorting_key, partition_key FROM system.tables WHERE database = currentDatabase() AND name = {t:String}",
            {"t": table.name}, tag="tests.tables").rows[0]
        assert engine == table.engine.split("(")[0]
        assert sorting.startswith("project_id")  # every read filters by project first
        if table.name == "traces":
            # A summary's start can move when its root arrives late; partitioning by it would
            # leave two versions in two partitions that never merge. TTL deletes rows instead.
            assert partition == ""
        elif "ttl_only_drop_parts = 1" in table.settings:
            assert partition.startswith("toDate(")  # daily partitions: TTL drops whole days


def test_on_cluster_variant_uses_replicated_local_tables_under_distributed_ones():
    ctx = MigrationContext(retention_days=7, cluster="prod_cluster", database="tracedash")
    sql = "\n".join(s for m in discover() for s in m.statements(ctx))
    assert "CREATE TABLE IF NOT EXISTS spans_local ON CLUSTER `prod_cluster`" in sql
    assert ("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/spans_local', '{replica}', ingested_at)"
            in sql)
    assert "ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/resource_samples_local', '{replica}')" in sql
    assert ("CREATE TABLE IF NOT EXISTS spans ON CLUSTER `prod_cluster` AS spans_local\n"
            "ENGINE = Distributed('prod_cluster', 'tracedash', spans_local, cityHash64(trace_id))") in sql
    assert "toIntervalDay(7)" in sql
    # the full cluster DDL is reviewed in tests/golden/cluster (tests/test_cluster_ddl.py)


def test_0018_adds_the_cache_columns_to_a_store_that_predates_it(fresh_store):
    """A store at 0017 (no cache columns, the view without them) is brought to the registry's schema
    by 0018 alone, and the view copies the new column into ``traces_by_start``."""
    from store.schema import SPANS, TRACES, TRACES_BY_START

    ctx = MigrationContext(retention_days=30)
    migrate(fresh_store, ctx)
    before = [c.name for c in TRACES.columns if c.name != "cache"]
    fresh_store.command("DROP VIEW IF EXISTS traces_by_start_mv", tag="tests.downgrade")
    for table in ("spans", "traces", "traces_by_start"):
        fresh_store.command(f"ALTER TABLE {table} DROP COLUMN cache", tag="tests.downgrade")
    fresh_store.command("CREATE MATERIALIZED VIEW traces_by_start_mv TO traces_by_start AS SELECT "
                        + ", ".join(f"`{n}`" for n in before) + " FROM traces", tag="tests.downgrade")
    migration = next(m for m in discover() if m.name.startswith("0018"))
    for statement in migration.statements(ctx):
        fresh_store.command(statement, tag="tests.upgrade")
    for table in (SPANS, TRACES, TRACES_BY_START):
        result = fresh_store.query(
            "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} ORDER BY position",
            {"t": table.name}, tag="tests.columns")
        assert result.rows == [(c.name, c.type) for c in table.columns], table.name
    # A start of now: a row left at the 1970 default is past the TTL and a merge may drop it at once.
    fresh_store.command("INSERT INTO traces (project_id, trace_id, start_time, version, cache)"
                        " VALUES (1, {t:String}, now64(9), 1, 2)", {"t": "a" * 32}, tag="tests.upgrade")
    assert fresh_store.query("SELECT cache FROM traces_by_start WHERE project_id = 1", tag="tests.upgrade").scalar() == 2


def test_0020_span_dims_for_spans_stored_before_it(fresh_store):
    """Spans stored before 0020 (no ``dims`` column in their part) read the same short values as
    spans stored after it: ClickHouse computes the column from their attribute maps. The span
    attribute wins over the resource attribute, empty and over-long values are left out."""
    from store.schema import DIM_VALUE_MAX, SPANS

    ctx = MigrationContext(retention_days=30)
    migrate(fresh_store, ctx)
    fresh_store.command("ALTER TABLE spans DROP INDEX IF EXISTS idx_dims_keys", tag="tests.downgrade")  # 0021 indexes it
    fresh_store.command("ALTER TABLE spans DROP COLUMN dims", tag="tests.downgrade")
    insert = ("INSERT INTO spans (project_id, trace_id, span_id, start_time, attributes, resource_attributes)"
              " SELECT 1, {t:String}, {s:String}, now64(9),"
              " map('tier', 'pro', 'prompt', repeat('x', {long:UInt32}), 'empty', '', 'edge', repeat('y', {edge:UInt32})),"
              " map('tier', 'free', 'host.name', 'gpu-1', 'empty', 'from-resource')")
    params = {"t": "a" * 32, "long": DIM_VALUE_MAX + 1, "edge": DIM_VALUE_MAX}
    fresh_store.command(insert, {**params, "s": "1" * 16}, tag="tests.downgrade")
    migration = next(m for m in discover() if m.name.startswith("0020"))
    for statement in migration.statements(ctx):
        fresh_store.command(statement, tag="tests.upgrade")
    fresh_store.command(insert, {**params, "s": "2" * 16}, tag="tests.upgrade")
    result = fresh_store.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = 'spans' ORDER BY position",
        tag="tests.columns")
    assert result.rows == [(c.name, c.type) for c in SPANS.columns]
    expected = {"tier": "pro", "host.name": "gpu-1", "empty": "from-resource", "edge": "y" * DIM_VALUE_MAX}
    rows = fresh_store.query("SELECT span_id, dims FROM spans ORDER BY span_id", tag="tests.upgrade").rows
    assert [(sid, dict(d)) for sid, d in rows] == [("1" * 16, expected), ("2" * 16, expected)]


def test_0022_retires_the_old_starts_of_summaries_stored_before_it(fresh_store):
    """Summaries written before 0022 left a row under every start a trace had; 0022 retires each of
    them but the latest summary's, so a FINAL read of ``traces_by_start`` (the window reads) sees
    each trace once, at its latest start, and a trace that never moved is left as it was."""
    from analytics import panel_selectors

    ctx = MigrationContext(retention_days=30)
    migrate(fresh_store, ctx)
    moved, still = "a" * 32, "b" * 32
    now_ns = time.time_ns()  # recent starts: a row at the 1970 default is past the TTL
    for trace_id, start_s, version in ((moved, 600, 1), (moved, 60, 3), (moved, 300, 2), (still, 120, 1), (still, 120, 2)):
        fresh_store.command("INSERT INTO traces (project_id, trace_id, start_time, version, has_root, span_count)"
                            " VALUES (1, {t:String}, fromUnixTimestamp64Nano({s:Int64}), {v:UInt64}, 1, 3)",
                            {"t": trace_id, "s": now_ns - start_s * 1_000_000_000, "v": version}, tag="tests.upgrade")
    live = ("SELECT trace_id, version FROM (" + panel_selectors.latest_summaries_sql("trace_id, version", [("lo", "hi")])
            + ") ORDER BY trace_id")
    params = {"project_id": 1, "lo": 0, "hi": 4_102_444_800_000, "service": "", "model": ""}  # 2100-01-01 (ms)
    assert len(fresh_store.query(live, params, tag="tests.upgrade").rows) == 4  # before: every start of `moved`
    migration = next(m for m in discover() if m.name.startswith("0022"))
    for _ in range(2):  # run twice: idempotent
        for statement in migration.statements(ctx):
            fresh_store.command(statement, tag="tests.upgrade")
        assert fresh_store.query(live, params, tag="tests.upgrade").rows == [(moved, 3), (still, 2)]


@pytest.mark.parametrize("migration_name, tables", [("0023", ("spans",)), ("0026", ("traces", "traces_by_start"))])
def test_the_merge_selector_is_set_on_stores_created_before_it(fresh_store, migration_name, tables):
    """A store created by this release has ``merge_selector_base = 20`` on ``spans`` (0023) and on
    the summaries' tables (0026); one created before (ClickHouse's default, 5) gets it from the
    migration, and running it again changes nothing."""
    from store.schema import FEWER_MERGES

    def ddl(table: str) -> str:
        return fresh_store.query(f"SHOW CREATE TABLE {table}", tag="tests.upgrade").rows[0][0]

    ctx = MigrationContext(retention_days=30)
    migrate(fresh_store, ctx)
    assert FEWER_MERGES == "merge_selector_base = 20"
    for table in tables:
        assert "merge_selector_base = 20" in ddl(table)
        fresh_store.command(f"ALTER TABLE {table} MODIFY SETTING merge_selector_base = 5", tag="tests.upgrade")  # as before
        assert "merge_selector_base = 20" not in ddl(table)
    migration = next(m for m in discover() if m.name.startswith(migration_name))
    for _ in range(2):
        for statement in migration.statements(ctx):
            fresh_store.command(statement, tag="tests.upgrade")
        for table in tables:
            assert "merge_selector_base = 20" in ddl(table)
