"""The embedded server's in-process sampler: the local machine's resources, recorded for each
project of this installation, so the Resources page shows the local machine out of the box (and
any host added by ``sampler_add``: the demo's simulated GPU hosts); and
the inference engines it is told to scrape (``TRACEDASH_SCRAPE``, and the demo's simulator), so
the Engines page shows them.

The samples go through the ingestion services any agent's ``POST /api/v1/resources`` and
``POST /api/v1/engine_samples`` go through (``ingest.services``: the same validation, group-commit
writer and spool, live event), as the JSON objects an agent would send (``agent.sampler.sample_payload``,
``agent.engines``)."""

from __future__ import annotations

import logging
import socket
import threading

from celery import shared_task
from django.conf import settings

from ingest.services import ENGINE_SAMPLES, RESOURCE_SAMPLES, samples_ingest
from projects.models import Project

from .sampler import ResourceSampler, sample_payload
from .scrape import EngineScraper

log = logging.getLogger("tracedash.agent")

_sampler: ResourceSampler | None = None
_scraper: EngineScraper | None = None
_extra_targets: list[str] = []
_extra_samplers: list[ResourceSampler] = []  # more hosts sampled each round (the demo's simulated GPU hosts)
_lock = threading.Lock()


def local_sampler() -> ResourceSampler:
    global _sampler
    with _lock:
        if _sampler is None:
            _sampler = ResourceSampler()
    return _sampler


def scrape_target_add(spec: str) -> None:
    """Scrape one more engine from the next round on (the demo's simulator, started by ``serve``)."""
    global _scraper
    with _lock:
        if spec not in _extra_targets:
            _extra_targets.append(spec)
            _scraper = None


def scrape_target_remove(spec: str) -> None:
    global _scraper
    with _lock:
        if spec in _extra_targets:
            _extra_targets.remove(spec)
            _scraper = None


def sampler_add(sampler: ResourceSampler) -> None:
    """Sample one more host each round from the next one on, beside the local machine (``serve``
    adds the demo's simulated GPU hosts, ``demo.gpus``); its rows are ingested as the local ones."""
    with _lock:
        if sampler not in _extra_samplers:
            _extra_samplers.append(sampler)


def sampler_remove(sampler: ResourceSampler) -> None:
    with _lock:
        if sampler in _extra_samplers:
            _extra_samplers.remove(sampler)


def local_scraper() -> EngineScraper:
    global _scraper
    with _lock:
        if _scraper is None:
            targets = list(dict.fromkeys([*settings.ENV.scrape_targets, *_extra_targets]))
            _scraper = EngineScraper(targets, host=socket.gethostname())
        return _scraper


def resource_samples_record(*, rows: list[dict], project_ids: list[int]) -> int:
    """Sampler rows, ingested into each project as an agent's samples are (one insert for all); the
    rows stored."""
    return _record(RESOURCE_SAMPLES, [sample_payload(row) for row in rows], project_ids, "the local sampler's samples")


def engine_samples_record(*, samples: list[dict], project_ids: list[int]) -> int:
    """Scraped engine samples, ingested into each project as an agent's are (one insert for all);
    the rows stored."""
    return _record(ENGINE_SAMPLES, samples, project_ids, "scraped engine samples")


def _record(kind, samples: list[dict], project_ids: list[int], what: str) -> int:
    count = 0
    for pid, (stored, rejected) in samples_ingest(kind, project_ids=project_ids, samples=samples).items():
        count += len(stored)
        if rejected:
            log.warning("%s were rejected for project %s: %s", what, pid, rejected[:3])
    return count


@shared_task(name="agent.tasks.sample_local_host", ignore_result=True)
def sample_local_host() -> int:
    project_ids = list(Project.objects.values_list("pk", flat=True))
    if not project_ids:
        return 0
    rows = local_sampler().sample()
    with _lock:
        extra = list(_extra_samplers)
    for sampler in extra:
        try:
            rows.extend(sampler.sample())
        except Exception:  # noqa: BLE001 - another host's sampler must not stop the local one's samples
            log.exception("sampling %s failed", sampler.host)
    count = resource_samples_record(rows=rows, project_ids=project_ids)
    scraper = local_scraper()
    if scraper:
        samples = scraper.scrape()
        if samples:
            count += engine_samples_record(samples=samples, project_ids=project_ids)
    return count
