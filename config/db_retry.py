"""Writes that must not be lost to SQLite's "database (or table) is locked" answer.

The embedded mode's metadata database is SQLite: one writer at a time, and threads of one process
(a lease release, a load test's progress) can meet another writer for longer than the busy
timeout, and where the database is shared-cache (the tests' in-memory one) a read can meet a
writer's table lock too. PostgreSQL never answers so; there the call runs once.
"""

from __future__ import annotations

import time

from django.db import OperationalError


def retry_locked(write, attempts: int = 40, pause: float = 0.05):
    """Run ``write``, again while SQLite answers that the database (or table) is locked."""
    for attempt in range(attempts):
        try:
            return write()
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(pause)
