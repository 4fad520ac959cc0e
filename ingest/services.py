"""Writes of ingested data, and the live event that follows them.

Resource samples take one path whoever sends them: an agent over ``POST /api/v1/resources``
(``ingest.views``) or the embedded server sampling its own host (``agent.tasks``) are both
validated by ``resource_samples_validate``, written through the process's group-commit writer
(ClickHouse, or the fsync'd spool when it cannot take them) and announced with the same
``resources.ingested`` event."""

from __future__ import annotations

import asyncio
import logging

import msgspec
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from config.live import group_send

from .schemas import EngineSamplesIn, SamplesIn, decode_envelope, parse_each, parse_engine_sample, parse_resource_sample
from .writer import Outcome, get_writer

# Live events are best-effort: a Redis that accepts connections but answers nothing (frozen,
# overloaded) must not hold up the acknowledgement of data that is already stored.
LIVE_SEND_TIMEOUT_SECONDS = 0.5

log = logging.getLogger("tracedash.ingest")


def traces_group(project_id: int) -> str:
    return f"project-{int(project_id)}-traces"


def _event(rows: list[dict]) -> dict:
    trace_ids = sorted({row["trace_id"] for row in rows})
    return {"type": "traces.ingested", "spans": len(rows), "trace_ids": trace_ids[:100]}


def _resources_event(rows: list[dict]) -> dict:
    """Resource and engine samples both: the Resources and Engines pages refresh on it."""
    hosts = sorted({str(row["host"]) for row in rows})
    return {"type": "resources.ingested", "samples": len(rows), "hosts": hosts[:100]}


def spans_ingest(*, project_id: int, rows: list[dict]) -> Outcome | None:
    """Store validated span rows of one project (synchronous callers), then announce them."""
    if not rows:
        return None
    outcome = get_writer().write("spans", rows)
    async_to_sync(traces_notify_async)(project_id=project_id, rows=rows)
    return outcome


async def traces_notify_async(*, project_id: int, rows: list[dict]) -> None:
    """Tell open dashboards which traces grew. The data is already stored: a live-update failure
    is logged and never turns into an API error."""
    if not rows:
        return
    try:
        layer = get_channel_layer()
        if layer is not None:
            await asyncio.wait_for(layer.group_send(traces_group(project_id), _event(rows)),
                                   LIVE_SEND_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live update for project %s failed", project_id)


async def resources_notify_async(*, project_id: int, rows: list[dict]) -> None:
    """Tell open dashboards that resource samples of these hosts arrived (same group as traces;
    a live-update failure is logged, never an API error)."""
    if not rows:
        return
    try:
        layer = get_channel_layer()
        if layer is not None:
            await asyncio.wait_for(layer.group_send(traces_group(project_id), _resources_event(rows)),
                                   LIVE_SEND_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live resources update for project %s failed", project_id)


def resources_notify(*, project_id: int, rows: list[dict]) -> None:
    """``resources_notify_async`` for synchronous callers (the embedded sampler task)."""
    if rows:
        group_send(traces_group(project_id), _resources_event(rows), wait=False)


def resource_samples_validate(items: list, *, project_id: int) -> tuple[list[dict], list[dict]]:
    """Raw samples of a ``POST /api/v1/resources`` batch -> (rows, rejected), a rejection naming
    the sample's index, field and what is wrong (the endpoint answers with the same list)."""
    return parse_each(items, lambda item: parse_resource_sample(item, project_id=project_id))


async def resource_samples_store_async(*, project_id: int, rows: list[dict]) -> Outcome | None:
    """Store validated sample rows of one project through the writer, then announce them. The
    writer's refusals (``Overloaded``, ``SpoolFull``, a store error) are raised to the caller."""
    if not rows:
        return None
    outcome = await get_writer().submit_async("resource_samples", rows)
    await resources_notify_async(project_id=project_id, rows=rows)
    return outcome


def resource_samples_ingest(*, project_id: int, samples: list[dict]) -> tuple[list[dict], list[dict]]:
    """The ``POST /api/v1/resources`` ingestion for a synchronous caller in this process (the
    embedded host sampler): ``samples`` as the endpoint's JSON objects (``agent.sampler.sample_payload``)
    are validated by the same parser, stored through the same writer (waiting for it, like a
    request) and announced with the same event (sent onto the serving loop, ``config.live``).
    Returns (rows stored, rejected)."""
    items = decode_envelope(msgspec.json.encode({"samples": samples}), SamplesIn, name="samples")
    rows, rejected = resource_samples_validate(items, project_id=project_id)
    if rows:
        get_writer().write("resource_samples", rows)
        resources_notify(project_id=project_id, rows=rows)
    return rows, rejected


def engine_samples_validate(items: list, *, project_id: int) -> tuple[list[dict], list[dict]]:
    """Raw samples of a ``POST /api/v1/engine_samples`` batch -> (rows, rejected)."""
    return parse_each(items, lambda item: parse_engine_sample(item, project_id=project_id))


async def engine_samples_store_async(*, project_id: int, rows: list[dict]) -> Outcome | None:
    """Store validated engine sample rows through the writer, then announce them (as resources)."""
    if not rows:
        return None
    outcome = await get_writer().submit_async("engine_samples", rows)
    await resources_notify_async(project_id=project_id, rows=rows)
    return outcome


def engine_samples_ingest(*, project_id: int, samples: list[dict]) -> tuple[list[dict], list[dict]]:
    """``POST /api/v1/engine_samples`` for a synchronous caller in this process (the embedded
    server scraping engines): the same parser, writer and event. Returns (rows stored, rejected)."""
    items = decode_envelope(msgspec.json.encode({"samples": samples}), EngineSamplesIn, name="samples")
    rows, rejected = engine_samples_validate(items, project_id=project_id)
    if rows:
        get_writer().write("engine_samples", rows)
        resources_notify(project_id=project_id, rows=rows)
    return rows, rejected
