"""The Celery beat schedule, run in a thread of the serving process (embedded mode, no broker).

It reads the same ``CELERY_BEAT_SCHEDULE`` a real ``celery beat`` reads and applies each due task
locally. A failing task is logged with its traceback and retried at its next due time; it never
stops the schedule.

Entries named in ``own_thread`` run in a thread of their own, the rest one after another in a
shared one: the summariser (every 2 s) must not wait behind a rollup or an alert round that takes
seconds under load, or a trace's summary appears late (``bench/summary_lag.py``). In production
Celery workers run the tasks concurrently as well; every task is idempotent.

The beat's threads run at a lower CPU priority (``nice``: ``TRACEDASH_BACKGROUND_NICE`` in ``serve``;
config.priority): on a busy machine the cores go to the requests first and the beat takes what they
leave. Its work waits, it is not dropped; the threads its tasks start inherit the priority.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

from celery.schedules import maybe_schedule

from config import priority

log = logging.getLogger("tracedash.beat")


class EmbeddedBeat:
    def __init__(self, app, schedule: dict, *, max_sleep: float = 1.0, own_thread: tuple[str, ...] = (),
                 nice: int = 0):
        self.app = app
        self.nice = nice
        app.loader.import_default_modules()  # registers the tasks autodiscover_tasks() found
        self.entries = {
            name: {"task": entry["task"], "schedule": maybe_schedule(entry["schedule"]),
                   "args": entry.get("args", ()), "kwargs": entry.get("kwargs", {})}
            for name, entry in schedule.items()
        }
        self.max_sleep = max_sleep
        own = [name for name in own_thread if name in self.entries]
        shared = [name for name in self.entries if name not in own]
        self.lanes = [lane for lane in [shared] + [[name] for name in own] if lane]
        self.last_run: dict[str, datetime] = {}
        self.runs: dict[str, int] = {name: 0 for name in self.entries}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def tick(self, now: datetime | None = None, names=None) -> float:
        """Run every due entry (of ``names``; default all) once, each due at start; return seconds
        until the next is due."""
        now = now or datetime.now(timezone.utc)
        next_in = self.max_sleep
        for name in names if names is not None else list(self.entries):
            entry = self.entries[name]
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

    def _loop(self, names: list[str]) -> None:
        priority.name_thread()
        priority.lower(self.nice)
        while not self._stop.is_set():
            self._stop.wait(self.tick(names=names))

    def start(self) -> None:
        missing = [e["task"] for e in self.entries.values() if e["task"] not in self.app.tasks]
        if missing:
            raise RuntimeError(f"beat schedule names unknown task(s): {', '.join(missing)}")
        for n, lane in enumerate(self.lanes):
            thread = threading.Thread(target=self._loop, args=(lane,), daemon=True,
                                      name="tracedash-beat" if n == 0 else f"tracedash-beat-{lane[0]}")
            self._threads.append(thread)
            thread.start()
        log.info("embedded beat running %d scheduled task(s) in-process (%d thread(s))", len(self.entries),
                 len(self.lanes))

    def request_stop(self) -> None:
        """Start no further task; the one running (if any) finishes. ``stop()`` waits for it."""
        self._stop.set()

    def stop(self, timeout: float = 120.0) -> bool:
        """Stop the schedule and wait for a running task to return (its ClickHouse queries must
        be over before the store closes). True when the thread has ended."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            log.warning("embedded beat: a scheduled task still runs after %.0f s of waiting", timeout)
            return False
        return True
