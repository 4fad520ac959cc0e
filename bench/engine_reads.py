"""What the inference-engine reads cost: the Engines page's series and the engine alert rules' window.

    .venv/bin/python bench/engine_reads.py [--instances 4] [--hours 24] [--interval 10] [--rounds 5]

Writes ``--hours`` of scrapes every ``--interval`` seconds for ``--instances`` vLLM instances (the
rows the agent writes for a vLLM V1 server: 3 gauges, 4 counters, 4 histograms of vLLM's real bucket
counts with their sums — about 90 rows a scrape) into a fresh embedded store, then times, median of
``--rounds``:

- ``analytics.engines.engine_series`` over 15 min, 1 h, 6 h and the whole period (what
  ``/engines/series.json`` reads; the app-side trace series are not included);
- ``analytics.engines.window_figures`` over 1 and 5 minutes (one alert round's engine query, shared
  by every engine rule of that window).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import machine, table  # noqa: E402

PROJECT_ID = load_spans.PROJECT_ID
# vLLM V1's bucket bounds (vllm/v1/metrics/loggers.py), seconds
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
E2E = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
       960.0, 1920.0, 7680.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
HISTOGRAMS = {"ttft_seconds": (TTFT, 0.12), "e2e_seconds": (E2E, 1.4), "queue_seconds": (TTFT, 0.03),
              "inter_token_seconds": (ITL, 0.02)}


def _rows(instances: int, start_s: int, hours: float, interval: int, seed: int = 3):
    """Scrape rows in time order, a batch per hour of data."""
    rng = random.Random(seed)
    counters = [dict.fromkeys(("preemptions", "prompt_tokens", "generation_tokens", "requests_succeeded"), 0.0)
                for _ in range(instances)]
    buckets = [{m: [0.0] * (len(bounds) + 1) for m, (bounds, _) in HISTOGRAMS.items()} for _ in range(instances)]
    sums = [dict.fromkeys(HISTOGRAMS, 0.0) for _ in range(instances)]
    batch = []
    steps = int(hours * 3600 / interval)
    for step in range(steps):
        t = start_s + step * interval
        ns = t * 10**9
        for i in range(instances):
            target = f"http://gpu-{i}:8000/metrics"
            load = 0.5 + 0.5 * math.sin(t / 1800 + i)
            done = rng.randint(0, int(20 * load) + 1)
            base = {"project_id": PROJECT_ID, "time": ns, "host": f"gpu-{i}", "engine": "vllm", "target": target,
                    "model": "llama-3.1-8b"}
            for metric, value in (("requests_running", rng.randint(0, 32)), ("requests_waiting", rng.randint(0, 8)),
                                  ("kv_cache_usage", min(100.0, 100 * load * rng.uniform(0.6, 1.1)))):
                batch.append({**base, "metric": metric, "le": 0.0, "value": float(value)})
            c = counters[i]
            c["preemptions"] += rng.random() < 0.05 * load
            c["prompt_tokens"] += done * 500
            c["generation_tokens"] += done * 120
            c["requests_succeeded"] += done
            for metric, value in c.items():
                batch.append({**base, "metric": metric, "le": 0.0, "value": value})
            for metric, (bounds, typical) in HISTOGRAMS.items():
                counts = buckets[i][metric]
                for _ in range(done):
                    observed = rng.lognormvariate(math.log(typical), 0.6)
                    sums[i][metric] += observed
                    for k, bound in enumerate(bounds + [math.inf]):
                        if observed <= bound:
                            counts[k] += 1
                cumulative = 0.0
                for bound, count in zip(bounds + [math.inf], counts):
                    cumulative += count
                    batch.append({**base, "metric": metric, "le": bound, "value": cumulative})
                batch.append({**base, "metric": metric + "_sum", "le": 0.0, "value": sums[i][metric]})
        if len(batch) >= 200_000:
            yield batch
            batch = []
    if batch:
        yield batch


def _median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--interval", type=int, default=10, help="seconds between scrapes")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    load_spans._django()
    import store as store_module
    from analytics.engines import engine_series, window_figures

    bench_store = load_spans.open_store(Path(tempfile.mkdtemp(prefix="tracedash-engine-bench-")))
    store_module.set_store(bench_store)
    end_s = int(time.time()) // args.interval * args.interval
    start_s = end_s - int(args.hours * 3600)
    written, began = 0, time.perf_counter()
    for batch in _rows(args.instances, start_s, args.hours, args.interval):
        bench_store.insert("engine_samples", batch, tag="bench.engine_reads.load")
        written += len(batch)
        print(f"\rwritten {written:,} engine sample rows ({time.perf_counter() - began:.0f} s)", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)
    end = datetime.fromtimestamp(end_s, tz=timezone.utc)
    rows = []
    for label, span in (("15 min", timedelta(minutes=15)), ("1 h", timedelta(hours=1)), ("6 h", timedelta(hours=6)),
                        (f"{args.hours:g} h", timedelta(hours=args.hours))):
        series = engine_series(project_id=PROJECT_ID, start=end - span, end=end)
        ms = _median_ms(lambda s=span: engine_series(project_id=PROJECT_ID, start=end - s, end=end), args.rounds)
        rows.append([f"series {label}", f"{len(series.times)} × {series.step_seconds} s",
                     f"{len(series.instances)}", f"{ms:.0f}"])
    for seconds in (60, 300):
        figures = window_figures(project_id=PROJECT_ID, start=end - timedelta(seconds=seconds), end=end)
        ms = _median_ms(lambda s=seconds: window_figures(project_id=PROJECT_ID, start=end - timedelta(seconds=s),
                                                          end=end), args.rounds)
        rows.append([f"alert window {seconds} s", "1", f"{len(figures)}", f"{ms:.0f}"])
    info = machine()
    print(f"\nengine reads over {written:,} rows ({args.instances} vLLM instances, {args.hours:g} h, a scrape every "
          f"{args.interval} s), median of {args.rounds}")
    print(table(["read", "buckets", "instances", "ms"], rows))
    print(f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
