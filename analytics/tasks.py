"""Celery tasks: thin wrappers over the summariser and rollup services (beat entries
``traces-summarize``, ``rollups-update`` and ``retention-enforce`` in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from . import retention_services, rollup_services, summarizer


@shared_task(name="analytics.tasks.summarize_traces", ignore_result=True)
def summarize_traces() -> dict:
    report = summarizer.traces_summarize()
    return {"projects": report.projects, "traces": report.traces, "spans": report.spans, "seconds": report.seconds}


@shared_task(name="analytics.tasks.update_rollups", ignore_result=True)
def update_rollups() -> dict:
    report = rollup_services.rollups_update()
    return {"projects": report.projects, "minutes": report.minutes, "hours": report.hours, "days": report.days,
            "seconds": report.seconds}


@shared_task(name="analytics.tasks.enforce_retention", ignore_result=True)
def enforce_retention() -> dict:
    report = retention_services.retention_enforce()
    return {"projects": report.projects, "statements": report.statements, "seconds": report.seconds}
