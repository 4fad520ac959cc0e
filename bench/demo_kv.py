"""How full the demo's KV cache runs at 1×, 2×, 3× the demo's load: for choosing its KV settings.

    .venv/bin/python bench/demo_kv.py [--blocks 16] [--block-tokens 16] [--threads 3,6,9] [--seconds 30]

The demo's own simulator configuration (``demo.workload.simulator_config()``: three models, each
its own pool) with ``--blocks`` KV-cache blocks of ``--block-tokens`` tokens per pool, served in
this process as ``make run`` does, and the demo's own traffic (``DemoApp`` in ``DemoLoop``
threads; the demo runs 3, so 6 is twice its load) with spans kept in memory. For each thread
count, ``--seconds`` of traffic while ``GET /metrics`` is read every 0.2 s with prometheus_client's
parser; printed per model: completed requests/s, KV-cache usage % (mean, P50, P90, max, share of
scrapes at or above 90 %), waiting requests (mean, max), preemptions, and the 400s of requests
that did not fit the context (which must stay 0: prompt + max_tokens within blocks × block tokens).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "sdk")]

import tracedash_sdk as td  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.common import percentile, table  # noqa: E402
from demo.simulator import serve  # noqa: E402
from demo.workload import DemoApp, DemoLoop, simulator_config  # noqa: E402

SERIES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
          "vllm:request_success_total")


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(model, sample name) -> value, request_success summed over finish reasons."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in SERIES:
                key = (s.labels["model_name"], s.name)
                out[key] = out.get(key, 0.0) + s.value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=16, help="KV-cache blocks per model pool [16]")
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--threads", default="3,6,9", help="DemoLoop threads per run (the demo runs 3) [3,6,9]")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    config = simulator_config(args.seed)
    config.kv_cache_blocks, config.kv_block_tokens = args.blocks, args.block_tokens
    models = config.model_names()
    print(f"demo simulator, every pool {args.blocks} blocks × {args.block_tokens} tokens "
          f"({args.blocks * args.block_tokens}-token context); models {', '.join(models)}", flush=True)
    rows = []
    with serve(config) as sim:
        app = DemoApp(td.Tracer(exporter=td.InMemoryExporter(), service="chat-api"), sim.url, seed=args.seed)
        for threads in (int(x) for x in args.threads.split(",") if x):
            print(f"  {threads} threads for {args.seconds:g} s …", file=sys.stderr, flush=True)
            loop = DemoLoop(app, threads=threads)
            rejected, before, samples = sim.stats()["rejected"], scrape(sim.url), []
            t0 = time.monotonic()
            loop.start()
            while time.monotonic() - t0 < args.seconds:
                samples.append(scrape(sim.url))
                time.sleep(0.2)
            after = scrape(sim.url)
            loop.stop()
            rejected = sim.stats()["rejected"] - rejected
            for model in models:
                kv = sorted(100 * s[(model, "vllm:kv_cache_usage_perc")] for s in samples)
                waiting = [s[(model, "vllm:num_requests_waiting")] for s in samples]
                done = after[(model, "vllm:request_success_total")] - before[(model, "vllm:request_success_total")]
                preempted = (after[(model, "vllm:num_preemptions_total")]
                             - before[(model, "vllm:num_preemptions_total")])
                rows.append([str(threads), model, f"{done / args.seconds:.1f}", f"{sum(kv) / len(kv):.0f}",
                             f"{percentile(kv, 50):.0f}", f"{percentile(kv, 90):.0f}", f"{kv[-1]:.0f}",
                             f"{100 * sum(k >= 90 for k in kv) / len(kv):.0f}",
                             f"{sum(waiting) / len(waiting):.2f} ({max(waiting):.0f})",
                             f"{preempted:.0f}",
                             str(rejected)])
            deadline = time.monotonic() + 30
            while sim.stats()["in_flight"] and time.monotonic() < deadline:  # the next run starts idle
                time.sleep(0.1)
    print()
    print(table(["threads", "model", "req/s", "KV % mean", "P50", "P90", "max", "% of time ≥ 90", "waiting (max)",
                 "preemptions", "400s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
