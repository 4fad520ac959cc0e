"""Server time of the whole panel pages (overview, costs, compare, resources) over the data
bench/load_spans.py loaded: each page handled in-process by Django's test client (middleware,
session, view, selectors on the rollups, figures, template), no network.

    .venv/bin/python bench/panel_pages.py [--data-dir var/bench] [--runs 15] [--warmup 3] [--json PATH]

Resource samples are not part of bench/load_spans.py's data: load some first to time the
Resources page on them (the figures in docs/BENCHMARKS.md had 2 hosts × (host + 4 GPUs) every
10 s for 30 days, 2.6 M rows). bench/query.py times the rollup selectors alone; this adds what the page does around them (the
previous period's KPIs, the filter choices, building the plotly figures, rendering HTML), so the
figure printed is what a user waits for on the server. Windows are absolute and end at the
newest loaded trace (moved back a minute per run, so runs do not repeat one query). The rollups
are built first if they do not cover the data (as bench/query.py does).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import machine, percentile, table  # noqa: E402
from bench.load_spans import DEFAULT_DATA_DIR, PROJECT_ID, open_store  # noqa: E402

NS = 1_000_000_000


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def scenarios(end: datetime) -> list[tuple[str, float | None, callable, callable]]:
    """(name, target ms, path of run i, the view's data part for run i: reads and figures)."""
    from dashboard import views
    from dashboard.compare import compare_query_from
    from dashboard.timewindow import TimeWindow

    def window(days: float, i: int) -> TimeWindow:
        stop = end - timedelta(minutes=i)
        return TimeWindow(stop - timedelta(days=days), stop, "")

    def page(path: str, days: float, extra: str = ""):
        def build(i: int) -> str:
            w = window(days, i)
            return f"{path}?from={_iso(w.start)}&to={_iso(w.end)}{extra}"
        return build

    def compare_weeks(i: int) -> str:
        w = window(7, i)
        return (f"/compare/?mode=windows&a_from={_iso(w.start - timedelta(days=7))}&a_to={_iso(w.start)}"
                f"&b_from={_iso(w.start)}&b_to={_iso(w.end)}")

    def compare_data(path_for):
        def run(i: int):
            query = dict(part.split("=", 1) for part in path_for(i).split("?", 1)[1].split("&"))
            return views._compare(PROJECT_ID, compare_query_from(query))
        return run

    models = "&mode=models&a_model=gpt-4o-mini&b_model=gpt-4o"
    everything = {"service": "", "model": ""}
    return [
        ("overview 24 h", 150, page("/", 1), lambda i: views._overview(PROJECT_ID, window(1, i), everything)),
        ("overview 30 days", 150, page("/", 30), lambda i: views._overview(PROJECT_ID, window(30, i), everything)),
        ("overview 30 days, one service", 150, page("/", 30, "&service=gateway"),
         lambda i: views._overview(PROJECT_ID, window(30, i), {"service": "gateway", "model": ""})),
        ("costs 30 days", None, page("/costs/", 30), lambda i: views._costs(PROJECT_ID, window(30, i), everything)),
        ("compare 7 days vs the 7 before", 300, compare_weeks, compare_data(compare_weeks)),
        ("compare two models, 7 days", 300, page("/compare/", 7, models), compare_data(page("/compare/", 7, models))),
        ("resources 24 h", None, page("/resources/", 1),
         lambda i: views._resources_panel(PROJECT_ID, window(1, i), "", latest=True)),
        ("resources 30 days", None, page("/resources/", 30),
         lambda i: views._resources_panel(PROJECT_ID, window(30, i), "", latest=True)),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not (args.data_dir / "clickhouse").exists():
        parser.error(f"{args.data_dir} holds no bench data: run bench/load_spans.py first")
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    os.environ["TRACEDASH_ALLOWED_HOSTS"] = "testserver"
    from bench.query import _django

    _django(Path(tempfile.mkdtemp(prefix="tracedash-bench-pages-")))
    import store
    from django.test import Client

    from bench.query_panels import _ensure_rollups
    from projects.models import Project
    from projects.services import membership_add, project_create

    bench_store = open_store(args.data_dir)
    store.set_store(bench_store)
    data = _ensure_rollups(bench_store)
    end = datetime.fromtimestamp(data["hi"] / NS, tz=timezone.utc)
    spans = int(bench_store.query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": PROJECT_ID},
                                  tag="bench.pages.count").scalar())
    traces = int(bench_store.query("SELECT count() FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": PROJECT_ID},
                                   tag="bench.pages.count").scalar())
    print(f"data: {spans:,} spans, {traces:,} traces in {args.data_dir}; windows end at {end:%Y-%m-%d %H:%M} UTC")
    info = machine()
    print(f"machine: {info.get('cpu_model', '?')}, {info.get('nproc', '?')} CPUs, {info.get('memory_gib', '?')} GiB; "
          f"{args.runs} runs after {args.warmup} warm-up")

    # The bench data belongs to project 1: a member of it views the pages.
    from django.contrib.auth import get_user_model

    project, _ = project_create(name="bench")
    if project.pk != PROJECT_ID:
        Project.objects.filter(pk=project.pk).update(pk=PROJECT_ID)
        project = Project.objects.get(pk=PROJECT_ID)
    user = get_user_model().objects.create_user(username="bench", password="bench-pages-1")
    membership_add(project=project, user=user)
    client = Client()
    client.force_login(user)

    results = []
    for name, target, path_for, data_for in scenarios(end):
        for i in range(args.warmup):
            assert client.get(path_for(i)).status_code == 200
        times, data_times, size = [], [], 0
        for i in range(args.runs):
            path = path_for(args.warmup + i)
            started = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
            size = len(response.content)
            # The same window through the view's data part only (its reads side by side, figures).
            started = time.perf_counter()
            data_for(args.warmup + i)
            data_times.append((time.perf_counter() - started) * 1000)
            sys.stderr.write(f"\r{name}: {i + 1}/{args.runs} ")
            sys.stderr.flush()
        sys.stderr.write("\r" + " " * 80 + "\r")
        times.sort()
        median, p95 = statistics.median(times), percentile(times, 95)
        data_median = statistics.median(data_times)
        results.append({"page": name, "median_ms": round(median, 1), "p95_ms": round(p95, 1), "target_ms": target,
                        "pass": None if target is None else p95 <= target, "html_kib": round(size / 1024, 1),
                        "data_median_ms": round(data_median, 1)})
    print(table(["page (whole request, server time)", "median ms", "p95 ms", "target ms", "pass (p95)",
                 "reads+figures median ms", "HTML KiB"],
                [[r["page"], f"{r['median_ms']:.1f}", f"{r['p95_ms']:.1f}",
                  "—" if r["target_ms"] is None else f"≤ {r['target_ms']:g}",
                  "—" if r["pass"] is None else ("pass" if r["pass"] else "FAIL"), f"{r['data_median_ms']:.1f}",
                  f"{r['html_kib']:.0f}"]
                 for r in results]))
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min) on {info.get('nproc', '?')} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"spans": spans, "traces": traces, "machine": info, "results": results}, indent=2))
    bench_store.close()
    return 0 if all(r["pass"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
