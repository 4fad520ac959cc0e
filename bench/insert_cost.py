"""What one ``Store.insert`` of spans costs, with the session settings the store uses and with each
turned back to ClickHouse's default.

    .venv/bin/python bench/insert_cost.py [--sizes 1,800,4000] [--rounds 12]

Parses ``bench/ingest.py``'s json-1000 bodies as the server does, then inserts slices of those rows
into a fresh embedded store with ``Store.insert`` (Arrow table, the statement, the part written),
the variants interleaved, ``--rounds`` times per size; prints the median wall time and the
process CPU (every chdb thread). Each variant is a ``SET`` on the store's one connection (this
process makes one call at a time, so the pool lends the same one). Variants:

- **store**: ``store.backends.SESSION_SETTINGS`` as they are (``optimize_on_insert = 0``);
- **optimize_on_insert = 1**: ClickHouse's default, the in-block Replacing merge;
- **no skip indexes at insert**: also ``materialize_skip_indexes_on_insert = 0`` (merges build them).

One variant of the rows' Arrow table, with the store's settings:

- **every Arrow field nullable**: the table's schema as it was before 2026-12-08 (each field, and
  the items of array and map columns, nullable: chdb then reads every column as Nullable and the
  insert converts it back), against ``store.backends.arrow_table``'s, nullable only where a value is
  null.

And two parts of the store's insert, to tell its fixed cost apart (same rows, same statement):

- **into a Null table**: the statement into a table of ``spans``' columns and defaults on the Null
  engine: the Arrow read, the conversion to the table's types and the defaults, no part written;
- **the Arrow read alone**: building the Arrow table and ``SELECT * FROM Python(...) FORMAT Null``.
"""

from __future__ import annotations

import argparse
import itertools
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import machine, table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,800,4000", help="rows per insert, comma-separated")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]

    load_spans._django()
    from bench import ingest as ingest_bench
    from ingest.schemas import Limits, parse_spans
    from store import backends
    from store.schema import SPANS

    native = {s.name: s for s in ingest_bench.build_scenarios(7, pool_100=2, pool_1000=6)}["json-1000"]
    numbers = itertools.count(1)
    bodies = max(12, -(-max(sizes) * 3 // native.batch))
    rows = [row for i in range(bodies)
            for row in parse_spans(native.patch(native.templates[i % len(native.templates)], next(numbers)),
                                   project_id=1, limits=Limits())[0]]
    store = load_spans.open_store(Path(tempfile.mkdtemp(prefix="tracedash-insert-bench-")))
    store.insert("spans", rows[:1000], tag="bench.insert_cost.warmup", dedup_token=secrets.token_hex(16))

    store_settings = {"materialize_skip_indexes_on_insert": 1, **backends.SESSION_SETTINGS}
    variants = {"store": store_settings, "optimize_on_insert = 1": {**store_settings, "optimize_on_insert": 1},
                "no skip indexes at insert": {**store_settings, "materialize_skip_indexes_on_insert": 0}}
    store.command("CREATE TABLE spans_null AS spans ENGINE = Null", tag="bench.insert_cost.null")
    columns = [c.name for c in SPANS.insert_columns]
    types = [c.type for c in SPANS.insert_columns]

    def into_null(part):
        store.backend.insert("spans_null", columns, types, part, "bench.insert_cost", secrets.token_hex(16))

    def arrow_read(part):
        arrow_rows = backends.arrow_table(columns, types, part)  # noqa: F841 - chdb finds it by name
        store.backend.command("SELECT * FROM Python(arrow_rows) FORMAT Null SETTINGS max_threads = 1", None,
                              "bench.insert_cost")

    def loose(part):
        backends.TIGHT_NULLABILITY = False
        try:
            store.insert("spans", part, tag="bench.insert_cost", dedup_token=secrets.token_hex(16))
        finally:
            backends.TIGHT_NULLABILITY = True

    parts = {"every Arrow field nullable": loose, "into a Null table": into_null, "the Arrow read alone": arrow_read}
    timings: dict[tuple[int, str], list[tuple[float, float]]] = {}
    total = len(sizes) * args.rounds
    for step, (n, rnd) in enumerate(itertools.product(sizes, range(args.rounds)), 1):
        for label in (*variants, *parts):
            settings = variants.get(label, store_settings)  # the parts run with the store's own
            store.command("SET " + ", ".join(f"{name} = {value}" for name, value in settings.items()),
                          tag="bench.insert_cost.set")
            offset = (rnd * 977 + n * 3 + len(label)) % (len(rows) - n)
            part = rows[offset:offset + n]
            wall, cpu = time.perf_counter(), time.process_time()
            if label in variants:
                store.insert("spans", part, tag="bench.insert_cost", dedup_token=secrets.token_hex(16))
            else:
                parts[label](part)
            timings.setdefault((n, label), []).append(((time.perf_counter() - wall) * 1000,
                                                       (time.process_time() - cpu) * 1000))
        print(f"\r  {step}/{total} rounds", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    lines = []
    for n in sizes:
        base = statistics.median(c for _, c in timings[(n, "store")])
        for label in (*variants, *parts):
            walls, cpus = zip(*timings[(n, label)])
            cpu = statistics.median(cpus)
            lines.append([f"{n:,}", label, f"{statistics.median(walls):.1f}", f"{cpu:.1f}", f"{cpu / base:.2f}"])
    print(f"Store.insert of json-1000 spans, {args.rounds} interleaved rounds, medians "
          f"(CPU: this process, every chdb thread)\n")
    print(table(["rows", "insert settings / part of it", "wall ms", "CPU ms", "CPU / store's"], lines))
    print(arrow_columns(rows[:max(sizes)], columns, types, args.rounds))
    info = machine()
    print(f"\nmachine: nproc {info.get('nproc')}, {info.get('cpu_model', '')}")
    return 0


def arrow_columns(rows, columns, types, rounds: int) -> str:
    """Building the insert's Arrow table, column by column (median CPU ms over ``rounds``), the
    costliest first: where the Python half of an insert goes. The values are lists, as the ingest
    endpoint hands them to the writer."""
    from store import backends

    cost = {}
    for name, ch_type in zip(columns, types):
        values = backends.column_values(rows, name)
        spent = []
        for _ in range(rounds):
            cpu = time.process_time()
            backends.arrow_table([name], [ch_type], backends.Columns({name: values}, len(values)))
            spent.append((time.process_time() - cpu) * 1000)
        cost[name] = statistics.median(spent)
    ranked = sorted(cost.items(), key=lambda item: -item[1])
    shown = ", ".join(f"{name} {ms:.2f}" for name, ms in ranked[:6])
    return (f"\nbuilding the Arrow table of {len(rows):,} rows: {sum(cost.values()):.1f} ms CPU in all; "
            f"by column, the costliest first: {shown}; the other {len(ranked) - 6} {sum(ms for _, ms in ranked[6:]):.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
