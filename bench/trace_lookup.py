"""What the summariser's lookup of the latest summaries by trace id costs as the store grows, and
whether a key-value table (ClickHouse's ``EmbeddedRocksDB`` engine) would keep it flat.

    .venv/bin/python bench/trace_lookup.py [--sizes 300000,2000000,6000000] [--lookups 8]

Each run of the summariser looks up the latest summary of the ~4,700 traces it touches (at 20,000
spans/s, every 2 s) by id (``analytics.summarizer._PREVIOUS_SQL``). ``traces`` is ordered by
``(project_id, trace_id)`` in granules of 1,024 rows, and the ids of a run are random, so the
lookup reads a granule of nearly every part: a share of the whole table. Here, for each size, a
fresh embedded store (one child process per size: chdb opens one data directory per process)
receives that many summaries in inserts of 5,000 rows (as the summariser writes them), into two
tables of the lookup's columns:

- ``mergetree``: ordered like ``traces`` (``ReplacingMergeTree(version)``, the same granularity),
  read as the summariser reads it (``ORDER BY version DESC LIMIT 1 BY trace_id``);
- ``bloom``: the same with a ``bloom_filter(0.0001)`` skipping index on ``trace_id`` (one filter per
  granule), which might skip the granules holding none of the ids;
- ``rocksdb``: ``EmbeddedRocksDB`` keyed by ``'<project>:<trace id>'``, read by key;
- ``memory``: what the summariser does on the embedded store (``analytics.trace_presence``, the
  class itself): the recent summaries (the last two inserts' traces) answered from memory, the
  others checked against a Bloom filter of every stored id (built once from the table: its time
  is printed), and only the filter's "maybe"s read from ``mergetree`` by id.

Each lookup asks for 4,700 ids: 2,350 of the last two inserts (a trace that grows within seconds,
the common case) and 2,350 that were never stored (new traces). Prints the median CPU of a lookup
(the process's, every chdb thread included) after two warm-up lookups.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import machine, process_cpu_seconds, table  # noqa: E402

BATCH = 5_000
RECENT = NEW = 2_350

_COLUMNS = ("spans_start DateTime64(9, 'UTC'), spans_end DateTime64(9, 'UTC'), start_time DateTime64(9, 'UTC'), "
            "has_root UInt8, version UInt64, spans_digest UInt64")
_VALUES = "now64(9), now64(9), now64(9), 1, 1, 0"
_READ = ("toUnixTimestamp64Nano(spans_start), toUnixTimestamp64Nano(spans_end), toUnixTimestamp64Nano(start_time), "
         "has_root, version, spans_digest")


def _trace_id(n: int) -> str:
    return hashlib.md5(str(n).encode()).hexdigest()  # what lower(hex(MD5(toString(n)))) gives


def measure(size: int, lookups: int, seed: int) -> dict:
    """One size, in this process: load, then time the lookups of both tables."""
    import chdb

    conn = chdb.connect(tempfile.mkdtemp(prefix="tracedash-bench-lookup-"))
    conn.query(f"CREATE TABLE mergetree (project_id UInt64, trace_id FixedString(32), {_COLUMNS}) "
               "ENGINE = ReplacingMergeTree(version) ORDER BY (project_id, trace_id) SETTINGS index_granularity = 1024")
    conn.query(f"CREATE TABLE bloom (project_id UInt64, trace_id FixedString(32), {_COLUMNS}, "
               "INDEX idx_trace trace_id TYPE bloom_filter(0.0001) GRANULARITY 1) "
               "ENGINE = ReplacingMergeTree(version) ORDER BY (project_id, trace_id) SETTINGS index_granularity = 1024")
    conn.query(f"CREATE TABLE rocksdb (key String, {_COLUMNS}) ENGINE = EmbeddedRocksDB PRIMARY KEY (key)")
    started = time.perf_counter()
    for first in range(0, size, BATCH):
        count = min(BATCH, size - first)
        ids = "lower(hex(MD5(toString(number))))"
        for name in ("mergetree", "bloom"):
            conn.query(f"INSERT INTO {name} SELECT 1, {ids}, {_VALUES} FROM numbers({first}, {count})")
        conn.query(f"INSERT INTO rocksdb SELECT concat('1:', {ids}), {_VALUES} FROM numbers({first}, {count})")
    load_s = time.perf_counter() - started
    statements = {
        "mergetree": f"SELECT trace_id, {_READ} FROM mergetree WHERE project_id = 1 AND trace_id IN "
                     "(SELECT arrayJoin(splitByChar(',', '{ids}'))) ORDER BY version DESC LIMIT 1 BY trace_id",
        "bloom": f"SELECT trace_id, {_READ} FROM bloom WHERE project_id = 1 AND trace_id IN "
                 "(SELECT arrayJoin(splitByChar(',', '{ids}'))) ORDER BY version DESC LIMIT 1 BY trace_id",
        "rocksdb": f"SELECT key, {_READ} FROM rocksdb WHERE key IN "
                   "(SELECT concat('1:', arrayJoin(splitByChar(',', '{ids}'))))",
    }
    import numpy as np

    from analytics.trace_presence import _ID_RANGES, BloomFilter, TracePresence, _fixed_ids
    from store import Columns

    before = process_cpu_seconds()
    bloom = BloomFilter(2 * size)
    for low, high in _ID_RANGES:  # as TracePresence builds it: a sixteenth of the sort key at a time
        bound = f" AND trace_id < '{high}'" if high else ""
        ids_read = conn.query(f"SELECT trace_id FROM mergetree WHERE project_id = 1 AND trace_id >= '{low}'{bound}",
                              "ArrowTable")
        bloom.add(1, _fixed_ids(ids_read.column("trace_id")))
    build_ms = (process_cpu_seconds() - before) * 1000
    presence = TracePresence(store=None)  # its filter set here: it never reads a store
    presence._filter = bloom
    for first in range(max(0, size - 2 * BATCH), size, BATCH):  # the last two inserts, as the summariser remembers them
        ids_written = [_trace_id(n) for n in range(first, min(size, first + BATCH))]
        zeros = np.zeros(len(ids_written), dtype=np.int64)
        presence.written(1, ids_written, Columns(dict(trace_id=ids_written, spans_start=zeros, spans_end=zeros,
                                                      start_time=zeros, has_root=zeros + 1, version=zeros + 1,
                                                      spans_digest=zeros), len(ids_written)))
    rng = random.Random(seed)
    cpu: dict[str, list[float]] = {name: [] for name in [*statements, "memory"]}
    false_positives = []
    for _ in range(lookups + 2):
        recent = [_trace_id(size - 1 - k) for k in rng.sample(range(min(size, 2 * BATCH)), min(RECENT, size))]
        new = [f"{rng.getrandbits(128):032x}" for _ in range(NEW)]
        ids = ",".join(recent + new)
        for name, statement in statements.items():
            before = process_cpu_seconds()
            found = conn.query(statement.replace("{ids}", ids), "ArrowTable").num_rows
            cpu[name].append(process_cpu_seconds() - before)
            if found != len(recent):
                raise SystemExit(f"{name}: found {found} of the {len(recent)} stored ids")
        before = process_cpu_seconds()
        known, ask = presence.split(1, recent + new)
        if ask:
            conn.query(statements["mergetree"].replace("{ids}", ",".join(ask)), "ArrowTable")
        cpu["memory"].append(process_cpu_seconds() - before)
        false_positives.append(len(ask))
        if len(known) != len(recent):
            raise SystemExit(f"memory: {len(known)} of the {len(recent)} recent ids")
    return {"size": size, "load_s": round(load_s, 1), "build_ms": round(build_ms, 1),
            "read_by_id": statistics.median(false_positives),
            **{name: round(statistics.median(values[2:]) * 1000, 1) for name, values in cpu.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="300000,2000000,6000000", help="summaries stored, comma-separated")
    parser.add_argument("--lookups", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one size
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.lookups, args.seed)))
        return 0
    rows = []
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        print(f"{size:,} summaries: loading and looking up…", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--one", str(size), "--lookups", str(args.lookups),
                              "--seed", str(args.seed)], check=True, capture_output=True, text=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        rows.append([f"{size:,}", f"{got['load_s']}", f"{got['mergetree']:,.1f}", f"{got['bloom']:,.1f}",
                     f"{got['rocksdb']:,.1f}", f"{got['memory']:,.1f}", f"{got['read_by_id']:g}",
                     f"{got['build_ms']:,.0f}"])
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"CPU ms per lookup of {RECENT + NEW:,} ids ({RECENT:,} stored in the last two inserts, {NEW:,} never "
          f"stored); median of {args.lookups}")
    print(table(["summaries stored", "load s", "mergetree (as traces)", "with a bloom filter index", "rocksdb (key-value)",
                 "memory (trace_presence)", "of which read by id", "filter build ms (once)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
