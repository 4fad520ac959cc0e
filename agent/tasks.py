"""The embedded server's in-process sampler: the local machine's resources, recorded for each
project of this installation, so the Resources page shows the local machine out of the box.

The samples go through the ingestion service any agent's ``POST /api/v1/resources`` goes through
(``ingest.services.resource_samples_ingest``: the same validation, group-commit writer and spool,
live event), as the JSON objects an agent would send (``agent.sampler.sample_payload``)."""

from __future__ import annotations

import logging
import threading

from celery import shared_task

from ingest.services import resource_samples_ingest
from projects.models import Project

from .sampler import ResourceSampler, sample_payload

log = logging.getLogger("tracedash.agent")

_sampler: ResourceSampler | None = None
_sampler_lock = threading.Lock()


def local_sampler() -> ResourceSampler:
    global _sampler
    with _sampler_lock:
        if _sampler is None:
            _sampler = ResourceSampler()
    return _sampler


def resource_samples_record(*, rows: list[dict], project_ids: list[int]) -> int:
    """Sampler rows, ingested into each project as an agent's samples are; the rows stored."""
    samples = [sample_payload(row) for row in rows]
    count = 0
    for pid in project_ids:
        stored, rejected = resource_samples_ingest(project_id=pid, samples=samples)
        count += len(stored)
        if rejected:
            log.warning("the local sampler's samples were rejected for project %s: %s", pid, rejected)
    return count


@shared_task(name="agent.tasks.sample_local_host", ignore_result=True)
def sample_local_host() -> int:
    project_ids = list(Project.objects.values_list("pk", flat=True))
    if not project_ids:
        return 0
    return resource_samples_record(rows=local_sampler().sample(), project_ids=project_ids)
