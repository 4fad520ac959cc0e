"""What the cache figures cost: the overview's and costs page's cache reads, and the ingest mapping.

    .venv/bin/python bench/cache_figures.py [--spans 500000] [--rounds 7]

1. **Reads** (``analytics.cache_selectors.cache_savings``). Loads ``--spans`` realistic LLM spans
   over one day (``bench/load_spans.py``'s generator and summaries) into a fresh embedded store,
   then re-summarises every trace with a cache outcome (a new ``traces`` version, as the summariser
   writes when a late span arrives: 30 % of requests hits, 30 % misses, the rest no cache), and
   times what a page asks for: the window with its series (24 h, 1 h) and the previous window
   without (``series=False``), median of ``--rounds``.
2. **Ingest mapping** (``ingest.schemas.cache_state``): a native batch of 1,000 spans (five
   attributes each, a third of them a cache lookup) parsed by ``parse_spans``, with the mapping
   and with it replaced by a constant, interleaved; and the mapping alone per span.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import timeit
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import machine, table  # noqa: E402

_MARK_SQL = """INSERT INTO traces SELECT * REPLACE (
    multiIf(cityHash64(trace_id) % 10 < 3, 2, cityHash64(trace_id) % 10 < 6, 1, 0) AS cache, version + 1 AS version)
FROM traces WHERE project_id = {project_id:UInt64}"""


def _median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _batch() -> bytes:
    spans = []
    for i in range(1000):
        attributes = {"http.route": "/v1/chat", "user.id": f"u-{i % 97:05d}", "session.id": f"s-{i % 31}",
                      "gen_ai.system": "openai", "retry.attempt": str(i % 3)}
        if i % 3 == 0:
            attributes["tracedash.cache.hit"] = i % 2 == 0
        spans.append({"trace_id": f"{i + 1:032x}", "span_id": f"{i + 1:016x}", "name": "cache semantic",
                      "phase": "preprocess", "service": "chat-api", "start_time": 1_796_040_000_000_000_000 + i,
                      "duration_ms": 2.5, "attributes": attributes})
    return json.dumps({"spans": spans}).encode()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    load_spans._django()
    import store as store_module
    from analytics.cache_selectors import cache_savings
    from ingest import schemas

    bench_store = load_spans.open_store(Path(tempfile.mkdtemp(prefix="tracedash-cache-bench-")))
    store_module.set_store(bench_store)
    now_ns = time.time_ns()
    load_spans.load(store=bench_store, spans_wanted=args.spans, days=1, batch=20_000, seed=5, now_ns=now_ns)
    bench_store.command(_MARK_SQL, {"project_id": load_spans.PROJECT_ID}, tag="bench.cache_figures.mark")
    traces = bench_store.query("SELECT uniqExact(trace_id) FROM traces", tag="bench.cache_figures.count").scalar()
    now = datetime.fromtimestamp(now_ns / 1e9, tz=timezone.utc)
    rows = []
    for label, span in (("24 h", timedelta(days=1)), ("1 h", timedelta(hours=1))):
        start = now - span
        window = cache_savings(project_id=load_spans.PROJECT_ID, start=start, end=now)
        with_series = _median_ms(lambda: cache_savings(project_id=load_spans.PROJECT_ID, start=start, end=now),
                                 args.rounds)
        totals_only = _median_ms(lambda: cache_savings(project_id=load_spans.PROJECT_ID, start=start - span,
                                                       end=start, series=False), args.rounds)
        rows.append([label, f"{window.totals.consulted:,}", f"{100 * (window.totals.hit_rate or 0):.1f} %",
                     f"{len(window.endpoints)}", f"{with_series:.0f}", f"{totals_only:.0f}"])

    body, limits = _batch(), schemas.Limits()
    real = schemas.cache_state
    parse = {"with the mapping": [], "without (constant)": []}
    for _ in range(args.rounds * 3):
        for name in parse:
            schemas.cache_state = real if name == "with the mapping" else (lambda attributes: 0)
            started = time.perf_counter()
            parsed, rejected = schemas.parse_spans(body, project_id=1, limits=limits)
            parse[name].append((time.perf_counter() - started) * 1e6 / len(parsed))
            assert not rejected
    schemas.cache_state = real
    sample = {"http.route": "/v1/chat", "user.id": "u-00042", "tracedash.cache.hit": "true"}
    plain = {"http.route": "/v1/chat", "user.id": "u-00042"}
    per_call = {label: min(timeit.repeat(lambda a=attrs: real(a), number=100_000, repeat=5)) * 1e6 / 100_000
                for label, attrs in (("a cache lookup span", sample), ("any other span", plain))}

    info = machine()
    print(f"\ncache reads over {args.spans:,} spans ({traces:,} traces, one day), median of {args.rounds}")
    print(table(["window", "requests that consulted a cache", "hit rate", "endpoints", "window + series ms",
                 "previous window (totals) ms"], rows))
    print("\nnative parse_spans, 1,000 spans a batch (µs per span, median)")
    print(table(["mapping", "µs per span"], [[k, f"{statistics.median(v):.2f}"] for k, v in parse.items()]))
    print(table(["cache_state alone", "µs per span"], [[k, f"{v:.3f}"] for k, v in per_call.items()]))
    print(f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
