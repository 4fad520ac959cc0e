"""Numbered ClickHouse migrations, applied once each and recorded in ``schema_migrations``.

A migration is a module ``store/clickhouse_migrations/NNNN_name.py`` with a function
``statements(ctx) -> list[str]``. Statements must be idempotent (``IF NOT EXISTS``/``IF EXISTS``)
so a run interrupted half-way can simply run again; ``ctx.on_cluster`` and
``ctx.create(table)`` give the ``ON CLUSTER`` variant when a cluster is configured.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType

from .client import Store
from .schema import Table

MIGRATIONS_PACKAGE = "store.clickhouse_migrations"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+$")


@dataclass(frozen=True)
class MigrationContext:
    retention_days: int
    cluster: str | None = None

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER `{self.cluster}`" if self.cluster else ""

    def create(self, table: Table) -> str:
        return table.create_sql(retention_days=self.retention_days, cluster=self.cluster)


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


def _ensure_table(store: Store, ctx: MigrationContext) -> None:
    engine = "ReplacingMergeTree(applied_at)"
    if ctx.cluster:
        engine = "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/schema_migrations', '{replica}', applied_at)"
    store.command(
        f"CREATE TABLE IF NOT EXISTS schema_migrations{ctx.on_cluster} "
        "(name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        f"ENGINE = {engine} ORDER BY name",
        tag="store.migrator.ensure_table",
    )


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
