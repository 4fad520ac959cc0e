"""The analytics' Celery tasks (named ``analytics.tasks.*``): thin wrappers over the summariser, rollup and retention services (beat entries
``traces-summarize``, ``rollups-update`` and ``retention-enforce`` in settings.CELERY_BEAT_SCHEDULE).

Each run works project by project under per-project leases (``server.leases``): when several
workers (or several beats) run the same task at once, they share the projects between them and
never summarise, roll up or expire one project twice at the same time; a crashed worker's leases
expire and another worker takes its projects over."""

from __future__ import annotations

from dataclasses import fields

from celery import shared_task

from server.leases import run_by_project

from analytics import attribute_index, retention_services, rollup_services, summarizer

RETENTION_LEASE_SECONDS = 900  # a project's deletes may take a while on a large table


def _numbers(report) -> dict[str, int | float]:
    return {f.name: getattr(report, f.name) for f in fields(report) if isinstance(getattr(report, f.name), (int, float))}


def _by_project(job: str, run, empty, **lease) -> dict:
    """``run(project_ids=…)`` over every project under ``job``'s per-project leases; the numeric
    fields of its reports (projects, counts, seconds), summed over the batches, starting from
    those of ``empty`` (the answer when no project was worked on)."""
    total = _numbers(empty)

    def work(project_ids):
        for name, value in _numbers(run(project_ids=project_ids)).items():
            total[name] += value

    run_by_project(job, work, **lease)
    return total


@shared_task(name="analytics.tasks.summarize_traces", ignore_result=True)
def summarize_traces() -> dict:
    return _by_project(summarizer.SUMMARIZE_LEASE, summarizer.traces_summarize, summarizer.SummarizeReport())


@shared_task(name="analytics.tasks.update_rollups", ignore_result=True)
def update_rollups() -> dict:
    return _by_project("rollups-update", rollup_services.rollups_update, rollup_services.RollupReport())


@shared_task(name="analytics.tasks.enforce_retention", ignore_result=True)
def enforce_retention() -> dict:
    return _by_project("retention-enforce", retention_services.retention_enforce, retention_services.RetentionReport(),
                       seconds=RETENTION_LEASE_SECONDS)


@shared_task(name="analytics.tasks.index_attributes", ignore_result=True)
def index_attributes() -> dict:
    """Backfill the attribute keys declared since the last run (analytics.attribute_index)."""
    return _by_project("attribute-index", attribute_index.index_backfill, attribute_index.IndexReport())
