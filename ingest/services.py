"""Writes of ingested data, and the live event that follows them."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from .writer import Outcome, get_writer

log = logging.getLogger("tracedash.ingest")


def traces_group(project_id: int) -> str:
    return f"project-{int(project_id)}-traces"


def _event(rows: list[dict]) -> dict:
    trace_ids = sorted({row["trace_id"] for row in rows})
    return {"type": "traces.ingested", "spans": len(rows), "trace_ids": trace_ids[:100]}


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
            await layer.group_send(traces_group(project_id), _event(rows))
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
            hosts = sorted({str(row["host"]) for row in rows})
            await layer.group_send(traces_group(project_id),
                                   {"type": "resources.ingested", "samples": len(rows), "hosts": hosts[:100]})
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live resources update for project %s failed", project_id)


# The event loop that serves the websockets (set by the consumer when a page connects). The
# in-memory channel layer's queues belong to that loop: a sync caller on another thread (the
# embedded sampler) hands the send to it instead of running it on a loop of its own, where the
# waiting consumer would not be woken until something else stirred its loop.
_live_loop: asyncio.AbstractEventLoop | None = None


def live_loop_register(loop: asyncio.AbstractEventLoop) -> None:
    global _live_loop
    _live_loop = loop


def resources_notify(*, project_id: int, rows: list[dict]) -> None:
    """``resources_notify_async`` for synchronous callers (the embedded sampler task)."""
    loop = _live_loop
    if loop is not None and loop.is_running() and not loop.is_closed():
        asyncio.run_coroutine_threadsafe(resources_notify_async(project_id=project_id, rows=rows), loop)
    else:
        async_to_sync(resources_notify_async)(project_id=project_id, rows=rows)
