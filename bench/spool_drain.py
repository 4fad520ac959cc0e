"""How fast the ingest spool drains once ClickHouse is back: one segment per insert (the replay
before replay groups) against replay groups (many segments per insert), in one run.

    .venv/bin/python bench/spool_drain.py [--segments 1000] [--traces 1] [--repeat 2]

Builds a fresh embedded ClickHouse (chdb) in a temp dir with the production migrations. For each
mode and repeat it fills a fresh spool with ``--segments`` segments of ``--traces`` five-span LLM
traces each (the first as a batch the writer tried, the rest as batches spooled behind it, as an
outage leaves them), then times one ``IngestWriter.replay`` of the whole spool (the replayer's own
code: reads, inserts, fsync'd deletions; group manifests for groups). It prints segments/s and
spans/s per mode (the best of the repeats), checks that every span was stored once, and prints
the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=1000, help="segments in the spool when ClickHouse is back")
    parser.add_argument("--traces", type=int, default=1, help="five-span traces per segment (one write batch)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="tracedash-bench-spool-"))
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "TRACEDASH_CLICKHOUSE_URL"):
        os.environ.pop(name, None)
    os.environ.update(TRACEDASH_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="config.settings")
    try:
        import logging

        import django

        django.setup()
        from ingest.schemas import Limits, parse_span
        from ingest.spool import Spool
        from ingest.writer import IngestWriter
        from store import get_store
        from store.migrator import MigrationContext, migrate
        from tests.spans import llm_trace

        logging.getLogger("tracedash.ingest.writer").setLevel(logging.WARNING)  # a line per insert otherwise
        store = get_store()
        migrate(store, MigrationContext(retention_days=30))
        limits = Limits()
        modes = {"one segment per insert": 0, "replay groups": None}
        best: dict[str, float] = {}
        project_id = 0
        for attempt in range(args.repeat):
            for mode, group_rows in modes.items():
                project_id += 1
                spool = Spool(data_dir / f"spool-{project_id}", max_bytes=1 << 34)
                batches = [[parse_span(json.dumps(s).encode(), project_id=project_id, limits=limits)
                            for _ in range(args.traces) for s in llm_trace()] for _ in range(args.segments)]
                writer = IngestWriter(spool, replay_interval=3600, replay_group_rows=group_rows)
                deadline = time.monotonic() + 60
                while writer.stats["replay_rounds"] < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)  # its replayer's first round, on the empty spool: then it sleeps
                for n, rows in enumerate(batches):  # appends do not wake it
                    spool.append("spans", f"bench-{project_id}-{n}", rows, solo=n == 0)
                spans = sum(map(len, batches))
                started = time.perf_counter()
                assert writer.replay(spool) and spool.pending() == 0
                seconds = time.perf_counter() - started
                inserts = writer.stats["replay_inserts"]
                writer.stop()
                stored = store.query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": project_id},
                                     tag="bench.spool.count").scalar()
                assert stored == spans, f"{mode}: {stored} spans stored of {spans}"
                rate = args.segments / seconds
                best[mode] = max(best.get(mode, 0.0), rate)
                print(f"  run {attempt + 1} {mode:>22}: {args.segments} segments ({spans} spans) in {seconds:6.2f} s"
                      f" = {rate:8.0f} segments/s, {spans / seconds:9.0f} spans/s, {inserts} replay inserts", flush=True)
        spans_per_segment = 5 * args.traces
        print(f"\nspool drain, {args.segments} segments of {spans_per_segment} spans, best of {args.repeat} (chdb):")
        for mode, rate in best.items():
            print(f"  {mode:>22}: {rate:8.0f} segments/s  {rate * spans_per_segment:9.0f} spans/s")
        before, after = best["one segment per insert"], best["replay groups"]
        print(f"  ratio (replay groups / one segment per insert): {after / before:.1f}x")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
