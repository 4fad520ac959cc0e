"""The summariser's statement on one ClickHouse thread against the default, by batch size.

    .venv/bin/python bench/summary_threads.py [--sizes 2000,14000,50000,150000] [--runs 5]

For each size, a fresh embedded store receives that many new spans (``bench/load_spans.py``'s
generator, ~8.5 spans a trace, start times over the last 2 s) in inserts of 1,000 rows, as the
ingest writer stores them under load; then the summariser's ``INSERT … SELECT`` for those traces
(``analytics.summarizer``'s statement, written to a ``Null`` table so every run does the same
work) runs ``--runs`` times with ``max_threads = 1`` and with the default, interleaved. Prints the
median wall and CPU (the process's, every chdb thread included) of each, the ratio of their CPU,
and the cost of the statement over no traces at all (its parse and analysis). This is what sets
``TRACEDASH_SUMMARIZE_ONE_THREAD_SPANS``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import machine, process_cpu_seconds, table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,14000,50000,150000", help="new spans per batch, comma-separated")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    load_spans._django()
    from analytics import summarizer, summary_sql

    def timed(store, sql: str, params: dict) -> tuple[float, float]:
        cpu0, wall0 = process_cpu_seconds(), time.perf_counter()
        store.command(sql, params, tag="bench.summary_threads.run")
        return (time.perf_counter() - wall0) * 1000, (process_cpu_seconds() - cpu0) * 1000

    statements = {threads: summary_sql.summary_insert_sql(
        trace_filter=summarizer._TRACE_FILTER, span_filter=summarizer._SPAN_FILTER, threads=threads,
    ).replace("INSERT INTO traces (", "INSERT INTO traces_null (") for threads in (1, None)}
    rows_out = []
    for size in [int(s) for s in args.sizes.split(",")]:
        store, spans = load_spans.fresh_batch(size, prefix="tracedash-summary-threads-", tag="bench.summary_threads.spans")
        store.command("CREATE TABLE traces_null AS traces ENGINE = Null", tag="bench.summary_threads.null")
        ids = sorted({s["trace_id"] for s in spans})
        starts = [int(s["start_time"]) for s in spans]
        params = {"project_id": load_spans.PROJECT_ID, "version": 1, "prices": summary_sql.prices_json({}),
                  "trace_ids": ",".join(ids), "lo_ns": min(starts), "hi_ns": max(starts)}
        got: dict[object, list[tuple[float, float]]] = {1: [], None: []}
        for _ in range(args.runs):
            for threads, sql in statements.items():
                got[threads].append(timed(store, sql, params))
        empty = [timed(store, statements[1], dict(params, trace_ids="none"))[1] for _ in range(args.runs)]
        med = {t: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for t, v in got.items()}
        rows_out.append([f"{len(spans):,}", f"{len(ids):,}", f"{med[1][0]:,.0f}", f"{med[1][1]:,.0f}",
                         f"{med[None][0]:,.0f}", f"{med[None][1]:,.0f}", f"{med[1][1] / med[None][1]:.2f}",
                         f"{statistics.median(empty):,.0f}"])
        print(f"{size:,} spans done", file=sys.stderr, flush=True)
        store.close()
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(table(["spans", "traces", "1 thread wall ms", "1 thread CPU ms", "default wall ms", "default CPU ms",
                 "CPU 1 / default", "no traces, CPU ms"], rows_out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
