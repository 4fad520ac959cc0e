"""The Celery beat schedule, run in a thread of the serving process (embedded mode, no broker).

It reads the same ``CELERY_BEAT_SCHEDULE`` a real ``celery beat`` reads and applies each due task
locally. A failing task is logged with its traceback and retried at its next due time; it never
stops the schedule.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

from celery.schedules import maybe_schedule

log = logging.getLogger("tracedash.beat")


class EmbeddedBeat:
    def __init__(self, app, schedule: dict, *, max_sleep: float = 1.0):
        self.app = app
        app.loader.import_default_modules()  # registers the tasks autodiscover_tasks() found
        self.entries = {
            name: {"task": entry["task"], "schedule": maybe_schedule(entry["schedule"]),
                   "args": entry.get("args", ()), "kwargs": entry.get("kwargs", {})}
            for name, entry in schedule.items()
        }
        self.max_sleep = max_sleep
        self.last_run: dict[str, datetime] = {}
        self.runs: dict[str, int] = {name: 0 for name in self.entries}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self, now: datetime | None = None) -> float:
        """Run every due entry once (each is due at start); return seconds until the next is due."""
        now = now or datetime.now(timezone.utc)
        next_in = self.max_sleep
        for name, entry in self.entries.items():
            if self._stop.is_set():  # stopping: start no further task
                break
            last = self.last_run.get(name)
            due, wait = (True, 0.0) if last is None else entry["schedule"].is_due(last)
            if due:
                self.last_run[name] = now
                self.runs[name] += 1
                try:
                    self.app.tasks[entry["task"]].apply(args=entry["args"], kwargs=entry["kwargs"], throw=True)
                except Exception:  # noqa: BLE001 - visible in the log, the schedule goes on
                    log.exception("scheduled task %s (%s) failed", name, entry["task"])
                wait = entry["schedule"].is_due(now)[1]
            next_in = min(next_in, max(wait, 0.05))
        return next_in

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self.tick())

    def start(self) -> None:
        missing = [e["task"] for e in self.entries.values() if e["task"] not in self.app.tasks]
        if missing:
            raise RuntimeError(f"beat schedule names unknown task(s): {', '.join(missing)}")
        self._thread = threading.Thread(target=self._loop, name="tracedash-beat", daemon=True)
        self._thread.start()
        log.info("embedded beat running %d scheduled task(s) in-process", len(self.entries))

    def request_stop(self) -> None:
        """Start no further task; the one running (if any) finishes. ``stop()`` waits for it."""
        self._stop.set()

    def stop(self, timeout: float = 120.0) -> bool:
        """Stop the schedule and wait for a running task to return (its ClickHouse queries must
        be over before the store closes). True when the thread has ended."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("embedded beat: a scheduled task still runs after %.0f s of waiting", timeout)
            return False
        return True
