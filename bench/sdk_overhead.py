"""What tracing costs the host app: microseconds added per span by the Python SDK (tracedash_sdk).

    .venv/bin/python bench/sdk_overhead.py [--spans 100000] [--repeat 3] [--json PATH]

The host "app" is a tight loop whose body is a little Python work (about a microsecond). Each
traced iteration runs ``with tracer.span("handle", attributes={2 items}) as s:
s.set_attribute(...)`` around that work. Scenarios:

1. **baseline**: the loop without tracing.
2. **unsampled**: ``sample_rate=0`` — the cost of instrumentation that records nothing.
3. **sink up, paced**: the exporter sends to a tiny HTTP sink started in this process (answers 200
   like ``/api/v1/traces``). The loop runs in chunks of one batch (1,000 spans), each followed by
   ``flush()``, so the exporter never competes with the loop: **hot path** = the loop alone (what
   the app's thread pays per span), **all-in** = loop + flush (encoding, gzip, HTTP: the whole CPU
   cost of a span, whichever thread pays it). Nothing is dropped.
4. **sink up, free-running**: the loop flat out, the exporter working beside it on the same GIL,
   default 10,000-span queue. A tight loop makes spans faster than any exporter can send them, so
   most are dropped at the full queue: what this shows is that the loop keeps its speed.
5. **server down, free-running**: the endpoint is a closed port; the exporter retries, then drops.
   The loop must keep full speed: compared with the sink-up loop.

Plus the per-iteration latency distribution (p50/p99/p99.9/max) of the free-running loop with the
sink up and with the server down. Overhead per span = (traced loop − baseline loop) / spans. Each
figure is the median of ``--repeat`` runs, each with a fresh tracer. The sink's thread shares the
process (and the machine's cores) with the loop: the figures include that.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sdk"))

import logging  # noqa: E402

import tracedash_sdk as td  # noqa: E402

logging.getLogger("tracedash_sdk").setLevel(logging.ERROR)  # the drops below are intended


class Sink:
    """A local stand-in for ``POST /api/v1/traces`` that reads the body and answers 200."""

    def __init__(self):
        sink = self
        self.requests = 0
        self.bytes = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # answer at once (no delayed-ACK stall), as uvicorn does

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                sink.requests += 1
                sink.bytes += length
                body = b'{"accepted":0,"rejected":[]}'  # the SDK counts sent = batch - rejected
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def work(i: int) -> int:
    """The host app's own work per request: a little Python (about a microsecond)."""
    total = 0
    for j in range(8):
        total += i ^ j
    return total


