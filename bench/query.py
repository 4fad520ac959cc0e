"""Server time of the trace and panel queries over the data bench/load_spans.py loaded.

    .venv/bin/python bench/query.py [--data-dir var/bench] [--runs 20] [--warmup 3] [--only TEXT] [--json PATH]

Opens the embedded ClickHouse of ``--data-dir`` in this process (so stop anything else using it),
runs each scenario of ``bench/query_traces.py`` (and ``bench/query_panels.py`` when present)
``--warmup`` times, then ``--runs`` times, and prints per scenario the median and P95 of the
selector call (in-process, no HTTP: server time), its target and pass/fail, and Jaeger's
published figure for the same search beside it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import machine, percentile, table  # noqa: E402
from bench.load_spans import DATABASE, DEFAULT_DATA_DIR, PROJECT_ID, open_store  # noqa: E402


def scenario_modules() -> list:
    modules = [importlib.import_module("bench.query_traces")]
    try:
        modules.append(importlib.import_module("bench.query_panels"))
    except ModuleNotFoundError as exc:
        if exc.name != "bench.query_panels":
            raise
    return modules


def _django(work: Path) -> None:
    """Selectors read settings and the metadata DB (the project's price table): Django on a fresh
    SQLite under ``work``, migrated; ClickHouse is the bench store, set below."""
    import os

    for name in ("DATABASE_URL", "TRACEDASH_CLICKHOUSE_URL", "CELERY_BROKER_URL", "TRACEDASH_CHANNEL_LAYER_URL"):
        os.environ.pop(name, None)
    os.environ["TRACEDASH_DATA_DIR"] = str(work)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this text")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not (args.data_dir / "clickhouse").exists():
        parser.error(f"{args.data_dir} holds no bench data: run bench/load_spans.py first")
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    _django(Path(tempfile.mkdtemp(prefix="tracedash-bench-query-")))
    import store

    bench_store = open_store(args.data_dir)
    store.set_store(bench_store)
    spans = int(bench_store.query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": PROJECT_ID},
                                  tag="bench.query.count").scalar())
    traces = int(bench_store.query("SELECT count() FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": PROJECT_ID},
                                   tag="bench.query.count").scalar())
    parts = int(bench_store.query("SELECT count() FROM system.parts WHERE database = {d:String} AND table = 'spans' AND active",
                                  {"d": DATABASE}, tag="bench.query.parts").scalar())
    print(f"data: {spans:,} spans, {traces:,} traces ({parts} active parts of spans) in {args.data_dir}")
    info = machine()
    print(f"machine: {info.get('cpu_model', '?')}, {info.get('nproc', '?')} CPUs, {info.get('memory_gib', '?')} GiB; {args.runs} runs after {args.warmup} warm-up")
    results = []
    for module in scenario_modules():
        for scenario in module.SCENARIOS:
            if args.only and args.only not in scenario.name:
                continue
            scenario.setup(bench_store)
            for i in range(args.warmup):
                scenario.run(i)
            times, rows = [], 0
            for i in range(args.runs):
                started = time.perf_counter()
                rows = scenario.run(args.warmup + i)
                times.append((time.perf_counter() - started) * 1000)
                sys.stderr.write(f"\r{scenario.name}: {i + 1}/{args.runs} ")
                sys.stderr.flush()
            sys.stderr.write("\r" + " " * 80 + "\r")
            times.sort()
            median, p95 = statistics.median(times), percentile(times, 95)
            target = getattr(scenario, "target_ms", None)
            results.append({
                "scenario": scenario.name, "module": module.__name__, "median_ms": round(median, 1),
                "p95_ms": round(p95, 1), "target_ms": target, "jaeger_ms": getattr(scenario, "jaeger_ms", None),
                "pass": None if target is None else p95 <= target, "rows_last_run": rows,
            })
    headers = ["scenario", "median ms", "p95 ms", "target ms", "pass (p95)", "Jaeger ms", "rows"]
    lines = [[r["scenario"], f"{r['median_ms']:.1f}", f"{r['p95_ms']:.1f}",
              "—" if r["target_ms"] is None else f"≤ {r['target_ms']:g}",
              "—" if r["pass"] is None else ("pass" if r["pass"] else "FAIL"),
              "—" if r["jaeger_ms"] is None else f"{r['jaeger_ms']:,}", str(r["rows_last_run"])] for r in results]
    print(table(headers, lines))
    if args.json:
        args.json.write_text(json.dumps({"spans": spans, "traces": traces, "machine": info, "results": results}, indent=2))
    bench_store.close()
    return 0 if all(r["pass"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
