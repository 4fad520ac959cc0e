"""The store's own periodic work (beat entry ``store-release-memory``, embedded mode only)."""

from __future__ import annotations

from celery import shared_task

from config import memory

from . import get_store


@shared_task(name="store.tasks.release_memory", ignore_result=True)
def release_memory() -> bool:
    """Return the memory the process has freed to the system: what the embedded ClickHouse freed
    (Store.release_memory) and what Python's threads freed into glibc's arenas (config.memory.trim)."""
    trimmed = memory.trim()
    return get_store().release_memory() or trimmed
