"""What storing spans costs in all — inserts and the merges they cause — by batch size and by the
merge selector's base (``merge_selector_base`` on ``spans``: migration 0023), in one run.

    .venv/bin/python bench/merge_cost.py [--spans 200000] [--batches 800,4000] [--bases 5,20] [--rounds 2]

For each (batch size, base) a fresh embedded store receives ``--spans`` realistic spans
(``bench/load_spans.py``'s generator) in inserts of that many rows, one after another, as the
ingest writer stores them (800 rows: eight closed-loop clients of 100-span requests; ~4,000: of
1,000-span ones). ClickHouse merges the parts in its own threads meanwhile; after the last insert
the run waits until the number of active parts has not changed for 3 s. Figures: the insert calls'
wall time per span, the process's CPU (every chdb thread: inserts and merges) per span until
then, and the active parts left. Configurations alternate within each round; medians of the rounds.
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


def active_parts(store) -> int:
    return int(store.query("SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = 'spans'"
                           " AND active", tag="bench.merge_cost.parts").scalar())


def run(rows: list[dict], batch: int, base: float) -> dict:
    store = open_store(Path(tempfile.mkdtemp(prefix="tracedash-merge-cost-")))
    store.command(f"ALTER TABLE spans MODIFY SETTING merge_selector_base = {base}", tag="bench.merge_cost.base")
    cpu0, insert_wall = process_cpu_seconds(), 0.0
    for i in range(0, len(rows), batch):
        started = time.perf_counter()
        store.insert("spans", rows[i:i + batch], tag="bench.merge_cost.insert", dedup_token=secrets.token_hex(16))
        insert_wall += time.perf_counter() - started
    last, stable = -1, 0
    while stable < 3:  # merges still running change the count of active parts
        time.sleep(1)
        parts = active_parts(store)
        stable, last = (stable + 1, last) if parts == last else (0, parts)
    cpu = process_cpu_seconds() - cpu0  # the quiet seconds waited cost (next to) no CPU
    store.close()
    return {"insert_us": 1e6 * insert_wall / len(rows), "cpu_us": 1e6 * cpu / len(rows), "parts": last}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--batches", default="800,4000", help="rows per insert, comma-separated")
    parser.add_argument("--bases", default="5,20", help="merge_selector_base values (5: ClickHouse's default)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    _django()
    rows = recent_spans(args.spans, args.seed)
    configs = [(int(b), float(x)) for b in args.batches.split(",") for x in args.bases.split(",")]
    got: dict[tuple, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs:
            got[c].append(run(rows, *c))
            print(f"round {r + 1}/{args.rounds}: {c[0]:,} rows/insert, base {c[1]:g}: "
                  f"{got[c][-1]['cpu_us']:.1f} us CPU a span", file=sys.stderr, flush=True)
    out = []
    for (batch, base), runs in got.items():
        med = {k: statistics.median(x[k] for x in runs) for k in ("insert_us", "cpu_us", "parts")}
        default = got.get((batch, 5.0))
        ratio = (f"{med['cpu_us'] / statistics.median(x['cpu_us'] for x in default):.2f}" if default else "—")
        out.append([f"{batch:,}", f"{base:g}", f"{med['insert_us']:.1f}", f"{med['cpu_us']:.1f}", ratio,
                    f"{med['parts']:.0f}"])
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"{args.spans:,} spans per run, medians of {args.rounds} rounds")
    print(table(["rows/insert", "merge_selector_base", "insert wall µs/span", "CPU µs/span (inserts + merges)",
                 "CPU / base 5", "active parts after"], out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
