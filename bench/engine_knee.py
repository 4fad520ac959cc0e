"""The engine-side knee: where the KV cache fills, requests wait and TTFT rises, all at once.

    .venv/bin/python bench/engine_knee.py [--steps 1,2,4,8,16,32,64] [--step-seconds 4] [--html PATH] [--json PATH]

Starts the LLM simulator (demo.simulator) in its own process (so that client and server do not
share a GIL) with the KV-cache model on: ``--capacity`` slots, ``--kv-cache-blocks`` blocks of
``--kv-block-tokens`` tokens, every request a streamed chat completion of ``--prompt-tokens`` prompt
tokens and exactly ``--max-tokens`` output tokens (so a request holds 16 to 24 blocks at the
defaults, and about a dozen fill the cache, far below the slots). Closed loop: each step keeps
``C`` requests in flight for ``--step-seconds`` (a finished request is replaced at once; the next
step adds workers), with C = 1, 2, 4, ... 64. Meanwhile a thread scrapes ``GET /metrics`` every
``--scrape-interval`` seconds and parses it with prometheus_client's parser, as the product's agent
does.

Printed per step: concurrency; completed requests/s and engine output tokens/s (the
vllm:generation_tokens counter's increase); client-side TTFT P50/P95 (time from sending to the
first content chunk, of the requests whose first token came during the step; nearest rank) beside
the engine's own TTFT P95 (vllm:time_to_first_token_seconds over the step, interpolated within the
bucket as Prometheus' histogram_quantile does); running and waiting requests and KV-cache usage
(mean over the step's scrapes, and the highest); preemptions during the step. Then the knee: the
first step whose KV usage reached ``--knee-kv`` (90 %, the product's line). ``--html`` writes a
self-contained plotly page (plotly.js inlined from the installed package, nothing fetched) with
one shared time axis: KV usage %, waiting (and running) requests, client TTFT P95 over the last
second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "sdk")]

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.common import free_port, percentile, table  # noqa: E402
from tracedash_sdk.loadtest import ConnectionPool, Target  # noqa: E402
from tracedash_sdk.loadtest._http import chat_completion  # noqa: E402

MODEL = "sim-gpt"
WORDS = "the model reads a long context before it answers the question about latency and cache ".split()


def start_simulator(args) -> tuple[subprocess.Popen, int]:
    port = free_port()
    flags = {"--capacity": args.capacity, "--kv-cache-blocks": args.kv_cache_blocks,
             "--kv-block-tokens": args.kv_block_tokens, "--prefill-ms": args.prefill_ms,
             "--prefill-ms-per-token": args.prefill_ms_per_token, "--decode-ms-per-token": args.decode_ms,
             "--load-slowdown": args.load_slowdown, "--jitter": args.jitter, "--queue-delay-ms": 0,
             "--error-rate": 0, "--seed": 1, "--default-model": MODEL, "--port": port, "--log-level": "warning"}
    command = [sys.executable, "-m", "demo.simulator", *(str(x) for kv in flags.items() for x in kv)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("the simulator did not start")
            time.sleep(0.1)


def prompt_of(tokens: int) -> str:
    """A user message of ``tokens`` prompt tokens (the simulator counts ceil(chars / 4))."""
    text = ""
    while len(text) < 4 * tokens:
        text += " ".join(WORDS) + " "
    return text[:4 * tokens]


# --------------------------------------------------------------------------------------------------
# The engine's side: /metrics every interval


class Scraper(threading.Thread):
    """GET /metrics every ``interval`` s; keeps (time, values) with the time on perf_counter."""

    def __init__(self, port: int, interval: float):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.samples: list[dict] = []
        self.errors = 0
        self._halt = threading.Event()  # not _stop: threading.Thread has one

    def scrape(self) -> dict:
        with urllib.request.urlopen(self.url, timeout=5) as response:
            text = response.read().decode()
        out: dict = {"t": time.perf_counter(), "ttft_buckets": {}}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("model_name") != MODEL:
                    continue
                if s.name == "vllm:time_to_first_token_seconds_bucket":
                    out["ttft_buckets"][float(s.labels["le"])] = s.value
                elif s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                                "vllm:num_preemptions_total", "vllm:generation_tokens_total",
                                "vllm:time_to_first_token_seconds_count"):
                    out[s.name.removeprefix("vllm:")] = s.value
        return out

    def run(self):
        while not self._halt.is_set():
            try:
                self.samples.append(self.scrape())
            except (OSError, ValueError):
                self.errors += 1
            self._halt.wait(self.interval)

    def stop(self):
        self._halt.set()
        self.join(10)


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over the increase of cumulative buckets between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if math.isinf(bound):
                return lower  # in the +Inf bucket: the highest finite bound, as Prometheus answers
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
        lower, below = bound, count
    return lower


# --------------------------------------------------------------------------------------------------
# The client's side: closed-loop workers


class Record:
    __slots__ = ("sent", "first", "done", "tokens", "ok")

    def __init__(self, sent: float):
        self.sent, self.first, self.done, self.tokens, self.ok = sent, None, None, 0, False


async def worker(pool: ConnectionPool, body: bytes, max_tokens: int, records: list[Record], stop_at: float):
    clock = time.perf_counter
    while clock() < stop_at:
        record = Record(clock())
        records.append(record)
        outcome = await chat_completion(pool, body, stream=True, clock=clock,
                                        on_first_token=lambda r=record: setattr(r, "first", clock()))
        record.done = clock()
        record.tokens = outcome.output_tokens
        record.ok = outcome.status == 200 and outcome.error is None and outcome.output_tokens == max_tokens


async def drive(port: int, args, steps: list[int]) -> tuple[list[Record], list[tuple[float, float, int]]]:
    """Run the steps; returns the request records and (start, end, concurrency) per step."""
    pool = ConnectionPool(Target(f"http://127.0.0.1:{port}/v1"))
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt_of(args.prompt_tokens)}],
                       "max_tokens": args.max_tokens, "stream": True}).encode()
    records: list[Record] = []
    windows: list[tuple[float, float, int]] = []
    start = time.perf_counter()
    end = start + args.step_seconds * len(steps)
    tasks: list[asyncio.Task] = []
    for i, concurrency in enumerate(steps):
        t = start + i * args.step_seconds
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        print(f"  step {i + 1}/{len(steps)}: {concurrency} requests in flight", file=sys.stderr, flush=True)
        tasks += [asyncio.ensure_future(worker(pool, body, args.max_tokens, records, end))
                  for _ in range(concurrency - len(tasks))]
        windows.append((t, t + args.step_seconds, concurrency))
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    for task in tasks:  # the requests still in flight are abandoned (the simulator frees them)
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    pool.close()
    return records, windows


# --------------------------------------------------------------------------------------------------
# Results


def step_rows(records: list[Record], windows, samples: list[dict]) -> list[dict]:
    rows = []
    for start, end, concurrency in windows:
        ttft = sorted((r.first - r.sent) * 1000 for r in records if r.first is not None and start <= r.first < end)
        done = [r for r in records if r.done is not None and r.ok and start <= r.done < end]
        inside = [s for s in samples if start <= s["t"] < end]
        before = max((s for s in samples if s["t"] < start), key=lambda s: s["t"], default=None)
        last = inside[-1] if inside else None
        span = (last["t"] - before["t"]) if before and last else 0.0

        def increase(key):
            return last[key] - before[key] if before and last else None

        engine_p95 = histogram_quantile(0.95, before["ttft_buckets"], last["ttft_buckets"]) if before and last else None
        rows.append({
            "concurrency": concurrency,
            "completed": len(done),
            "rps": len(done) / (end - start),
            "tokens_per_s": increase("generation_tokens_total") / span if span else None,
            "client_ttft_ms": {"p50": percentile(ttft, 50), "p95": percentile(ttft, 95), "n": len(ttft)},
            "engine_ttft_p95_ms": engine_p95 * 1000 if engine_p95 is not None else None,
            "running": mean([s["num_requests_running"] for s in inside]),
            "waiting": mean([s["num_requests_waiting"] for s in inside]),
            "waiting_max": max((s["num_requests_waiting"] for s in inside), default=None),
            "kv_percent": mean([100 * s["kv_cache_usage_perc"] for s in inside]),
            "kv_percent_max": max((100 * s["kv_cache_usage_perc"] for s in inside), default=None),
            "preemptions": increase("num_preemptions_total"),
            "scrapes": len(inside),
        })
    return rows


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def fmt(value, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def print_table(rows: list[dict]) -> None:
    headers = ["in flight", "req/s", "tok/s", "client TTFT P50 ms", "P95 ms", "engine TTFT P95 ms", "running",
               "waiting (max)", "KV % (max)", "preemptions"]
    print(table(headers, [[
        str(r["concurrency"]), fmt(r["rps"], 1), fmt(r["tokens_per_s"]), fmt(r["client_ttft_ms"]["p50"]),
        fmt(r["client_ttft_ms"]["p95"]), fmt(r["engine_ttft_p95_ms"]), fmt(r["running"], 1),
        f"{fmt(r['waiting'], 1)} ({fmt(r['waiting_max'])})", f"{fmt(r['kv_percent'])} ({fmt(r['kv_percent_max'])})",
        fmt(r["preemptions"])] for r in rows]))


def knee_of(rows: list[dict], kv_line: float) -> dict | None:
    """The first step whose KV usage reached ``kv_line`` %, with the step before it."""
    for i, row in enumerate(rows):
        if row["kv_percent_max"] is not None and row["kv_percent_max"] >= kv_line:
            return {"step": i, "before": rows[i - 1] if i else None, "at": row}
    return None


def write_html(path: str, records: list[Record], windows, samples: list[dict], kv_line: float, config: str) -> None:
    from plotly.subplots import make_subplots

    from charts import BASE_LAYOUT

    t0 = windows[0][0]
    times = [s["t"] - t0 for s in samples]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("KV-cache usage (vllm:kv_cache_usage_perc)",
                                        "Requests (vllm:num_requests_waiting / _running)",
                                        "Client TTFT P95 over the last second"))
    fig.add_scatter(x=times, y=[100 * s["kv_cache_usage_perc"] for s in samples], name="KV usage %", row=1, col=1,
                    line={"color": "#e15759"})
    fig.add_hline(y=kv_line, row=1, col=1, line={"dash": "dash", "color": "#b00020", "width": 1},
                  annotation_text=f"{kv_line:g} %", annotation_position="top left")
    fig.add_scatter(x=times, y=[s["num_requests_waiting"] for s in samples], name="waiting", row=2, col=1,
                    line={"color": "#f28e2b"})
    fig.add_scatter(x=times, y=[s["num_requests_running"] for s in samples], name="running", row=2, col=1,
                    line={"color": "#4e79a7", "dash": "dot"})
    firsts = sorted((r.first, (r.first - r.sent) * 1000) for r in records if r.first is not None)
    p95 = []
    for t in (s["t"] for s in samples):
        window = sorted(ms for at, ms in firsts if t - 1.0 < at <= t)
        p95.append(percentile(window, 95))
    fig.add_scatter(x=times, y=p95, name="client TTFT P95 (ms)", row=3, col=1, connectgaps=False,
                    line={"color": "#59a14f"})
    for start, _, concurrency in windows:
        fig.add_vline(x=start - t0, line={"color": "#bab0ac", "width": 1, "dash": "dot"})
        fig.add_annotation(x=start - t0, y=1.0, xref="x", yref="y domain", text=f"{concurrency} in flight",
                           showarrow=False, xanchor="left", yanchor="top", font={"size": 10})
    fig.update_layout(**{**BASE_LAYOUT, "paper_bgcolor": "white", "plot_bgcolor": "white"},
                      title=f"Engine knee — {config}", height=820)
    fig.update_yaxes(title_text="%", range=[0, 115], row=1, col=1)  # the top band for the step labels
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_yaxes(title_text="ms", row=3, col=1)
    fig.update_xaxes(title_text="seconds since the first step", row=3, col=1)
    fig.write_html(path, include_plotlyjs=True, full_html=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="1,2,4,8,16,32,64", help="requests in flight per step [1,2,4,8,16,32,64]")
    parser.add_argument("--step-seconds", type=float, default=4.0)
    parser.add_argument("--scrape-interval", type=float, default=0.5)
    parser.add_argument("--capacity", type=int, default=64, help="the simulator's slots [64]")
    parser.add_argument("--kv-cache-blocks", type=int, default=256)
    parser.add_argument("--kv-block-tokens", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens of every request [128]")
    parser.add_argument("--prefill-ms", type=float, default=20.0)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.1)
    parser.add_argument("--decode-ms", type=float, default=10.0, help="ms per output token at nominal speed [10]")
    parser.add_argument("--load-slowdown", type=float, default=0.5)
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--knee-kv", type=float, default=90.0, help="KV usage %% that marks the knee [90]")
    parser.add_argument("--html", metavar="PATH", help="write the time series as a self-contained plotly page")
    parser.add_argument("--json", dest="json_path", metavar="PATH")
    args = parser.parse_args()
    steps = [int(x) for x in args.steps.split(",") if x]
    config = (f"{args.capacity} slots, {args.kv_cache_blocks} KV blocks × {args.kv_block_tokens} tokens; "
              f"{args.prompt_tokens} prompt + {args.max_tokens} output tokens per request, "
              f"{args.decode_ms:g} ms/token")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"simulator: {config}; a request holds {math.ceil(args.prompt_tokens / args.kv_block_tokens)}–"
          f"{math.ceil((args.prompt_tokens + args.max_tokens) / args.kv_block_tokens)} blocks", flush=True)
    proc, port = start_simulator(args)
    scraper = Scraper(port, args.scrape_interval)
    try:
        scraper.samples.append(scraper.scrape())  # the baseline before the first step
        scraper.start()
        records, windows = asyncio.run(drive(port, args, steps))
    finally:
        try:
            scraper.stop()
        finally:
            proc.terminate()
            proc.wait(10)
    rows = step_rows(records, windows, scraper.samples)
    print()
    print_table(rows)
    failed = [r for r in records if r.done is not None and not r.ok]
    print(f"\n{sum(r['completed'] for r in rows)} requests completed with {args.max_tokens} tokens, "
          f"{len(failed)} failed or short; {len(scraper.samples)} scrapes ({scraper.errors} failed)")
    knee = knee_of(rows, args.knee_kv)
    if knee and knee["before"]:
        b, a = knee["before"], knee["at"]
        print(f"knee: {b['concurrency']} -> {a['concurrency']} in flight: KV usage {fmt(b['kv_percent_max'])} % -> "
              f"{fmt(a['kv_percent_max'])} %, waiting {fmt(b['waiting'], 1)} -> {fmt(a['waiting'], 1)}, "
              f"client TTFT P95 {fmt(b['client_ttft_ms']['p95'])} -> {fmt(a['client_ttft_ms']['p95'])} ms, "
              f"preemptions {fmt(b['preemptions'])} -> {fmt(a['preemptions'])}")
    elif knee:
        print(f"knee: KV usage reached {args.knee_kv:g} % at the first step")
    else:
        print(f"no knee: KV usage stayed under {args.knee_kv:g} %")
    if args.html:
        write_html(args.html, records, windows, scraper.samples, args.knee_kv, config)
        print(f"wrote {args.html}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"config": vars(args), "steps": rows, "knee": knee}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
