"""What per-project retention costs: the daily delete on a loaded spans table.

    .venv/bin/python bench/retention.py [--spans 2000000] [--days 30] [--keep 7]

Builds a fresh embedded ClickHouse (chdb) in a temp dir with the production migrations, fills
``spans`` server-side (INSERT … SELECT FROM numbers) with ``--spans`` rows per project for two
projects spread evenly over the last ``--days`` days, then runs the retention service's own
``project_data_expire`` for project 1 with ``--keep`` days (every data table; only ``spans`` is
loaded) and prints the seconds it took and the rows before and after, per project.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--spans", type=int, default=2_000_000, help="span rows per project")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--keep", type=int, default=7, help="project 1's retention in days")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="tracedash-bench-retention-"))
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "TRACEDASH_CLICKHOUSE_URL"):
        os.environ.pop(name, None)
    os.environ.update(TRACEDASH_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="config.settings",
                      TRACEDASH_RETENTION_DAYS=str(args.days + 5))
    try:
        import django

        django.setup()
        from django.conf import settings

        from analytics.retention_services import RETENTION_COLUMNS, project_data_expire
        from store import get_store
        from store.migrator import MigrationContext, migrate

        store = get_store()
        migrate(store, MigrationContext(retention_days=settings.TRACEDASH_RETENTION_DAYS))
        now_ns = time.time_ns()
        span_ns = args.days * 86400 * 10**9
        started = time.monotonic()
        for project_id in (1, 2):
            done = 0
            while done < args.spans:  # batches of 500k rows, progress on each
                n = min(500_000, args.spans - done)
                store.command(
                    "INSERT INTO spans (project_id, trace_id, span_id, name, phase, service, model, start_time, "
                    "duration_ns, status) SELECT {p:UInt64}, leftPad(hex(number), 32, '0'), "
                    "leftPad(hex(number), 16, '0'), 'chat', 'inference', 'chat-api', 'gpt-4o-mini', "
                    "fromUnixTimestamp64Nano(toInt64({now:Int64} - intDiv({span:Int64}, {total:UInt64}) * number), 'UTC'), "
                    "1000000, 'ok' FROM numbers({offset:UInt64}, {n:UInt64})",
                    {"p": project_id, "now": now_ns, "span": span_ns, "total": args.spans, "offset": done, "n": n},
                    tag="bench.retention.load")
                done += n
                print(f"  project {project_id}: {done:,}/{args.spans:,} spans loaded", flush=True)
        print(f"loaded {2 * args.spans:,} spans over {args.days} days in {time.monotonic() - started:.1f} s")

        def counts() -> dict[int, tuple[int, int]]:
            cutoff = now_ns - args.keep * 86400 * 10**9
            rows = store.query(
                "SELECT project_id, count(), countIf(start_time < fromUnixTimestamp64Nano({c:Int64}, 'UTC')) "
                "FROM spans GROUP BY project_id ORDER BY project_id", {"c": cutoff}, tag="bench.retention.count").rows
            return {r[0]: (r[1], r[2]) for r in rows}

        before = counts()
        started = time.monotonic()
        project_data_expire(project_id=1, retention_days=args.keep, now_ns=now_ns)
        seconds = time.monotonic() - started
        after = counts()
        print(f"project_data_expire(project 1, keep {args.keep} days) over {len(RETENTION_COLUMNS)} tables: "
              f"{seconds:.2f} s")
        for project_id in (1, 2):
            print(f"  project {project_id}: rows {before[project_id][0]:,} -> {after[project_id][0]:,}; "
                  f"older than {args.keep} days {before[project_id][1]:,} -> {after[project_id][1]:,}")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
