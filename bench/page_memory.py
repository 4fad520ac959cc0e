"""How much memory each page and JSON endpoint takes while it answers, over a store as full as a
soak's (``bench/soak.py``'s pages, in-process, no HTTP).

    .venv/bin/python bench/load_spans.py --spans 8000000 --days 0.03 --data-dir var/bench-hour --reset
    .venv/bin/python bench/page_memory.py --data-dir var/bench-hour [--runs 3]

Serves the pages the soak's clients poll (bench/soak.py ``page_urls``) through Django's test client
in this process, from the embedded store ``bench/load_spans.py`` filled (rollups built first), as a
member of its project. Before each request the freed pages are returned
(``Store.release_memory``), then a thread reads the process's RSS every 5 ms while the request
runs: the page's peak is the highest RSS less the RSS before. Prints each page's median peak and
time over ``--runs``, then the same for the overview's and costs' store reads one by one. 8 M
spans over the last 0.03 days (43 minutes) is what a 20-minute soak at 6,800 spans/s holds; every
default window (the last hour) then covers all of it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import rss_bytes, table  # noqa: E402
from bench.load_spans import DEFAULT_DATA_DIR, PROJECT_ID  # noqa: E402

MIB = 1024 * 1024


class Peak:
    """The highest RSS seen by a thread reading it every ``every`` s while the block runs."""

    def __init__(self, every: float = 0.005):
        self.every, self.peak, self._stop = every, 0, threading.Event()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.every)

    def __enter__(self) -> "Peak":
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def _store_reads():
    """The overview's and costs' reads one by one over the last hour, as the pages call them."""
    from datetime import datetime, timedelta, timezone

    from analytics import panel_selectors, rollups

    end = datetime.now(timezone.utc)
    args = {"project_id": PROJECT_ID, "start": end - timedelta(hours=1), "end": end}
    return [
        ("window_stats", lambda: rollups.window_stats(**args)),
        ("window_series", lambda: rollups.window_series(**args)),
        ("latency_heatmap", lambda: rollups.latency_heatmap(**args)),
        ("spend_by_model", lambda: rollups.spend_by_model(**args)),
        ("model_totals", lambda: rollups.model_totals(**args)),
        ("panel_facets", lambda: panel_selectors.panel_facets(**args)),
        ("request_rates (last 1 and 5 min)", lambda: rollups.request_rates(
            project_id=PROJECT_ID, spans=[(end - timedelta(minutes=1), end), (end - timedelta(minutes=5), end)])),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["TRACEDASH_DATA_DIR"] = tempfile.mkdtemp(prefix="tracedash-page-memory-")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["TRACEDASH_DEMO"] = "0"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    from bench.load_spans import open_store
    from bench.query_panels import _ensure_rollups
    from bench.soak import page_urls
    from django.contrib.auth import get_user_model
    from projects.services import membership_add, project_create
    from store import set_store

    store = open_store(args.data_dir)
    set_store(store)
    project, _ = project_create(name="page-memory")
    if project.pk != PROJECT_ID:
        raise SystemExit(f"the bench data belongs to project {PROJECT_ID}; a fresh metadata database gave {project.pk}")
    user = get_user_model().objects.create_user(username="page-memory", password="pw-page-memory-1")
    membership_add(project=project, user=user)
    _ensure_rollups(store)
    spans, traces = store.query("SELECT (SELECT count() FROM spans), (SELECT count() FROM traces FINAL)",
                                tag="bench.page_memory.size").rows[0]
    trace_id = store.query("SELECT trace_id FROM traces_by_start FINAL WHERE project_id = {p:UInt64} AND span_count > 5"
                           " ORDER BY start_time DESC LIMIT 1", {"p": PROJECT_ID}, tag="bench.page_memory.trace").scalar()
    client = Client()
    client.force_login(user)
    print(f"{spans:,} spans, {traces:,} traces in {args.data_dir}; {args.runs} runs a page", flush=True)
    results = []
    for name, path in page_urls(trace_id):
        peaks, times = [], []
        for _ in range(args.runs):
            store.release_memory()
            with Peak() as peak:
                started = time.perf_counter()
                response = client.get(path, {"project": PROJECT_ID})
                times.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise SystemExit(f"{path}: HTTP {response.status_code}")
            peaks.append(peak.peak - peak.start)
        results.append((name, path, peaks, times))
    for name, read in _store_reads():
        peaks, times = [], []
        for _ in range(args.runs):
            store.release_memory()
            with Peak() as peak:
                started = time.perf_counter()
                read()
                times.append(time.perf_counter() - started)
            peaks.append(peak.peak - peak.start)
        results.append((name, "(store read, last hour)", peaks, times))
    rows = [[name, f"{statistics.median(times) * 1000:,.0f}", f"{statistics.median(peaks) / MIB:,.1f}",
             f"{max(peaks) / MIB:,.1f}"] for name, path, peaks, times in results]
    print(table(["page or read", "median ms", "RSS above the start while answering, median MiB", "max MiB"], rows))
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
