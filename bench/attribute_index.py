"""What the attribute index costs the summariser, in one run.

    .venv/bin/python bench/attribute_index.py [--spans 40000] [--batch-spans 10000] [--rounds 5]

One fresh embedded store holds ``--spans`` realistic spans (``bench/load_spans.py``'s generator:
``user.tier`` on each root, ``gen_ai.request.model`` on each model call, ``user.id`` on each root).
The summariser's own call (``analytics.summarizer.traces_summarize_ids``) then summarises them in
batches of about ``--batch-spans`` spans (an incremental run's size at ~10k spans/s), with the
declared keys of each configuration, configurations alternating round by round:

- **no key declared**: what every project that never grouped pays (the summary alone);
- **user.tier**: one key, on the root of each trace;
- **3 keys**: ``user.tier``, ``user.id`` and ``gen_ai.request.model`` (on 1–5 spans a trace).

Printed per configuration: the median process CPU (every chdb thread) per 1,000 spans summarised,
its ratio to "no key declared", and the index rows written per round.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import machine, process_cpu_seconds, table  # noqa: E402
from bench.load_spans import PROJECT_ID, _django, open_store, recent_spans  # noqa: E402

CONFIGS = {"no key declared": [], "user.tier": ["user.tier"],
           "3 keys": ["user.tier", "user.id", "gen_ai.request.model"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=40_000)
    parser.add_argument("--batch-spans", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    if args.spans < 1 or args.batch_spans < 1 or args.rounds < 1:
        parser.error("--spans, --batch-spans and --rounds must be positive")
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    _django()
    import store
    from analytics.summarizer import traces_summarize_ids

    bench_store = open_store(Path(tempfile.mkdtemp(prefix="tracedash-bench-index-")))
    store.set_store(bench_store)
    spans = recent_spans(args.spans, args.seed)
    bench_store.insert("spans", spans, tag="bench.attribute_index.spans")
    bench_store.command("OPTIMIZE TABLE spans FINAL", tag="bench.attribute_index.optimize")
    touched = bench_store.query(
        "SELECT trace_id, min(toUnixTimestamp64Nano(start_time)) AS first_ns, max(toUnixTimestamp64Nano(start_time)) AS last_ns,"
        " count() AS spans FROM spans WHERE project_id = {p:UInt64} GROUP BY trace_id ORDER BY first_ns",
        {"p": PROJECT_ID}, tag="bench.attribute_index.touched").dicts()
    batches, current, n = [], [], 0
    for t in touched:
        current.append(t)
        n += int(t["spans"])
        if n >= args.batch_spans:
            batches.append(current)
            current, n = [], 0
    if current:
        batches.append(current)
    print(f"{len(spans):,} spans in {len(touched):,} traces; {len(batches)} batches of ~{args.batch_spans:,} spans; "
          f"{args.rounds} rounds alternating {len(CONFIGS)} configurations")
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    rows: dict[str, int] = {}
    started = time.monotonic()
    for rnd in range(args.rounds):
        for label, keys in CONFIGS.items():
            for table_name in ("traces", "traces_by_start", "rollup_dirty", "span_key_values"):
                bench_store.command(f"TRUNCATE TABLE {table_name}", tag="bench.attribute_index.truncate")
            used = process_cpu_seconds()
            summarised = 0
            for batch in batches:
                _, n = traces_summarize_ids(project_id=PROJECT_ID, touched=batch, prices={}, keys=keys)
                summarised += n
            cpu[label].append((process_cpu_seconds() - used) / summarised * 1_000_000)
            rows[label] = int(bench_store.query("SELECT count() FROM span_key_values", tag="bench.attribute_index.rows").scalar())
            sys.stderr.write(f"\rround {rnd + 1}/{args.rounds}: {label:<16} {cpu[label][-1]:6.1f} ms CPU / 1k spans"
                             f"  ({time.monotonic() - started:.0f} s) ")
            sys.stderr.flush()
    sys.stderr.write("\n")
    base = statistics.median(cpu["no key declared"])
    lines = [[label, f"{statistics.median(v):.1f}", f"{statistics.median(v) / base:.2f}", f"{rows[label]:,}"]
             for label, v in cpu.items()]
    print(table(["declared keys", "summariser CPU ms / 1k spans", "ratio to none", "index rows a round"], lines))
    info = machine()
    print(f"machine: {info.get('cpu_model', '?')}, {info.get('nproc', '?')} CPUs")
    bench_store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
