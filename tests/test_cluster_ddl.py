"""The DDL of every migration, on a cluster and on one server, against reviewed golden files.

``tests/golden/cluster/`` holds what ``TRACEDASH_CLICKHOUSE_CLUSTER`` produces (``<name>_local``
Replicated… tables ON CLUSTER, a ``Distributed`` table under each canonical name, ALTERs on the local
tables) and ``tests/golden/single/`` what the embedded and single-server paths run; the retention
sweep's DELETEs are there too. A change to any generated statement shows up as a diff of these
files in review. Refresh them after an intended change with::

    TRACEDASH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_cluster_ddl.py -q

Every statement, cluster or not, is also parsed by chdb's ClickHouse (``formatQueryOrNull``), the
same release line as the pinned server (docker-compose.yml), so a typo in DDL that this machine
cannot execute (ON CLUSTER, Replicated engines, Distributed) still cannot ship.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from analytics.retention_services import delete_statements
from store.migrator import MigrationContext, discover, ensure_table_sql
from store.schema import DEDUP_WINDOW, REPLICATED_DEDUP_WINDOW, TABLES, ddl_target

GOLDEN = Path(__file__).resolve().parent / "golden"
CLUSTER = "tracedash"  # the name deploy/clickhouse's remote_servers declares (tests/test_cluster_compose.py)
DATABASE = "tracedash"
RETENTION_DAYS = 30
UPDATE = os.environ.get("TRACEDASH_UPDATE_GOLDEN") == "1"
# Tables keyed by trace: one trace's spans, logs, summary (both orders) and scores on one shard.
PER_TRACE = {"spans", "span_logs", "traces", "traces_by_start", "scores"}


def statements_by_file(cluster: str | None) -> dict[str, list[str]]:
    ctx = MigrationContext(retention_days=RETENTION_DAYS, cluster=cluster, database=DATABASE)
    files = {"0000_schema_migrations.sql": [ensure_table_sql(ctx)]}
    for migration in discover():
        files[f"{migration.name}.sql"] = migration.statements(ctx)
    files["retention.sql"] = delete_statements(lambda table: ddl_target(table, cluster))
    return files


def render(statements: list[str]) -> str:
    return "".join(s.rstrip() + ";\n\n" for s in statements)


VARIANTS = {"cluster": CLUSTER, "single": None}
GENERATED = {variant: statements_by_file(cluster) for variant, cluster in VARIANTS.items()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generated_ddl_matches_the_golden_files(variant):
    folder = GOLDEN / variant
    expected = {name: render(statements) for name, statements in GENERATED[variant].items()}
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in set(p.name for p in folder.glob("*.sql")) - set(expected):
            (folder / stale).unlink()
        for name, text in expected.items():
            (folder / name).write_text(text)
    on_disk = {p.name: p.read_text() for p in folder.glob("*.sql")}
    assert sorted(on_disk) == sorted(expected), "golden files missing or stale: refresh with TRACEDASH_UPDATE_GOLDEN=1"
    changed = [name for name in expected if on_disk[name] != expected[name]]
    assert not changed, f"generated DDL differs from tests/golden/{variant}/{changed}: review, then refresh"


@pytest.mark.clickhouse
def test_every_generated_statement_parses(clickhouse_store):
    statements = [s for variant in GENERATED.values() for file in variant.values() for s in file]
    assert len(statements) > 100
    failed = [s for s, bad in zip(statements, _unparsable(clickhouse_store, statements)) if bad]
    assert not failed, f"{len(failed)} statement(s) do not parse, first: {failed[0]}"


@pytest.mark.clickhouse
def test_the_parse_check_catches_a_typo(clickhouse_store):
    good = GENERATED["cluster"]["0001_initial.sql"][1]
    bad = good.replace("ENGINE = Distributed(", "ENGINE = Distributed((")
    assert _unparsable(clickhouse_store, [good, bad]) == [0, 1]


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _unparsable(store, statements: list[str]) -> list[int]:
    """1 for each statement ClickHouse's parser refuses (one query for all of them)."""
    checks = ", ".join(f"formatQueryOrNull({_quoted(s)}) IS NULL" for s in statements)
    return list(store.query(f"SELECT [{checks}]", tag="tests.cluster_ddl.parse").scalar())


def _cluster_sql() -> list[str]:
    return [s for file in GENERATED["cluster"].values() for s in file]


