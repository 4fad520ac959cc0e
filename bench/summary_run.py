"""Where one summariser run's CPU goes, store call by store call.

    .venv/bin/python bench/summary_run.py [--runs 8] [--spans 24000]

A fresh embedded store (one process, no HTTP) receives ``--spans`` new spans of
``bench/load_spans.py``'s traces (~8.5 spans a trace, start times at their arrival) in 1,000-row
inserts, as the ingest writer stores them under load, and then one incremental summariser run
(``analytics.summarizer.traces_summarize``), ``--runs`` times; a first run before them sets the
project's watermark (on the embedded store it reads the store: the spans held in memory,
``analytics.fresh_spans``, serve the runs after it). Prints the CPU of a run (the process's, every
chdb thread included, so merges running meanwhile count too), per 1,000 spans, and taken apart by
the store call's tag (an insert's line includes its statement's) and the numpy figures
(``summary_arrays.traces_from_spans``). To compare two versions of the code, run it in each
checkout, alternately: this shared machine drifts by 10-20 % between runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import cpu_by_store_call, machine, process_cpu_seconds, table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--spans", type=int, default=24_000, help="new spans before each run (default 24,000: 2 s at 12,000 spans/s)")
    args = parser.parse_args(argv)

    load_spans._django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)  # the summariser reads the project's price table
    from analytics import summarizer, summary_arrays
    from store import set_store

    store, _ = load_spans.fresh_batch(1000, prefix="tracedash-summary-run-", tag="bench.summary_run.spans")
    set_store(store)
    cpu, timed = cpu_by_store_call(store)
    real_figures = summary_arrays.traces_from_spans
    summary_arrays.traces_from_spans = lambda *a, **k: timed("numpy: traces_from_spans", real_figures, *a, **k)

    project_id = load_spans.PROJECT_ID
    summarizer.traces_summarize(project_ids=[project_id])  # the watermark
    cpu.clear()
    now = time.time_ns()
    gen = load_spans.Generator(seed=5, start_ns=now, end_ns=now + args.runs * 2 * 10**9,
                               traces=args.runs * args.spans // 8, project_id=project_id)
    run_cpu, summarised = 0.0, 0
    for run in range(args.runs):
        rows: list[dict] = []
        while len(rows) < args.spans:
            rows.extend(gen.trace((run + len(rows) / args.spans) / args.runs))
        for i in range(0, len(rows), 1000):
            store.insert("spans", rows[i:i + 1000], tag="bench.summary_run.spans")
        cpu.pop("insert bench.summary_run.spans", None)
        cpu.pop("bench.summary_run.spans", None)
        time.sleep(0.3)
        started = process_cpu_seconds()
        report = summarizer.traces_summarize(project_ids=[project_id])
        run_cpu += process_cpu_seconds() - started
        summarised += report.spans
        print(f"run {run + 1}/{args.runs}: {report.spans:,} spans, {report.traces:,} traces", file=sys.stderr, flush=True)
    store.close()
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"{args.runs} runs of {args.spans:,} new spans: {run_cpu * 1000 / args.runs:,.1f} ms of CPU a run, "
          f"{run_cpu * 1e6 / summarised:.2f} ms per 1,000 spans summarised")
    print(table(["part (store call tag)", "ms of CPU a run"],
                [[tag, f"{seconds * 1000 / args.runs:,.1f}"] for tag, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])
                 if seconds * 1000 / args.runs >= 0.5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
