"""The store's own periodic work (beat entry ``store-release-memory``, embedded mode only)."""

from __future__ import annotations

from celery import shared_task

from . import get_store


@shared_task(name="store.tasks.release_memory", ignore_result=True)
def release_memory() -> bool:
    """Return the memory the embedded ClickHouse has freed to the system (Store.release_memory)."""
    return get_store().release_memory()