def test_every_table_is_a_local_replicated_table_and_a_distributed_table():
    creates = [s for s in _cluster_sql() if s.startswith("CREATE TABLE")]
    for table in TABLES.values():
        local = [s for s in creates if s.startswith(f"CREATE TABLE IF NOT EXISTS {table.name}_local ON CLUSTER `{CLUSTER}`\n")]
        assert len(local) == 1, table.name
        engine = re.search(r"^ENGINE = (.*)$", local[0], re.M).group(1)
        assert engine.startswith(f"Replicated{table.engine.split('(')[0]}('/clickhouse/tables/{{shard}}/{{database}}/"
                                 f"{table.name}_local', '{{replica}}'"), engine
        distributed = [s for s in creates if s.startswith(f"CREATE TABLE IF NOT EXISTS {table.name} ON CLUSTER")]
        assert distributed == [
            f"CREATE TABLE IF NOT EXISTS {table.name} ON CLUSTER `{CLUSTER}` AS {table.name}_local\n"
            f"ENGINE = Distributed('{CLUSTER}', '{DATABASE}', {table.name}_local, {table.shard_key})"]
        # the Distributed table is created after its local table
        assert creates.index(distributed[0]) > creates.index(local[0])


def test_local_tables_keep_the_single_server_definition():
    for table in TABLES.values():
        single = table.create_sql(retention_days=RETENTION_DAYS)
        local = table.create_sql(retention_days=RETENTION_DAYS, cluster=CLUSTER)
        local = (local.replace(f"{table.name}_local ON CLUSTER `{CLUSTER}`", table.name, 1)
                 .replace("replicated_deduplication_window = 10000, replicated_deduplication_window_seconds = 604800",
                          "non_replicated_deduplication_window = 10000"))
        local = re.sub(r"ENGINE = Replicated(\w+)\('[^']*', '\{replica\}'(?:, )?", r"ENGINE = \1(", local)
        assert local.replace("MergeTree()", "MergeTree") == single, table.name


def test_sharding_keys_keep_a_trace_and_a_merge_key_on_one_shard():
    for name in PER_TRACE:
        assert TABLES[name].shard_key == "cityHash64(trace_id)", name
    for table in TABLES.values():
        assert "rand" not in table.shard_key.lower(), table.name  # a retried batch must split the same way
        columns = re.fullmatch(r"cityHash64\((.*)\)", table.shard_key).group(1).split(", ")
        # Only columns the writer supplies: a DEFAULT (ingested_at, marked_at: now) differs on a
        # retry, which would send a re-sent batch elsewhere and defeat its dedup token.
        assert set(columns) <= {c.name for c in table.insert_columns}, table.name
        key = [c.strip() for c in table.order_by.strip("()").split(",")]
        if "Replacing" in table.engine or "Aggregating" in table.engine:
            assert set(columns) <= set(key), table.name  # the rows that merge (same key) meet on one shard
        if table.engine.startswith("ReplacingMergeTree") and table.name not in PER_TRACE:
            assert columns == key, table.name  # FINAL per shard: every version of a key on one shard


def test_alters_act_on_the_local_tables_on_the_cluster():
    sql = _cluster_sql()
    alters = [s for s in sql if s.startswith(("ALTER", "DELETE", "OPTIMIZE", "TRUNCATE"))]
    assert alters
    for statement in alters:
        assert f"ON CLUSTER `{CLUSTER}`" in statement, statement
        target = re.match(r"(?:ALTER TABLE|DELETE FROM) (\w+)", statement).group(1)
        if not target.endswith("_local"):  # only column changes go to the Distributed table, after the local one
            clauses = statement.split(f"ON CLUSTER `{CLUSTER}` ", 1)[1]
            assert re.fullmatch(r"((ADD|MODIFY) COLUMN .*?)(, (ADD|MODIFY) COLUMN .*)*", clauses, re.S), statement
            assert sql[sql.index(statement) - 1] == statement.replace(f"ALTER TABLE {target} ", f"ALTER TABLE {target}_local ", 1)
    # every ADD COLUMN reaches both tables
    for statement in alters:
        if " ADD COLUMN " in statement and "_local " in statement:
            assert statement.replace("_local ON CLUSTER", " ON CLUSTER", 1) in sql, statement
    assert sum(s.startswith("DELETE FROM") for s in alters) == len(GENERATED["cluster"]["retention.sql"])


def test_materialized_views_join_local_tables_and_backfills_go_through_distributed_tables():
    sql = _cluster_sql()
    views = [s for s in sql if s.startswith("CREATE MATERIALIZED VIEW")]
    assert len(views) == 6
    for view in views:
        target = re.search(r" TO (\w+) AS ", view).group(1)
        source = re.search(r"\bFROM (\w+)", view).group(1)
        assert target.endswith("_local") and source.endswith("_local"), view
        assert TABLES[target[:-6]].shard_key == TABLES[source[:-6]].shard_key, view  # the same shard
    for insert in (s for s in sql if s.startswith("INSERT INTO")):
        assert "_local" not in insert, insert


