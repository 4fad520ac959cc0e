"""The two summary engines side by side: ClickHouse's ``INSERT … SELECT`` and the numpy one.

    .venv/bin/python bench/summary_engines.py [--sizes 2000,14000,40000,150000] [--runs 5]

For each size, a fresh embedded store receives that many new spans (``bench/load_spans.py``'s
generator, ~8.5 spans a trace, start times over the last 2 s) in inserts of 1,000 rows, as the
ingest writer stores them under load. Then each engine summarises those traces into ``traces``
``--runs`` times, interleaved:

- ``sql``: ``analytics.summary_sql``'s statement (one thread, as the summariser runs a batch of
  this size);
- ``arrays``: ``analytics.summary_arrays``: one columnar read of the spans, the figures in numpy,
  one insert of the rows (its three parts are timed too).

Prints the median wall and CPU (the process's, every chdb thread included) of each, CPU per span,
the ratio arrays / sql, and checks that both engines wrote the same figures for every trace.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import machine, process_cpu_seconds, table  # noqa: E402


def _differs(a: dict, b: dict) -> str:
    """The first column whose values differ ("" for none)."""
    for name, value in a.items():
        if not _same_value(value, b[name]):
            return name
    return ""


def _same_value(value, other) -> bool:
    if value is None or other is None:
        return value is other
    if isinstance(value, float) or isinstance(other, float):
        return math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-12)  # sums in another order
    if isinstance(value, dict):
        return set(value) == set(other) and all(_same_value(float(value[k]), float(other[k])) for k in value)
    return value == other


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,14000,40000,150000", help="new spans per batch, comma-separated")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    load_spans._django()
    from analytics import summarizer, summary_arrays, summary_sql

    sql_statement = summary_sql.summary_insert_sql(trace_filter=summarizer._TRACE_FILTER,
                                                   span_filter=summarizer._SPAN_FILTER, threads=1)
    spans_statement = summary_arrays.spans_sql(trace_filter=summarizer._TRACE_FILTER,
                                               span_filter=summarizer._SPAN_FILTER)
    rows_out, parts_out = [], []
    for size in [int(s) for s in args.sizes.split(",")]:
        store, spans = load_spans.fresh_batch(size, prefix="tracedash-summary-engines-", tag="bench.summary_engines.spans")
        ids = sorted({s["trace_id"] for s in spans})
        starts = [int(s["start_time"]) for s in spans]
        prices = {"gpt-4o": (2.5, 10.0)}
        params = {"project_id": load_spans.PROJECT_ID, "prices": summary_sql.prices_json(prices),
                  "trace_ids": ",".join(ids), "lo_ns": min(starts), "hi_ns": max(starts)}

        def run_sql(version):
            store.command(sql_statement, dict(params, version=version), tag="bench.summary_engines.sql")

        parts: dict[str, list[float]] = {"read": [], "numpy": [], "insert": []}

        def run_arrays(version):
            t0 = time.perf_counter()
            columns = store.query_arrow(spans_statement, params, tag="bench.summary_engines.read")
            t1 = time.perf_counter()
            rows = summary_arrays.traces_from_spans(columns, project_id=load_spans.PROJECT_ID, version=version,
                                                    prices=prices)
            t2 = time.perf_counter()
            store.insert("traces", rows, tag="bench.summary_engines.insert", defaulted=summary_arrays.DEFAULTED)
            t3 = time.perf_counter()
            for name, seconds in (("read", t1 - t0), ("numpy", t2 - t1), ("insert", t3 - t2)):
                parts[name].append(seconds * 1000)

        got: dict[str, list[tuple[float, float]]] = {"sql": [], "arrays": []}
        version = 1
        for _ in range(args.runs):
            for name, run in (("sql", run_sql), ("arrays", run_arrays)):
                version += 1
                cpu0, wall0 = process_cpu_seconds(), time.perf_counter()
                run(version)
                got[name].append(((time.perf_counter() - wall0) * 1000, (process_cpu_seconds() - cpu0) * 1000))
        # the last run of each engine: the same figures for every trace
        latest = {}
        for name, v in (("sql", version - 1), ("arrays", version)):
            rows = store.query("SELECT * EXCEPT (version, ingested_at) FROM traces WHERE version = {v:UInt64} "
                               "ORDER BY trace_id", {"v": v}, tag="bench.summary_engines.check").dicts()
            latest[name] = rows
        differing = sorted({_differs(a, b) for a, b in zip(latest["sql"], latest["arrays"])} - {""})
        same = len(latest["sql"]) == len(latest["arrays"]) == len(ids) and not differing
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in got.items()}
        rows_out.append([f"{len(spans):,}", f"{len(ids):,}", f"{med['sql'][0]:,.0f}", f"{med['sql'][1]:,.0f}",
                         f"{med['arrays'][0]:,.0f}", f"{med['arrays'][1]:,.0f}",
                         f"{med['sql'][1] * 1000 / len(spans):.1f}", f"{med['arrays'][1] * 1000 / len(spans):.1f}",
                         f"{med['arrays'][1] / med['sql'][1]:.2f}", "yes" if same else f"NO: {', '.join(differing) or 'rows'}"])
        parts_out.append([f"{len(spans):,}"] + [f"{statistics.median(parts[k]):,.1f}" for k in ("read", "numpy", "insert")])
        print(f"{size:,} spans done", file=sys.stderr, flush=True)
        store.close()
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(table(["spans", "traces", "sql wall ms", "sql CPU ms", "arrays wall ms", "arrays CPU ms", "sql µs CPU/span",
                 "arrays µs CPU/span", "arrays / sql CPU", "same figures"], rows_out))
    print()
    print("arrays, wall ms by part (median):")
    print(table(["spans", "columnar read", "numpy", "insert"], parts_out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
