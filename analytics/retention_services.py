"""Per-project retention: delete a project's rows older than its ``retention_days``.

The ClickHouse TTL of each table (``TRACEDASH_RETENTION_DAYS``, store.schema) stays the global
upper bound and drops whole day partitions. A project whose retention is shorter has its older
rows removed here, table by table, with a lightweight ``DELETE`` (chdb and a server take the same
statement; a partition holds every project's day, so it cannot be dropped for one project).
Run daily by the beat entry ``retention-enforce`` (server.tasks, task name analytics.tasks.enforce_retention).

Rollup buckets are deleted when the bucket starts before the cutoff, so nothing older than the
retention stays visible in any aggregate either (the hour, six-hour and day rollups outlive the
global retention on purpose; a project that asks for less gets less there too).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.conf import settings

from projects.models import Project
from store import get_store
from store.schema import TABLES

log = logging.getLogger("tracedash.retention")

NS = 1_000_000_000
DAY_NS = 86400 * NS

# Each project-scoped table and the column its age is measured by.
RETENTION_COLUMNS: dict[str, str] = {
    "spans": "start_time",
    "span_logs": "time",
    "resource_samples": "time",
    "engine_samples": "time",
    "scores": "time",
    "traces": "start_time",
    "traces_by_start": "start_time",
    "span_key_values": "start_time",
    "rollup_minute": "bucket",
    "rollup_hour": "bucket",
    "rollup_6h": "bucket",
    "rollup_day": "bucket",
    "rollup_hour_all": "bucket",
    "rollup_6h_all": "bucket",
    "rollup_day_all": "bucket",
    "resource_minute": "bucket",
    "resource_hour": "bucket",
}
# Bookkeeping, not data: dirty-minute marks (3-day TTL), job watermarks, the declared attribute keys.
RETENTION_EXEMPT = frozenset({"rollup_dirty", "task_watermarks", "dim_keys"})


@dataclass
class RetentionReport:
    projects: int = 0  # projects whose retention is shorter than the global one
    statements: int = 0
    seconds: float = 0.0
    cutoffs: dict[int, int] = field(default_factory=dict)  # project id -> cutoff (unix ns)


def effective_retention_days(*, retention_days: int) -> int:
    """What the project gets: its own setting, capped by the global TTL."""
    return max(1, min(int(retention_days), int(settings.TRACEDASH_RETENTION_DAYS)))


def project_data_expire(*, project_id: int, retention_days: int, now_ns: int | None = None) -> int:
    """Delete the project's rows older than ``retention_days`` from every table; returns the cutoff (unix ns)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    cutoff_ns = now_ns - int(retention_days) * DAY_NS
    store = get_store()
    for statement in delete_statements(store.ddl_target):
        store.command(statement, {"project_id": int(project_id), "cutoff": int(cutoff_ns)}, tag="retention.delete")
    return cutoff_ns


def delete_statements(target=lambda table: table) -> list[str]:
    """One lightweight DELETE per table (parameters ``project_id``, ``cutoff`` in unix ns).
    ``target`` names the table to delete from: ``Store.ddl_target``, which on a cluster is the
    ``_local`` table ON CLUSTER (a Distributed table takes no DELETE)."""
    out = []
    for table, column in RETENTION_COLUMNS.items():
        # Compare in the column's kind: DateTime64 columns against the ns cutoff, DateTime
        # (rollup buckets) against whole seconds.
        if TABLES[table].column_types()[column].startswith("DateTime64"):
            condition = f"{column} < fromUnixTimestamp64Nano({{cutoff:Int64}}, 'UTC')"
        else:
            condition = f"{column} < toDateTime(intDiv({{cutoff:Int64}}, {NS}), 'UTC')"
        out.append(f"DELETE FROM {target(table)} WHERE project_id = {{project_id:UInt64}} AND {condition}")
    return out


def retention_enforce(*, project_ids: list[int] | None = None, now_ns: int | None = None) -> RetentionReport:
    """Apply every project's retention shorter than the global one (the TTL does the rest)."""
    started = time.monotonic()
    report = RetentionReport()
    projects = Project.objects.filter(retention_days__lt=int(settings.TRACEDASH_RETENTION_DAYS)).order_by("pk")
    if project_ids is not None:
        projects = projects.filter(pk__in=project_ids)
    for project_id, retention_days in projects.values_list("pk", "retention_days"):
        report.cutoffs[project_id] = project_data_expire(
            project_id=project_id, retention_days=effective_retention_days(retention_days=retention_days),
            now_ns=now_ns)
        report.projects += 1
        report.statements += len(RETENTION_COLUMNS)
    report.seconds = time.monotonic() - started
    log.info("retention: %d project(s), %d delete(s), %.2fs", report.projects, report.statements, report.seconds)
    return report
