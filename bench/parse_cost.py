"""The ingest path's Python share per span: a native batch parsed as the endpoint parses it and
turned into the insert's Arrow table as the writer does, in CPU µs per span.

    .venv/bin/python bench/parse_cost.py [--scenarios json-1000,json-100] [--rounds 7]

The bodies are ``bench/ingest.py``'s (40 distinct ones per scenario, every id unique). Each round
parses every body with ``ingest.schemas.parse_span_columns`` (what ``POST /api/v1/traces`` hands
the writer) and builds the Arrow table of ``store.backends.arrow_table`` from it, freeing both
before the next body, as a request does; the report gives the median and the lowest round. This is
the work that holds the GIL on the server's event loop and writer thread. To compare two commits,
run it in a worktree of each, alternately (docs/BENCHMARKS.md, "the native batch as columns").
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="json-1000,json-100")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--bodies", type=int, default=40)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.bodies < 1:
        parser.error("--rounds and --bodies must be positive")

    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["TRACEDASH_DATA_DIR"] = tempfile.mkdtemp(prefix="tracedash-bench-parse-")
    import django

    django.setup()
    from django.conf import settings

    from bench.ingest import build_scenarios
    from ingest.schemas import Limits, parse_span_columns
    from store.backends import arrow_table
    from store.schema import SPANS

    limits = Limits.from_settings(settings)
    names = [c.name for c in SPANS.insert_columns]
    types = [c.type for c in SPANS.insert_columns]
    numbers = itertools.count(1)
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    scenarios = {s.name: s for s in build_scenarios(7, pool_100=40, pool_1000=6)}
    unknown = [w for w in wanted if w not in scenarios or not w.startswith("json-")]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; native ones: json-100, json-1000")

    def one(body):
        arrow_table(names, types, parse_span_columns(body, project_id=1, limits=limits)[0])

    print(f"parse + Arrow table, CPU µs per span ({args.rounds} rounds of {args.bodies} bodies; median, lowest)")
    for name in wanted:
        scenario = scenarios[name]
        bodies = [scenario.patch(scenario.templates[i % len(scenario.templates)], next(numbers))
                  for i in range(args.bodies)]
        spans = len(bodies) * scenario.batch
        each = []
        for _ in range(args.rounds):
            started = time.process_time()
            for body in bodies:
                one(body)
            each.append((time.process_time() - started) / spans * 1e6)
        print(f"  {name:9s} {statistics.median(each):6.2f}  {min(each):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
