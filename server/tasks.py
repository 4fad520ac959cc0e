"""The analytics' Celery tasks (named ``analytics.tasks.*``): thin wrappers over the summariser, rollup and retention services (beat entries
``traces-summarize``, ``rollups-update`` and ``retention-enforce`` in settings.CELERY_BEAT_SCHEDULE).

Each run works project by project under per-project leases (``server.leases``): when several
workers (or several beats) run the same task at once, they share the projects between them and
never summarise, roll up or expire one project twice at the same time; a crashed worker's leases
expire and another worker takes its projects over."""

from __future__ import annotations

from celery import shared_task

from server.leases import run_by_project

from analytics import retention_services, rollup_services, summarizer

RETENTION_LEASE_SECONDS = 900  # a project's deletes may take a while on a large table


@shared_task(name="analytics.tasks.summarize_traces", ignore_result=True)
def summarize_traces() -> dict:
    total = summarizer.SummarizeReport()

    def work(project_ids):
        report = summarizer.traces_summarize(project_ids=project_ids)
        total.projects += report.projects
        total.traces += report.traces
        total.spans += report.spans
        total.seconds += report.seconds

    run_by_project(summarizer.SUMMARIZE_LEASE, work)
    return {"projects": total.projects, "traces": total.traces, "spans": total.spans, "seconds": total.seconds}


@shared_task(name="analytics.tasks.update_rollups", ignore_result=True)
def update_rollups() -> dict:
    total = rollup_services.RollupReport()

    def work(project_ids):
        report = rollup_services.rollups_update(project_ids=project_ids)
        total.projects += report.projects
        total.minutes += report.minutes
        total.hours += report.hours
        total.days += report.days
        total.seconds += report.seconds

    run_by_project("rollups-update", work)
    return {"projects": total.projects, "minutes": total.minutes, "hours": total.hours, "days": total.days,
            "seconds": total.seconds}


@shared_task(name="analytics.tasks.enforce_retention", ignore_result=True)
def enforce_retention() -> dict:
    total = retention_services.RetentionReport()

    def work(project_ids):
        report = retention_services.retention_enforce(project_ids=project_ids)
        total.projects += report.projects
        total.statements += report.statements
        total.seconds += report.seconds

    run_by_project("retention-enforce", work, seconds=RETENTION_LEASE_SECONDS)
    return {"projects": total.projects, "statements": total.statements, "seconds": total.seconds}
