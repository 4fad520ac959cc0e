"""The embedded server's in-process sampler: the local machine's resources, recorded for each
project of this installation, so the Resources page shows the local machine out of the box."""

from __future__ import annotations

import threading

from celery import shared_task

from projects.models import Project
from ingest.services import resources_notify
from store import get_store

from .sampler import ResourceSampler

_sampler: ResourceSampler | None = None
_sampler_lock = threading.Lock()


def local_sampler() -> ResourceSampler:
    global _sampler
    with _sampler_lock:
        if _sampler is None:
            _sampler = ResourceSampler()
    return _sampler


def resource_samples_record(*, rows: list[dict], project_ids: list[int]) -> int:
    stamped = [{**row, "project_id": pid} for pid in project_ids for row in rows]
    count = get_store().insert("resource_samples", stamped, tag="agent.resource_samples_record")
    for pid in project_ids:
        resources_notify(project_id=pid, rows=rows)  # open Resources pages redraw
    return count


@shared_task(name="agent.tasks.sample_local_host", ignore_result=True)
def sample_local_host() -> int:
    project_ids = list(Project.objects.values_list("pk", flat=True))
    if not project_ids:
        return 0
    return resource_samples_record(rows=local_sampler().sample(), project_ids=project_ids)
