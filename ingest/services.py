"""Writes of ingested data into the store, and the live event that follows them."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from store import get_store

log = logging.getLogger("tracedash.ingest")


def traces_group(project_id: int) -> str:
    return f"project-{int(project_id)}-traces"


def spans_ingest(*, project_id: int, rows: list[dict]) -> int:
    """Store validated span rows of one project; then tell open dashboards which traces grew."""
    if not rows:
        return 0
    get_store().insert("spans", rows, tag="ingest.services.spans_ingest")
    trace_ids = sorted({row["trace_id"] for row in rows})
    _notify(traces_group(project_id), {"type": "traces.ingested", "spans": len(rows), "trace_ids": trace_ids[:100]})
    return len(rows)


def _notify(group: str, event: dict) -> None:
    # The data is already stored: a live-update failure must not turn into an API error.
    try:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group, event)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently
        log.exception("live update to %s failed", group)
