"""``python manage.py summarize_traces --project NAME [--days N | --since ISO [--until ISO]]``:
(re)build the per-trace summaries and the minute/hour/day rollups of a time range, with progress.

For data loaded in bulk, or to apply a changed price table to the past. The periodic tasks keep
both up to date on their own; this command runs the same services over a range. It opens the
ClickHouse store, so in the embedded mode run it while the server is stopped.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

from django.core.management.base import BaseCommand, CommandError

from projects.models import Project

NS = 1_000_000_000


def _when(text: str, option: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(f"{option}: expected an ISO 8601 time such as 2026-11-01T00:00:00Z, got {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _bar(label: str, done: float, total: float, started: float, extra: str = "") -> None:
    width = 30
    share = done / total if total else 1.0
    filled = int(width * share)
    elapsed = time.monotonic() - started
    eta = elapsed / share - elapsed if share > 0 else 0
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {share:6.1%}  {extra}  ~{eta:4.0f}s left ")
    sys.stderr.flush()


class Command(BaseCommand):
    help = "(Re)build per-trace summaries and rollups of a project over a time range, with progress."

    def add_arguments(self, parser):
        parser.add_argument("--project", required=True, help="project name or id")
        parser.add_argument("--days", type=float, default=None, help="the last N days (default 1 when no --since)")
        parser.add_argument("--since", default=None, help="start (ISO 8601, UTC when no offset)")
        parser.add_argument("--until", default=None, help="end (ISO 8601; default now)")
        parser.add_argument("--rollups-only", action="store_true", help="keep the summaries, rebuild the rollups")

    def handle(self, *args, project, days, since, until, rollups_only, **options):
        from analytics.rollup_services import rollups_rebuild
        from analytics.summarizer import traces_rebuild

        target = Project.objects.filter(pk=int(project)).first() if project.isdigit() else None
        target = target or Project.objects.filter(name=project).first()
        if target is None:
            raise CommandError(f"no project named (or numbered) {project!r}")
        end = _when(until, "--until") if until else datetime.now(timezone.utc)
        if since and days is not None:
            raise CommandError("give --since or --days, not both")
        start = _when(since, "--since") if since else end - timedelta(days=days if days is not None else 1)
        if not start < end:
            raise CommandError("the start must be before the end")
        from_ns, to_ns = int(start.timestamp() * NS), int(end.timestamp() * NS)
        self.stdout.write(f"project {target.name} (id {target.pk}): {start:%Y-%m-%d %H:%M:%S} → {end:%Y-%m-%d %H:%M:%S} UTC")
        traces = 0
        if not rollups_only:
            started = time.monotonic()
            # the rollups of the range are rebuilt next, so the rollup task need not redo them
            traces = traces_rebuild(project_id=target.pk, from_ns=from_ns, to_ns=to_ns, mark_dirty=False,
                                    progress=lambda done, total, n: _bar("summaries", done, total, started, f"{n:,} traces"))
            sys.stderr.write("\n")
        started = time.monotonic()
        minutes = rollups_rebuild(project_id=target.pk, from_ns=from_ns, to_ns=to_ns,
                                  progress=lambda done, total: _bar("rollups  ", done, total, started, f"day {done}/{total}"))
        sys.stderr.write("\n")
        self.stdout.write(f"summarised {traces:,} traces; recomputed {minutes:,} minutes and their hours and days")
