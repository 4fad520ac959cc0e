"""What the bloom filter on ``spans.dims`` keys (migration 0021) costs at insert, in one run.

    .venv/bin/python bench/dims_index.py [--spans 200000] [--batch 1000] [--rounds 5]

One embedded store holds ``spans`` (with the index) and ``spans_plain`` (the same table without
it). ``--spans`` realistic spans (``bench/load_spans.py``'s generator: ``user.tier`` on each root)
are inserted into each in batches of ``--batch`` rows (a group commit's size), then the table is
merged into one part per partition (``OPTIMIZE … FINAL``: a merge rebuilds the index too), rounds
alternating between the tables. The figure is the process's CPU time (chdb's threads included)
per 1,000 spans, the median of the rounds, and the ratio with / without.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import process_cpu_seconds  # noqa: E402
from bench.load_spans import _django, open_store, recent_spans  # noqa: E402

INDEX = "idx_dims_keys"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    if args.spans < args.batch or args.batch < 1 or args.rounds < 1:
        parser.error("--batch and --rounds must be positive, --spans at least --batch")
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    _django()
    from store.schema import SPANS

    store = open_store(Path(tempfile.mkdtemp(prefix="tracedash-bench-dims-")))
    store.command("CREATE TABLE spans_plain AS spans", tag="bench.dims_index.create")
    store.command(f"ALTER TABLE spans_plain DROP INDEX {INDEX}", tag="bench.dims_index.drop")
    indexes = {t: [r[0] for r in store.query(f"SELECT name FROM system.data_skipping_indices WHERE database = currentDatabase()"
                                             f" AND table = '{t}' ORDER BY name", tag="bench.dims_index.indexes").rows]
               for t in ("spans", "spans_plain")}
    if INDEX not in indexes["spans"] or INDEX in indexes["spans_plain"]:
        raise SystemExit(f"unexpected indexes: {indexes}")
    rows = recent_spans(args.spans, args.seed)
    names, types = [c.name for c in SPANS.insert_columns], [c.type for c in SPANS.insert_columns]
    print(f"{args.spans:,} spans in batches of {args.batch:,}, {args.rounds} rounds a table; "
          f"indexes: spans {indexes['spans']}, spans_plain {indexes['spans_plain']}", file=sys.stderr)
    costs: dict[str, list[float]] = {"spans": [], "spans_plain": []}
    for r in range(args.rounds):
        for table in (("spans", "spans_plain") if r % 2 == 0 else ("spans_plain", "spans")):
            store.command(f"TRUNCATE TABLE {table}", tag="bench.dims_index.truncate")
            started = process_cpu_seconds()
            for i in range(0, len(rows), args.batch):
                store.backend.insert(table, names, types, rows[i:i + args.batch], "bench.dims_index.insert",
                                     secrets.token_hex(16))
            store.command(f"OPTIMIZE TABLE {table} FINAL", tag="bench.dims_index.optimize")
            costs[table].append((process_cpu_seconds() - started) / len(rows) * 1000 * 1000)
            print(f"\rround {r + 1}/{args.rounds}: {table} {costs[table][-1]:.1f} ms CPU / 1k spans    ",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    with_index, without = statistics.median(costs["spans"]), statistics.median(costs["spans_plain"])
    print(f"insert + merge CPU per 1,000 spans (median of {args.rounds}): with {INDEX} {with_index:.1f} ms, "
          f"without {without:.1f} ms, ratio {with_index / without:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
