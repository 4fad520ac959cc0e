"""What storing spans costs in all — inserts and the merges they cause — by batch size and by the
merge selector's base (``merge_selector_base`` on ``spans``: migration 0023), in one run; with
``--table traces``, what storing their summaries costs (``traces`` and, through its materialized
view, ``traces_by_start``: migration 0026).

    .venv/bin/python bench/merge_cost.py [--spans 200000] [--batches 800,4000] [--bases 5,20] [--rounds 2]
    .venv/bin/python bench/merge_cost.py --table traces [--spans 2000000] [--batches 2800]

For each (batch size, base) a fresh embedded store receives ``--spans`` realistic spans
(``bench/load_spans.py``'s generator) in inserts of that many rows, one after another, as the
ingest writer stores them (800 rows: eight closed-loop clients of 100-span requests; ~4,000: of
1,000-span ones). ClickHouse merges the parts in its own threads meanwhile; after the last insert
the run waits until the number of active parts has not changed for 3 s. Figures: the insert calls'
wall time per span, the process's CPU (every chdb thread: inserts and merges) per span until
then, and the active parts left. Configurations alternate within each round; medians of the rounds.

``--table traces``: the summaries of those spans' traces (``analytics.summarizer.trace_row``, ~8.5
spans a trace) are inserted instead, ``--batches`` summaries at a time (2,800: one summariser run's
at ~12,000 spans/s), with the base set on both summary tables; figures are per summary.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import machine, process_cpu_seconds, table  # noqa: E402
from bench.load_spans import _django, open_store, recent_spans  # noqa: E402


TABLES = {"spans": ("spans",), "traces": ("traces", "traces_by_start")}  # --table: the tables its inserts write


def active_parts(store, tables: tuple[str, ...]) -> int:
    names = ", ".join(f"'{name}'" for name in tables)  # TABLES' own names (chdb does not quote Array parameters)
    return int(store.query(f"SELECT count() FROM system.parts WHERE database = currentDatabase() AND table IN ({names})"
                           " AND active", tag="bench.merge_cost.parts").scalar())


def summary_rows(spans: list[dict]) -> list[dict]:
    """The ``traces`` row of each trace of ``spans`` (in trace order), as the summariser computes it."""
    from analytics.summarizer import trace_row

    out, version = [], time.time_ns()
    for i, span in enumerate(spans):
        if i and span["trace_id"] == spans[i - 1]["trace_id"]:
            continue
        j = i
        while j < len(spans) and spans[j]["trace_id"] == span["trace_id"]:
            j += 1
        trace = [dict(s, start_ns=s["start_time"]) for s in spans[i:j]]
        out.append(trace_row(project_id=span["project_id"], trace_id=span["trace_id"], spans=trace, prices={},
                             version=version))
    return out


def run(rows: list[dict], batch: int, base: float, table_name: str = "spans") -> dict:
    store = open_store(Path(tempfile.mkdtemp(prefix="tracedash-merge-cost-")))
    tables = TABLES[table_name]
    for name in tables:
        store.command(f"ALTER TABLE {name} MODIFY SETTING merge_selector_base = {base}", tag="bench.merge_cost.base")
    cpu0, insert_wall = process_cpu_seconds(), 0.0
    for i in range(0, len(rows), batch):
        started = time.perf_counter()
        store.insert(table_name, rows[i:i + batch], tag="bench.merge_cost.insert", dedup_token=secrets.token_hex(16))
        insert_wall += time.perf_counter() - started
    last, stable = -1, 0
    while stable < 3:  # merges still running change the count of active parts
        time.sleep(1)
        parts = active_parts(store, tables)
        stable, last = (stable + 1, last) if parts == last else (0, parts)
    cpu = process_cpu_seconds() - cpu0  # the quiet seconds waited cost (next to) no CPU
    store.close()
    return {"insert_us": 1e6 * insert_wall / len(rows), "cpu_us": 1e6 * cpu / len(rows), "parts": last}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=sorted(TABLES), default="spans",
                        help="spans (default), or traces: the spans' summaries (traces + traces_by_start)")
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--batches", help="rows per insert, comma-separated (default 800,4000; 2800 with --table traces)")
    parser.add_argument("--bases", default="5,20", help="merge_selector_base values (5: ClickHouse's default)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    _django()
    rows = recent_spans(args.spans, args.seed)
    if args.table == "traces":
        rows = summary_rows(rows)
    batches = args.batches or ("2800" if args.table == "traces" else "800,4000")
    configs = [(int(b), float(x)) for b in batches.split(",") for x in args.bases.split(",")]
    got: dict[tuple, list[dict]] = {c: [] for c in configs}
    unit = "summary" if args.table == "traces" else "span"
    for r in range(args.rounds):
        for c in configs:
            got[c].append(run(rows, *c, args.table))
            print(f"round {r + 1}/{args.rounds}: {c[0]:,} rows/insert, base {c[1]:g}: "
                  f"{got[c][-1]['cpu_us']:.1f} us CPU a {unit}", file=sys.stderr, flush=True)
    out = []
    for (batch, base), runs in got.items():
        med = {k: statistics.median(x[k] for x in runs) for k in ("insert_us", "cpu_us", "parts")}
        default = got.get((batch, 5.0))
        ratio = (f"{med['cpu_us'] / statistics.median(x['cpu_us'] for x in default):.2f}" if default else "—")
        out.append([f"{batch:,}", f"{base:g}", f"{med['insert_us']:.1f}", f"{med['cpu_us']:.1f}", ratio,
                    f"{med['parts']:.0f}"])
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    what = f"{len(rows):,} summaries of {args.spans:,} spans" if args.table == "traces" else f"{args.spans:,} spans"
    print(f"{what} per run into {' + '.join(TABLES[args.table])}, medians of {args.rounds} rounds")
    print(table(["rows/insert", "merge_selector_base", f"insert wall µs/{unit}", f"CPU µs/{unit} (inserts + merges)",
                 "CPU / base 5", "active parts after"], out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
