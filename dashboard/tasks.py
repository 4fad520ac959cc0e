"""Celery tasks: thin wrappers over the summariser and rollup services (beat entries
``traces-summarize`` and ``rollups-update`` in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task

from . import rollup_services, summarizer


@shared_task(name="dashboard.tasks.summarize_traces", ignore_result=True)
def summarize_traces() -> dict:
    report = summarizer.traces_summarize()
    return {"projects": report.projects, "traces": report.traces, "spans": report.spans, "seconds": report.seconds}


@shared_task(name="dashboard.tasks.update_rollups", ignore_result=True)
def update_rollups() -> dict:
    report = rollup_services.rollups_update()
    return {"projects": report.projects, "minutes": report.minutes, "hours": report.hours, "days": report.days,
            "seconds": report.seconds}
