"""The minutes whose rollups a summariser run changed (``rollup_dirty``), held in memory between the
summariser's stored watermarks where the store is this process's alone.

The incremental summariser marks the minutes it wrote summaries in (and moved summaries out of) on
every run, every 2 s under traffic, and the rollup task (every 10 s) recomputes the marked minutes.
On a server the marks are rows of ``rollup_dirty``: the summariser and the rollups may run in
different processes. On the embedded store both run in this process, and inserting each run's few
marks cost a statement and a part, to be merged, every run: 5.5-8.3 ms of CPU a second under load
(docs/BENCHMARKS.md, "2026-12-07, evening: the summaries' merges, the statements a run no longer
makes, ..."). There a run's
marks are held here instead (``add``), and the rollup task takes them from here as well as from the
table (``taken``; ``done`` once the minutes are recomputed).

Nothing is lost when the process stops: the marks still held are inserted into ``rollup_dirty``
(``flush``) just before the summariser stores its watermark (analytics.summarizer.watermark_set: at
most every ``analytics.watermarks.STORE_EVERY_MS`` of progress on the embedded store). A restart
summarises again every trace since the watermark stored, and so marks again every minute whose marks
it did not find in the table; the minutes before it had their marks stored or recomputed.
"""

from __future__ import annotations

import threading

TAG = "analytics.summarizer.mark_dirty"


class HeldMarks:
    """Per project, the minutes marked and not yet stored or recomputed, each with the sequence
    number of its latest mark (a minute marked again after the rollups took it stays)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._marks: dict[int, dict[int, int]] = {}  # project -> {minute (unix ns): sequence of its latest mark}
        self._sequence = 0

    def add(self, project_id: int, minutes_ns) -> None:
        with self._lock:
            self._sequence += 1
            held = self._marks.setdefault(int(project_id), {})
            for minute in minutes_ns:
                held[int(minute)] = self._sequence

    def taken(self, project_id: int) -> tuple[list[int], int]:
        """The minutes held for the project (unix ns), and the sequence to pass to ``done``."""
        with self._lock:
            return sorted(self._marks.get(int(project_id), ())), self._sequence

    def done(self, project_id: int, sequence: int) -> None:
        """Forget the project's marks made up to ``sequence`` (their minutes are recomputed, or stored)."""
        with self._lock:
            held = self._marks.get(int(project_id))
            if held is None:
                return
            for minute in [m for m, s in held.items() if s <= sequence]:
                del held[minute]
            if not held:
                del self._marks[int(project_id)]

    def flush(self, store, project_id: int) -> None:
        """Insert the project's marks still held into ``rollup_dirty`` and forget them (the rollups
        read them from there). An insert that raises keeps them held."""
        minutes, sequence = self.taken(project_id)
        if minutes:
            marks_insert(store, project_id, minutes)
            self.done(project_id, sequence)


def marks_insert(store, project_id: int, minutes_ns) -> None:
    store.insert("rollup_dirty", [{"project_id": int(project_id), "bucket": int(m)} for m in sorted(minutes_ns)],
                 tag=TAG)


def held_for(store) -> HeldMarks | None:
    """The store's HeldMarks (made on first use); None where the store is written by other processes
    too (a server): there every mark is inserted at once."""
    if store.kind != "embedded":
        return None
    return store.write_listener("analytics.rollup_marks", HeldMarks)
