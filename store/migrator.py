"""Numbered ClickHouse migrations, applied once each and recorded in ``schema_migrations``.

A migration is a module ``store/clickhouse_migrations/NNNN_name.py`` with a function
``statements(ctx) -> list[str]``. Statements must be idempotent (``IF NOT EXISTS``/``IF EXISTS``)
so a run interrupted half-way can simply run again. Statements are built through the context, which
knows the cluster layout: ``ctx.create(table)`` (a list: on a cluster the ``<name>_local``
Replicated… table and the ``Distributed`` table under the canonical name), ``ctx.alter(table, ...)``
(ALTERs and mutations act on ``<name>_local`` ON CLUSTER; column changes reach the Distributed table
too), ``ctx.local(table)`` (what a materialized view reads and writes) and ``ctx.on_cluster``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType

from .client import Store
from .schema import DEDUP_WINDOW, REPLICATED_DEDUP_WINDOW, Table, ddl_target, local_name

MIGRATIONS_PACKAGE = "store.clickhouse_migrations"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+$")


@dataclass(frozen=True)
class MigrationContext:
    retention_days: int
    cluster: str | None = None
    database: str | None = None  # needed on a cluster: the Distributed tables name it

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER `{self.cluster}`" if self.cluster else ""

    @property
    def dedup_window(self) -> str:
        """The insert-deduplication settings of the tables that keep tokens (store.schema)."""
        return REPLICATED_DEDUP_WINDOW if self.cluster else DEDUP_WINDOW

    def create(self, table: Table) -> list[str]:
        """The table's CREATE statements: one without a cluster; on a cluster the ``_local``
        replicated table and the Distributed table under the canonical name."""
        return table.create_statements(retention_days=self.retention_days, cluster=self.cluster,
                                       database=self.database)

    def local(self, table: str) -> str:
        """The table that stores the rows: what a materialized view reads and writes on a cluster
        (each shard's view fires on that shard's inserts), the table itself otherwise."""
        return local_name(table, self.cluster)

    def alter(self, table: str, clauses: str, *, distributed: bool = False) -> list[str]:
        """``ALTER TABLE`` of the stored rows (``_local`` ON CLUSTER on a cluster). ``distributed``:
        the change is to the columns (ADD COLUMN, a type), which the Distributed table must also
        have, or inserts through it would drop or convert the column."""
        out = [f"ALTER TABLE {ddl_target(table, self.cluster)} {clauses}"]
        if self.cluster and distributed:
            out.append(f"ALTER TABLE {table}{self.on_cluster} {clauses}")
        return out


@dataclass(frozen=True)
class Migration:
    name: str
    module: ModuleType

    def statements(self, ctx: MigrationContext) -> list[str]:
        return list(self.module.statements(ctx))


def discover() -> list[Migration]:
    package = importlib.import_module(MIGRATIONS_PACKAGE)
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if _NAME.match(info.name):
            found.append(Migration(info.name, importlib.import_module(f"{MIGRATIONS_PACKAGE}.{info.name}")))
    found.sort(key=lambda m: m.name)
    numbers = [m.name[:4] for m in found]
    duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
    if duplicates:
        raise RuntimeError(f"two ClickHouse migrations share the number(s) {', '.join(duplicates)}")
    return found


def ensure_table_sql(ctx: MigrationContext) -> str:
    """``schema_migrations``. On a cluster one replication group spans every node (no {shard} in the
    path; {replica} must be unique cluster-wide), so a run from any node sees every record and never
    repeats a migration's backfill."""
    engine = "ReplacingMergeTree(applied_at)"
    if ctx.cluster:
        engine = "ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/schema_migrations', '{replica}', applied_at)"
    return (f"CREATE TABLE IF NOT EXISTS schema_migrations{ctx.on_cluster} "
            "(name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
            f"ENGINE = {engine} ORDER BY name")


def _ensure_table(store: Store, ctx: MigrationContext) -> None:
    store.command(ensure_table_sql(ctx), tag="store.migrator.ensure_table")


def applied_names(store: Store, ctx: MigrationContext) -> set[str]:
    _ensure_table(store, ctx)
    result = store.query("SELECT name FROM schema_migrations FINAL", tag="store.migrator.applied")
    return {row[0] for row in result.rows}


def pending(store: Store, ctx: MigrationContext) -> list[Migration]:
    done = applied_names(store, ctx)
    return [m for m in discover() if m.name not in done]


def migrate(store: Store, ctx: MigrationContext, *, echo=None) -> list[str]:
    """Apply every pending migration in order; returns the names applied."""
    applied = []
    for migration in pending(store, ctx):
        if echo:
            echo(f"Applying {migration.name}…")
        for statement in migration.statements(ctx):
            store.command(statement, tag=f"store.clickhouse_migrations.{migration.name}")
        store.command(
            "INSERT INTO schema_migrations (name) SELECT {name:String}",
            {"name": migration.name},
            tag="store.migrator.record",
        )
        applied.append(migration.name)
    return applied