def test_without_a_cluster_nothing_names_a_cluster():
    for statement in (s for file in GENERATED["single"].values() for s in file):
        assert "ON CLUSTER" not in statement and "_local" not in statement
        assert "Distributed" not in statement and "Replicated" not in statement


def test_a_cluster_needs_the_database_for_its_distributed_tables():
    with pytest.raises(ValueError, match="database"):
        MigrationContext(retention_days=1, cluster=CLUSTER).create(TABLES["spans"])


# --- The cluster layout, executed ---------------------------------------------------------------
# chdb has no Keeper and no DDL worker, so ON CLUSTER and the Replicated engines cannot run here;
# everything else of the cluster DDL can: a one-shard cluster on the process itself (its Distributed
# tables then read and write locally).
LAYOUT_CONFIG = (f"<clickhouse><tcp_port>9000</tcp_port><remote_servers><{CLUSTER}><shard><replica>"
                 f"<host>localhost</host><port>9000</port></replica></shard></{CLUSTER}></remote_servers></clickhouse>")
# Filled by materialized views over local tables: only the views write them in this check.
VIEW_TARGETS = {"traces_by_start": "traces", "resource_minute": "resource_samples", "resource_hour": "resource_minute"}


def _without_keeper(statement: str) -> str:
    statement = statement.replace(f" ON CLUSTER `{CLUSTER}`", "")
    statement = re.sub(r"Replicated(\w*MergeTree)\('[^']*', '\{replica\}'(?:, )?", r"\1(", statement)
    return statement.replace(REPLICATED_DEDUP_WINDOW, DEDUP_WINDOW)


def _value(column) -> str:
    if column.name == "project_id":
        return "1"
    if column.type.startswith("DateTime64("):
        return f"now64({column.type[11]})"
    if column.type.startswith("DateTime("):
        return "toStartOfMinute(now())"
    if column.type.startswith("Array(DateTime64"):
        return "[]"
    return f"defaultValueOfTypeName('{column.type}')"


def _insert(table) -> str:
    columns = table.insert_columns
    return (f"INSERT INTO {table.name} ({', '.join(f'`{c.name}`' for c in columns)}) {{settings}} "
            f"SELECT {', '.join(_value(c) for c in columns)}")


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    import json
    import subprocess
    import sys
    import time

    folder = tmp_path_factory.mktemp("cluster_layout")
    cutoff_ns = (time.time_ns() + 86400 * 10**9)  # tomorrow: every row of project 1 is older
    deletes = [s.replace("{project_id:UInt64}", "1").replace("{cutoff:Int64}", str(cutoff_ns))
               for s in GENERATED["cluster"]["retention.sql"]]
    plan = {
        "config": LAYOUT_CONFIG,
        "statements": [_without_keeper(s) for name, file in GENERATED["cluster"].items() if name != "retention.sql"
                       for s in file],
        "inserts": {name: _insert(t) for name, t in TABLES.items() if name not in VIEW_TARGETS},
        "tables": list(TABLES),
        "deletes": [_without_keeper(s) for s in deletes],
    }
    (folder / "plan.json").write_text(json.dumps(plan))
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "tests/support/cluster_layout.py"), str(folder / "plan.json"),
                           str(folder)], capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_cluster_ddl_runs_and_its_distributed_tables_take_and_return_rows(layout):
    assert layout["error"] is None, layout["error"]
    for name, table in TABLES.items():
        assert layout["counts"][name] == layout["local"][name] >= 1, name  # written through, read back
        if DEDUP_WINDOW in table.settings and name not in VIEW_TARGETS:
            assert layout["counts"][name] == 1, name  # the replayed batch (same token) was dropped


def test_views_on_local_tables_fill_their_targets(layout):
    assert layout["error"] is None, layout["error"]
    for target, source in VIEW_TARGETS.items():
        assert layout["local"][source] >= 1 and layout["local"][target] >= 1, target


def test_retention_deletes_reach_the_rows_behind_the_distributed_tables(layout):
    from analytics.retention_services import RETENTION_COLUMNS, RETENTION_EXEMPT

    assert layout["error"] is None, layout["error"]
    for name in RETENTION_COLUMNS:
        assert layout["after_delete"][name] == 0, name
    for name in RETENTION_EXEMPT:
        assert layout["after_delete"][name] == layout["counts"][name] >= 1, name
