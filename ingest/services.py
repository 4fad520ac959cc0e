"""Writes of ingested data, and the live event that follows them."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from config.live import group_send

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
