"""The simulator's engine side (demo.simulator): vLLM's Prometheus metrics on GET /metrics and the
paged KV-cache model (blocks fill with concurrency, FCFS admission, recompute preemption).

Plain tests: no Django database, no ClickHouse. Each test starts its own simulator with serve() and
talks to it over HTTP; /metrics is read with prometheus_client's own parser, as a scraper would.
Waits are on state (wait_until), never on sleeps; timing checks are lower bounds plus generous
ceilings (a loaded machine can only make things later).
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from demo.simulator import ModelProfile, SimulatorConfig, _build_parser, config_from_args, serve
from tests.conftest import wait_until
from tests.test_simulator import CHAT, call, chat, concurrently, simulator  # noqa: F401 - simulator is a fixture

# vLLM's V1 engine metrics (vllm/v1/metrics/loggers.py): name -> type, and the histograms' bucket
# boundaries, written out here rather than read from the simulator so that a change there fails.
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0]
HISTOGRAMS = {"vllm:time_to_first_token_seconds": TTFT_BUCKETS, "vllm:inter_token_latency_seconds": ITL_BUCKETS,
              "vllm:e2e_request_latency_seconds": REQUEST_BUCKETS, "vllm:request_queue_time_seconds": REQUEST_BUCKETS}


class Scrape:
    """One GET /metrics, parsed by prometheus_client.parser."""

    def __init__(self, port: int):
        reply = call(port, "GET", "/metrics")
        assert reply.status == 200, reply.body[:300]
        assert reply.headers["content-type"] == CONTENT_TYPE_LATEST
        self.families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}

    def value(self, name: str, model: str = "sim-gpt", **labels) -> float:
        """The one sample called ``name`` (e.g. ``vllm:prompt_tokens_total``) of ``model``."""
        want = {"model_name": model, "engine": "0", **labels}
        found = [s.value for f in self.families.values() for s in f.samples
                 if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]
        assert len(found) == 1, (name, want, found)
        return found[0]

    def buckets(self, name: str, model: str = "sim-gpt") -> dict[float, float]:
        """``le`` -> cumulative count of histogram ``name``."""
        return {float(s.labels["le"]): s.value for s in self.families[name].samples
                if s.name == name + "_bucket" and s.labels["model_name"] == model}


def scrape(sim) -> Scrape:
    return Scrape(sim.port)


class Stream:
    """A streamed chat completion read chunk by chunk from a test thread: it keeps its slot and KV
    blocks until it ends or ``close()`` leaves (the simulator frees both for a client that leaves)."""

    def __init__(self, port: int, max_tokens: int, content: str = "hold", model: str = "sim-gpt"):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        payload = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                   "stream": True}
        self.conn.request("POST", CHAT, body=json.dumps(payload).encode(), headers={"content-type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200

    def close(self):
        self.conn.close()


def stream_tokens(reply) -> int:
    return len([c for c in reply.chunks if c["choices"] and c["choices"][0]["delta"].get("content")])


# --------------------------------------------------------------------------------------------------
# The exposition


def test_metrics_have_vllms_names_types_labels_and_buckets(simulator):
    sim = simulator(base=SimulatorConfig.instant(models={"sim-big": ModelProfile(kv_cache_blocks=64)}))
    chat(sim.port, max_tokens=3)
    got = scrape(sim)
    for name in GAUGES:
        assert got.families[name].type == "gauge", name
    for name in COUNTERS:
        assert got.families[name].type == "counter", name
        # exposed as NAME_total, like vLLM's (prometheus_client adds the suffix)
        assert any(s.name == name + "_total" for s in got.families[name].samples), name
    for name, bounds in HISTOGRAMS.items():
        assert got.families[name].type == "histogram", name
        assert list(got.buckets(name)) == [*bounds, float("inf")], name
        assert got.value(name + "_count", model="sim-big") == 0
    # One series per served model, with vLLM's labels; finish reasons present before any request ends so.
    for model in ("sim-gpt", "sim-big"):
        assert got.value("vllm:num_requests_running", model=model) == 0
        for reason in ("stop", "length", "abort"):
            got.value("vllm:request_success_total", model=model, finished_reason=reason)
    assert got.value("vllm:request_success_total", finished_reason="length") == 1
    assert got.value("vllm:request_success_total", finished_reason="stop") == 0
    assert got.value("vllm:kv_cache_usage_perc", model="sim-big") == 0.0  # KV model on, nothing running

    assert call(sim.port, "POST", "/metrics", {}).status == 405


def test_counters_and_histograms_match_what_the_requests_did(simulator):
    # Known timings: prefill 30 ms, then a token every 4 ms; some requests are injected errors.
    sim = simulator(seed=5, prefill_ms=30, decode_ms_per_token=4, error_rate=0.2, error_mix={500: 1},
                    output_tokens_mean=6, output_tokens_std=0,
                    models={"sim-big": ModelProfile(prefill_ms=40)})
    content = "c" * 31  # "Be brief." (9) + 31 = 40 chars -> 10 prompt tokens
    jobs = ([dict(stream=True, include_usage=True, max_tokens=5 + i % 4) for i in range(12)]
            + [dict(max_tokens=3 + i % 3) for i in range(8)]
            + [dict(stream=True, include_usage=True) for _ in range(4)]  # no max_tokens: 6 tokens, "stop"
            + [dict(stream=True, include_usage=True, max_tokens=4, model="sim-big") for _ in range(4)])
    replies = concurrently(len(jobs), lambda i: chat(sim.port, content=content, **jobs[i]))
    ok = [(job, reply) for job, reply in zip(jobs, replies) if reply.status == 200]
    failed = [reply for reply in replies if reply.status != 200]
    assert failed and all(r.headers["x-sim-injected-error"] == "1" for r in failed)

    def tokens(reply) -> int:
        return stream_tokens(reply) if reply.events else reply.json()["usage"]["completion_tokens"]

    got = scrape(sim)
    for model in ("sim-gpt", "sim-big"):
        mine = [(job, reply) for job, reply in ok if job.get("model", "sim-gpt") == model]
        assert mine, model
        n = [tokens(reply) for _, reply in mine]
        assert got.value("vllm:generation_tokens_total", model=model) == sum(n)
        assert got.value("vllm:prompt_tokens_total", model=model) == 10 * len(mine)
        for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                     "vllm:request_queue_time_seconds"):
            assert got.value(name + "_count", model=model) == len(mine), name  # errors count nowhere
        assert got.value("vllm:inter_token_latency_seconds_count", model=model) == sum(k - 1 for k in n)
        stops = sum(1 for job, _ in mine if "max_tokens" not in job)
        assert got.value("vllm:request_success_total", model=model, finished_reason="stop") == stops
        assert got.value("vllm:request_success_total", model=model, finished_reason="length") == len(mine) - stops

        # TTFT is what the simulator told each client (x-sim-ttft-ms, from arrival), at least the prefill.
        prefill = 0.040 if model == "sim-big" else 0.030
        ttfts = [float(reply.headers["x-sim-ttft-ms"]) / 1000 for _, reply in mine]
        assert abs(got.value("vllm:time_to_first_token_seconds_sum", model=model) - sum(ttfts)) < 0.001 * len(mine)
        assert got.buckets("vllm:time_to_first_token_seconds", model=model)[0.02] == 0  # none under the prefill
        assert got.value("vllm:time_to_first_token_seconds_sum", model=model) >= (prefill - 0.001) * len(mine)
        # E2E: from arrival to the last token, so at least TTFT + the decode intervals; never more
        # than the clients waited (they sent before the arrival and read after the last token).
        e2e = got.value("vllm:e2e_request_latency_seconds_sum", model=model)
        assert e2e >= sum(ttfts) + 0.004 * sum(k - 1 for k in n) - 0.001 * len(mine)
        assert e2e <= sum(reply.elapsed_ms for _, reply in mine) / 1000 + 0.002 * len(mine)  # uvloop's 1 ms clock
        # No jitter, no load slowdown: every interval is the configured 4 ms.
        itl = got.value("vllm:inter_token_latency_seconds_sum", model=model)
        assert itl == pytest.approx(0.004 * sum(k - 1 for k in n))
        assert got.buckets("vllm:inter_token_latency_seconds", model=model)[0.01] == sum(k - 1 for k in n)

    stats = sim.stats()
    assert stats["completed"] == len(ok) and stats["errors"] == len(failed)
    assert stats["tokens"]["completion"] == sum(tokens(r) for _, r in ok)
    assert stats["kv_cache"] == {"blocks": 0, "used": 0, "usage": 0.0} and stats["preemptions"] == 0


# --------------------------------------------------------------------------------------------------
# The KV-cache model


def kv_config(**settings) -> SimulatorConfig:
    values = dict(queue_delay_ms=0, prefill_ms=5, prefill_ms_per_token=0, decode_ms_per_token=10, jitter=0,
                  error_rate=0, capacity=0, load_slowdown=0)
    values.update(settings)
    return SimulatorConfig(**values)


def test_kv_usage_rises_while_requests_run_and_returns_to_zero(simulator):
    # 200 blocks of 16 tokens; three streams of 1 prompt token decoding 2000 tokens at 10 ms (20 s:
    # far longer than the test holds them) take a block every 160 ms each.
    sim = simulator(base=kv_config(kv_cache_blocks=200, kv_block_tokens=16))
    streams = [Stream(sim.port, max_tokens=2000) for _ in range(3)]
    try:
        first = wait_until(lambda: (lambda g: g if g.value("vllm:num_requests_running") == 3 else None)(scrape(sim)),
                           timeout=60, message="three requests running")
        usage0 = first.value("vllm:kv_cache_usage_perc")
        assert usage0 >= 3 / 200  # one block each at least
        later = wait_until(lambda: (lambda g: g if g.value("vllm:kv_cache_usage_perc") >= 0.1 else None)(scrape(sim)),
                           timeout=90, message="KV usage to grow past 10 % as the streams decode")
        assert later.value("vllm:num_requests_waiting") == 0 and later.value("vllm:num_preemptions_total") == 0
        stats = sim.stats()["kv_cache"]
        assert stats["blocks"] == 200 and 0.1 <= stats["usage"] <= 1 and stats["used"] >= 20
    finally:
        for stream in streams:
            stream.close()
    idle = wait_until(lambda: (lambda g: g if g.value("vllm:num_requests_running") == 0 else None)(scrape(sim)),
                      timeout=60, message="the streams' blocks to be freed")
    assert idle.value("vllm:kv_cache_usage_perc") == 0.0 and idle.value("vllm:num_requests_waiting") == 0
    assert sim.stats()["kv_cache"]["used"] == 0 and sim.stats()["disconnects"] == 3

    # Requests that finish free their blocks too.
    replies = concurrently(4, lambda i: chat(sim.port, stream=True, max_tokens=40))
    assert all(r.status == 200 and stream_tokens(r) == 40 for r in replies)
    done = scrape(sim)
    assert done.value("vllm:kv_cache_usage_perc") == 0.0 and done.value("vllm:num_requests_running") == 0
    assert done.value("vllm:generation_tokens_total") >= 160


def test_admission_waits_for_blocks_in_arrival_order(simulator):
    # 20 blocks of 16 tokens. A stream with a 300-token prompt holds 19 (1 free) until the test
    # closes it (4 tokens, 20 s apart); a request whose prompt needs 2 blocks waits though slots are
    # unlimited, and one behind it that needs 1 block waits too: FCFS, the head of the queue holds
    # back the rest (vLLM's scheduler).
    sim = simulator(base=kv_config(kv_cache_blocks=20, kv_block_tokens=16, decode_ms_per_token=20_000))
    big = Stream(sim.port, max_tokens=4, content="p" * 1200)  # 300 prompt tokens + 4 <= 19 x 16
    results: dict[str, object] = {}
    second = threading.Thread(target=lambda: results.update(second=chat(sim.port, stream=True, max_tokens=1,
                                                                         content="q" * 80)))  # 23 tokens: 2 blocks
    try:
        second.start()
        wait_until(lambda: scrape(sim).value("vllm:num_requests_waiting") == 1, timeout=60, interval=0.01,
                   message="the 2-block request waiting for blocks")
        third = threading.Thread(target=lambda: results.update(third=chat(sim.port, stream=True, max_tokens=1,
                                                                           content="r")))  # 3 tokens: 1 block fits
        third.start()
        seen = wait_until(lambda: (lambda g: g if g.value("vllm:num_requests_waiting") == 2 else None)(scrape(sim)),
                          timeout=60, interval=0.01, message="the 1-block request queued behind it")
        assert seen.value("vllm:num_requests_running") == 1
        assert seen.value("vllm:kv_cache_usage_perc") == pytest.approx(19 / 20)
        assert "second" not in results and "third" not in results
    finally:
        big.close()  # leaving frees its 19 blocks: both are admitted
    second.join(120)
    third.join(120)
    for name in ("second", "third"):
        reply = results[name]
        assert reply.status == 200
        queue_ms, ttft_ms = float(reply.headers["x-sim-queue-ms"]), float(reply.headers["x-sim-ttft-ms"])
        assert queue_ms > 0 and ttft_ms >= queue_ms + 5 - 0.2  # TTFT includes the queue time, then prefill
    got = scrape(sim)
    queue_sum = got.value("vllm:request_queue_time_seconds_sum")
    assert queue_sum >= sum(float(results[k].headers["x-sim-queue-ms"]) for k in ("second", "third")) / 1000 - 0.001
    assert got.value("vllm:request_queue_time_seconds_count") == 2  # the one that left counts no latency
    assert got.value("vllm:num_preemptions_total") == 0


def test_a_full_kv_cache_preempts_and_every_request_still_completes(simulator):
    # 12 blocks of 4 tokens (48 tokens); each request has 4 prompt tokens and 30 output tokens, so up
    # to 9 blocks: two that overlap cannot both finish without a preemption, eight certainly not.
    # Prefill (30 ms) is longer than a decode step (20 ms), as it is on a real engine.
    sim = simulator(base=kv_config(kv_cache_blocks=12, kv_block_tokens=4, prefill_ms=30, decode_ms_per_token=20,
                                   capacity=8))
    content = "k" * 7  # "Be brief." (9) + 7 = 16 chars -> 4 prompt tokens: 1 block
    peak: list[float] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            stats = sim.stats()
            peak.append((stats["kv_cache"]["usage"], stats["queued"], stats["preemptions"]))
            stop.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        replies = concurrently(8, lambda i: chat(sim.port, stream=i % 2 == 0, include_usage=i % 2 == 0,
                                                 content=content, max_tokens=30))
    finally:
        stop.set()
        watcher.join(30)
    assert all(r.status == 200 for r in replies)
    for i, reply in enumerate(replies):
        if i % 2 == 0:  # streamed: all 30 tokens, none sent twice after a preemption
            assert stream_tokens(reply) == 30 and reply.chunks[-1]["usage"]["completion_tokens"] == 30
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in reply.chunks if c["choices"])
            assert len(text.split()) == 30
        else:
            assert reply.json()["usage"]["completion_tokens"] == 30
    got = scrape(sim)
    preemptions = got.value("vllm:num_preemptions_total")
    assert preemptions > 0 and preemptions == sim.stats()["preemptions"]
    assert max(p[0] for p in peak) >= 0.9  # the cache filled up ...
    assert max(p[1] for p in peak) > 0     # ... with requests waiting
    # Recomputed tokens are not generated (nor counted) twice; every request is one success.
    assert got.value("vllm:generation_tokens_total") == 8 * 30
    assert got.value("vllm:prompt_tokens_total") == 8 * 4
    assert got.value("vllm:request_success_total", finished_reason="length") == 8
    assert got.value("vllm:inter_token_latency_seconds_count") == 8 * 29
    # A preempted request waits and prefills again (30 ms at least): some inter-token gaps are longer
    # than any decode step.
    assert got.buckets("vllm:inter_token_latency_seconds")[0.025] < 8 * 29
    assert got.value("vllm:kv_cache_usage_perc") == 0.0 and got.value("vllm:num_requests_waiting") == 0
    assert got.value("vllm:num_requests_running") == 0


def test_the_newest_running_request_is_the_one_preempted(simulator):
    # 4 blocks of 4 tokens; A and B have 3 prompt tokens and 9 output tokens (3 blocks each at the
    # end). Both hold 2 blocks by A's 6th token, which needs a third: B, admitted last, is preempted
    # (vLLM's FCFS order), waits for A to finish and prefills again. Were the oldest the victim, A
    # would finish last.
    sim = simulator(base=kv_config(kv_cache_blocks=4, kv_block_tokens=4, prefill_ms=20, decode_ms_per_token=250))
    done: dict[str, tuple[float, object]] = {}

    def run(name):
        reply = call(sim.port, "POST", CHAT, {"model": "sim-gpt", "messages": [{"role": "user", "content": "a" * 12}],
                                              "max_tokens": 9, "stream": True}, stream=True)
        done[name] = (time.perf_counter(), reply)

    a = threading.Thread(target=run, args=("A",))
    a.start()
    wait_until(lambda: sim.stats()["active"] == 1, timeout=60, interval=0.01, message="A running")
    b = threading.Thread(target=run, args=("B",))
    b.start()
    a.join(120)
    b.join(120)
    (a_end, a_reply), (b_end, b_reply) = done["A"], done["B"]
    assert stream_tokens(a_reply) == 9 and stream_tokens(b_reply) == 9
    assert a_end < b_end
    got = scrape(sim)
    assert got.value("vllm:num_preemptions_total") == 1
    # B's tokens stopped while it waited: one gap of at least A's remaining decode, then a prefill.
    b_times = b_reply.content_times()
    assert max(later - earlier for earlier, later in zip(b_times, b_times[1:])) >= 250 + 20 - 1


def test_the_context_limit_is_the_kv_cache(simulator):
    # 8 blocks of 4 tokens: a request may have 32 tokens in all (vLLM's max_model_len check).
    sim = simulator(base=kv_config(kv_cache_blocks=8, kv_block_tokens=4, decode_ms_per_token=0,
                                   output_tokens_mean=100, output_tokens_std=0))
    content = "x" * 31  # 40 chars -> 10 prompt tokens
    too_long = chat(sim.port, content=content, max_tokens=23)
    assert too_long.status == 400
    error = too_long.json()["error"]
    assert error["type"] == "invalid_request_error" and "maximum context length is 32 tokens" in error["message"]
    assert chat(sim.port, content=content, max_tokens=22).json()["usage"]["completion_tokens"] == 22
    # No max_tokens: the drawn 100 tokens are cut at the limit, as vLLM stops at max_model_len.
    cut = chat(sim.port, content=content).json()
    assert cut["usage"]["completion_tokens"] == 22 and cut["choices"][0]["finish_reason"] == "length"
    assert sim.stats()["rejected"] == 1


# --------------------------------------------------------------------------------------------------
# The KV model off


def test_without_the_kv_model_nothing_changes(simulator):
    # The same seed gives the same answers with the KV model off and with a cache too big to matter;
    # off, there is no context limit, no KV usage and no preemption under any load.
    def answers(blocks: int) -> list:
        sim = simulator(seed=21, kv_cache_blocks=blocks, jitter=0.0)
        # streamed: the choices of each chunk (ids and times differ); not streamed: the text
        return [[c["choices"] for c in chat(sim.port, stream=True).chunks] if i % 2 == 0
                else chat(sim.port).json()["choices"][0]["message"]["content"] for i in range(6)]

    assert answers(0) == answers(10_000)

    sim = simulator(capacity=4, decode_ms_per_token=10)
    streams = [Stream(sim.port, max_tokens=20_000) for _ in range(4)]  # beyond any KV cache above
    try:
        waiting = threading.Thread(target=lambda: chat(sim.port, max_tokens=1))
        waiting.start()
        got = wait_until(lambda: (lambda g: g if g.value("vllm:num_requests_waiting") == 1 else None)(scrape(sim)),
                         timeout=60, interval=0.01, message="a request waiting for a slot")
        assert got.value("vllm:num_requests_running") == 4
        assert got.value("vllm:kv_cache_usage_perc") == 0.0 and got.value("vllm:num_preemptions_total") == 0
    finally:
        for stream in streams:
            stream.close()
    waiting.join(120)
    assert sim.stats()["kv_cache"] == {"blocks": 0, "used": 0, "usage": 0.0} and sim.stats()["preemptions"] == 0


# --------------------------------------------------------------------------------------------------
# Configuration


def test_kv_settings_per_model_and_on_the_command_line():
    args = _build_parser().parse_args(["--kv-cache-blocks", "64", "--kv-block-tokens", "8", "--model", "other"])
    config = config_from_args(args)
    assert (config.kv_cache_blocks, config.kv_block_tokens) == (64, 8)
    assert config.profile("other").kv_cache_blocks == 64
    assert config_from_args(_build_parser().parse_args([])).kv_cache_blocks == 0  # off by default

    config = SimulatorConfig.from_dict({"kv_cache_blocks": 100, "models": {"small": {"kv_cache_blocks": 10}}})
    assert config.profile("small").kv_cache_blocks == 10 and config.profile("small").kv_block_tokens == 16
    with pytest.raises(ValueError):
        SimulatorConfig(kv_block_tokens=0)
    with pytest.raises(ValueError):
        SimulatorConfig(models={"m": ModelProfile(kv_cache_blocks=-1)})

    with serve(config) as sim:  # each model its own pool of blocks
        assert sim.stats()["kv_cache"]["blocks"] == 110
        got = scrape(sim)
        assert got.value("vllm:kv_cache_usage_perc", model="small") == 0.0