def loop_plain(n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        work(i)
    return time.perf_counter() - t0


def loop_traced(n: int, tracer: td.Tracer) -> float:
    span = tracer.span
    t0 = time.perf_counter()
    for i in range(n):
        with span("handle", attributes={"request.id": i, "http.route": "/chat"}) as s:
            s.set_attribute("cache.hit", True)
            work(i)
    return time.perf_counter() - t0


def latencies(n: int, tracer: td.Tracer) -> dict:
    """Per-iteration wall time of the traced loop (p50, p99, p99.9, max), in microseconds."""
    clock = time.perf_counter
    span = tracer.span
    times = []
    for i in range(n):
        t0 = clock()
        with span("handle", attributes={"request.id": i, "http.route": "/chat"}) as s:
            s.set_attribute("cache.hit", True)
            work(i)
        times.append(clock() - t0)
    times.sort()
    return {"p50": times[n // 2] * 1e6, "p99": times[int(n * 0.99)] * 1e6, "p99.9": times[int(n * 0.999)] * 1e6,
            "max": times[-1] * 1e6}


def free_running(n: int, repeat: int, make):
    """The loop flat out while the exporter works beside it: median seconds, last stats."""
    runs, stats = [], {}
    for _ in range(repeat):
        tracer = make()
        runs.append(loop_traced(n, tracer))
        stats = tracer.exporter.stats
        tracer.shutdown(0.2)
    return statistics.median(runs), stats


def paced(n: int, repeat: int, make, chunk: int = 1_000):
    """Chunks of one batch (1,000 spans), each followed by ``flush()``: the loop never competes with
    the exporter, so loop time is the pure hot path and loop + flush time the all-in cost."""
    loops, totals, stats = [], [], {}
    for _ in range(repeat):
        tracer = make()
        loop = total = 0.0
        for _ in range(n // chunk):
            t0 = time.perf_counter()
            loop += loop_traced(chunk, tracer)
            assert tracer.flush(60), "flush timed out"
            total += time.perf_counter() - t0
        loops.append(loop)
        totals.append(total)
        stats = tracer.exporter.stats
        tracer.shutdown(1)
    return statistics.median(loops), statistics.median(totals), stats


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    n = args.spans - args.spans % 1_000

    loop_plain(n // 10)  # warm up
    base = statistics.median(loop_plain(n) for _ in range(args.repeat))
    unsampled, _ = free_running(n, args.repeat, lambda: td.Tracer(endpoint=closed_port_url(), api_key="k",
                                                                  sample_rate=0.0))
    sink = Sink()
    try:
        make_up = lambda: td.Tracer(endpoint=sink.url, api_key="k")  # noqa: E731 - defaults: 10,000-span queue
        hot, all_in, paced_stats = paced(n, args.repeat, make_up)
        sink_requests, sink_bytes = sink.requests, sink.bytes
        up_loop, up_stats = free_running(n, args.repeat, make_up)
        tracer = make_up()
        up_latency = latencies(n, tracer)
        tracer.shutdown(5)
    finally:
        sink.close()
    down_url = closed_port_url()
    make_down = lambda: td.Tracer(endpoint=down_url, api_key="k")  # noqa: E731
    down_loop, down_stats = free_running(n, args.repeat, make_down)
    tracer = make_down()
    down_latency = latencies(n, tracer)
    tracer.shutdown(0.2)

    def per_span(seconds):
        return (seconds - base) / n * 1e6

    rows = [
        ("baseline (no tracing)", base, None, None),
        ("unsampled (sample_rate=0)", unsampled, per_span(unsampled), None),
        ("sink up, paced: hot path", hot, per_span(hot), paced_stats),
        ("sink up, paced: all-in (+flush)", all_in, per_span(all_in), paced_stats),
        ("sink up, free-running", up_loop, per_span(up_loop), up_stats),
        ("server down, free-running", down_loop, per_span(down_loop), down_stats),
    ]
    cpu = platform.processor() or platform.machine()
    print(f"tracedash_sdk {td.__version__} overhead — Python {platform.python_version()}, {os.cpu_count()} CPUs ({cpu}), "
          f"{n:,} spans per run, median of {args.repeat}")
    print(f"{'scenario':32s} {'loop s':>7s} {'µs/iter':>8s} {'+µs/span':>9s} {'iter/s':>10s} {'sent':>8s} {'dropped':>8s}")
    for name, seconds, overhead, stats in rows:
        sent = "" if stats is None else f"{stats['spans_sent']:,}"
        dropped = "" if stats is None else f"{stats['spans_dropped']:,}"
        print(f"{name:32s} {seconds:7.3f} {seconds / n * 1e6:8.2f} {'' if overhead is None else f'{overhead:9.2f}':>9s} "
              f"{n / seconds:10,.0f} {sent:>8s} {dropped:>8s}")
    ratio = up_loop / down_loop
    print(f"host loop speed with the server down = {ratio:.2f}x its speed with the sink up "
          f"(>= 1: a dead server costs the app nothing; spans are dropped at the queue)")
    for name, lat in (("sink up", up_latency), ("server down", down_latency)):
        print(f"one traced iteration, {name:11s}: p50 {lat['p50']:.1f} µs, p99 {lat['p99']:.1f} µs, "
              f"p99.9 {lat['p99.9']:.0f} µs, max {lat['max'] / 1000:.1f} ms")
    print(f"sink (paced runs): {sink_requests} requests, {sink_bytes / 1e6:.1f} MB gzip for {n * args.repeat:,} spans "
          f"({sink_bytes / (n * args.repeat):.0f} B/span)")
    print(f"exporter stats, sink up free-running (last run): {up_stats}")
    print(f"exporter stats, server down (last run): {down_stats}")
    result = {
        "spans": n, "repeat": args.repeat, "python": platform.python_version(), "cpus": os.cpu_count(),
        "baseline_us_per_iter": base / n * 1e6,
        "unsampled_us_per_span": per_span(unsampled),
        "hot_path_us_per_span": per_span(hot),
        "all_in_us_per_span": per_span(all_in),
        "free_running_up_us_per_span": per_span(up_loop),
        "server_down_us_per_span": per_span(down_loop),
        "down_over_up_speed": ratio,
        "sink_bytes_per_span": sink_bytes / (n * args.repeat),
        "latency_up_us": up_latency, "latency_down_us": down_latency,
        "stats_paced": paced_stats, "stats_up": up_stats, "stats_down": down_stats,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
