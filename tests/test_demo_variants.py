"""The demo's variants, tiers and judge (docs/demo.md): against the real LLM simulator.

- INT8 answers faster than FP16 (the simulator's own engine figures, and the client's clock with
  wide margins) and its simulated GPU host reports less memory, through the agent's sampler and the
  ingestion service into ClickHouse;
- the tiers' shares are honoured, and under a saturating load premium waits less than free
  (vLLM-style priority scheduling);
- the demo app's spans say which variant and tier; the judge's seeded scores put INT8 lower.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
import types
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

import demo.gpus
import demo.simulator
import tracedash_sdk as td
from demo.gpus import GIB, SimulatedNvml, gpu_samplers
from demo.simulator import SimulatorConfig, serve
from demo.workload import TIERS, VARIANTS, DemoApp, DemoJudge, simulated_gpus, simulator_config

FP16, INT8 = VARIANTS["fp16"].model, VARIANTS["int8"].model


def _histogram_mean(metrics: str, name: str, model: str) -> float:
    """sum / count of a vLLM histogram for one model, from the simulator's /metrics text."""
    values = {}
    for line in metrics.splitlines():
        for part in ("_sum", "_count"):
            if line.startswith(f"{name}{part}{{") and f'model_name="{model}"' in line:
                values[part] = float(line.rsplit(" ", 1)[1])
    assert values.get("_count"), (name, model)
    return values["_sum"] / values["_count"]


def _call(sim, model: str, max_tokens: int = 40, priority: int = 0) -> tuple[float, int, dict]:
    """One streamed completion: (client seconds, completion tokens, response headers)."""
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=60)
    body = {"model": model, "messages": [{"role": "user", "content": "x" * 200}], "stream": True,
            "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    if priority:
        body["priority"] = priority
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    usage = None
    for raw in response:
        if raw.startswith(b"data: {"):
            usage = json.loads(raw[6:]).get("usage") or usage
    elapsed = time.perf_counter() - started
    headers = dict(response.getheaders())
    conn.close()
    return elapsed, usage["completion_tokens"], headers


def test_int8_answers_faster_than_fp16_and_its_gpu_holds_less_memory():
    config = simulator_config(seed=4)
    config.error_rate = 0.0  # every call answers (the demo's 3 % injected errors are not under test here)
    with serve(config) as sim:
        samplers = {s.host: s for s in gpu_samplers(sim.app.model_stats, simulated_gpus())}
        idle = {host: s.sample() for host, s in samplers.items()}
        timings = {FP16: [], INT8: []}
        for _ in range(24):  # interleaved, so a busy moment of the machine slows both alike
            for model in (FP16, INT8):
                elapsed, tokens, _ = _call(sim, model)
                timings[model].append(tokens / elapsed)
        metrics = sim.app.metrics().decode()
        stats = sim.stats()["models"]
    # The engine's own schedule (what vLLM's histograms measure): INT8 ~1.6x the decode speed, faster prefill.
    itl = {m: _histogram_mean(metrics, "vllm:inter_token_latency_seconds", m) for m in (FP16, INT8)}
    ttft = {m: _histogram_mean(metrics, "vllm:time_to_first_token_seconds", m) for m in (FP16, INT8)}
    assert 1.3 < itl[FP16] / itl[INT8] < 2.0, itl
    assert ttft[INT8] < ttft[FP16], ttft
    # The client's clock, wide margins (a busy machine adds the same overhead to both).
    fp16_rate, int8_rate = statistics.median(timings[FP16]), statistics.median(timings[INT8])
    assert int8_rate > 1.15 * fp16_rate, (fp16_rate, int8_rate)
    # The same traffic kept INT8's GPU busy for less time.
    assert stats[INT8]["busy_s"] < stats[FP16]["busy_s"], stats
    # Each variant's host: one host row and one GPU row; INT8's weights are about half FP16's.
    for host, rows in idle.items():
        assert [r["gpu_index"] for r in rows] == [-1, 0] and {r["host"] for r in rows} == {host}
    fp16_gpu, int8_gpu = idle["demo-gpu-fp16"][1], idle["demo-gpu-int8"][1]
    assert fp16_gpu["gpu_memory_total"] == int8_gpu["gpu_memory_total"] == 80 * GIB
    assert 5 * GIB < fp16_gpu["gpu_memory_used"] - int8_gpu["gpu_memory_used"] < 9 * GIB, (fp16_gpu, int8_gpu)
    assert int8_gpu["gpu_memory_used"] / fp16_gpu["gpu_memory_used"] < 0.7
    assert fp16_gpu["process_gpu_memory"] and fp16_gpu["gpu_uuid"] != int8_gpu["gpu_uuid"]


def test_a_simulated_gpus_memory_and_utilisation_follow_its_load():
    config = SimulatorConfig(seed=2, queue_delay_ms=0, prefill_ms=20, decode_ms_per_token=5, jitter=0.0,
                             capacity=8, kv_cache_blocks=16, kv_block_tokens=16, default_model=FP16,
                             models={INT8: {}})
    with serve(config) as sim:
        (fp16,) = gpu_samplers(sim.app.model_stats, simulated_gpus()[:1])
        idle = fp16.sample()[1]
        with ThreadPoolExecutor(4) as pool:
            busy = pool.submit(lambda: [_call(sim, FP16, max_tokens=60) for _ in range(6)])
            seen = []
            while not busy.done():
                seen.append(fp16.sample()[1])
                time.sleep(0.05)
            busy.result()
        fp16.sample()  # a reading averages the KV cache since the previous one, the load's tail included;
        after = fp16.sample()[1]  # the next one's interval is all idle
    loaded = max(seen, key=lambda r: r["gpu_memory_used"])
    assert loaded["gpu_memory_used"] > idle["gpu_memory_used"] + GIB  # KV blocks in use + activations
    assert after["gpu_memory_used"] == idle["gpu_memory_used"]  # all freed again
    assert idle["gpu_utilization"] == 0.0
    assert max(r["gpu_utilization"] for r in seen) > 50  # requests ran nearly all the time
    assert loaded["gpu_memory_used"] / loaded["gpu_memory_total"] < 0.85  # under the default alert rule


def test_a_simulated_gpus_memory_averages_the_kv_cache_since_the_previous_reading(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(demo.gpus, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    model = {"running": 0, "waiting": 0, "kv_blocks": 12, "kv_used": 0, "kv_usage": 0.0, "kv_block_s": 0.0,
             "busy_s": 0.0, "preemptions": 0}
    gpu = simulated_gpus()[0]
    nvml = SimulatedNvml(lambda: {gpu.model: dict(model)}, [gpu])
    base = gpu.overhead_bytes + gpu.weights_bytes
    # 10 s: all 12 blocks held for 2.5 s, none for the rest; the cache is empty at the reading.
    clock[0] += 10
    model["kv_block_s"] = 12 * 2.5
    assert nvml.nvmlDeviceGetMemoryInfo(0).used == base + int(0.25 * gpu.kv_cache_bytes)
    # the processes' figure is that reading's, not a new one over no time
    assert nvml.nvmlDeviceGetComputeRunningProcesses(0)[0].usedGpuMemory == base + int(0.25 * gpu.kv_cache_bytes) - 512 * 1024**2
    # 5 s at half the cache, 4 requests running now
    clock[0] += 5
    model.update(kv_block_s=model["kv_block_s"] + 6 * 5, kv_used=6, kv_usage=0.5, running=4)
    assert nvml.nvmlDeviceGetMemoryInfo(0).used == int(base + 0.5 * gpu.kv_cache_bytes + 4 * 0.25 * GIB)
    # no time since the last reading: the cache's usage now
    model.update(kv_used=12, kv_usage=1.0, running=0)
    assert nvml.memory_used(0) == base + gpu.kv_cache_bytes


def test_a_pools_block_seconds_add_up_the_blocks_held_over_time(monkeypatch):
    clock = [50.0]
    monkeypatch.setattr(demo.simulator, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    pool = demo.simulator._Pool(16, 0, FP16, None, blocks=16)
    pool.used += 4
    clock[0] += 2
    pool.used += 8          # 4 blocks for 2 s
    clock[0] += 1           # 12 blocks for 1 s
    assert pool.block_seconds() == pytest.approx(4 * 2 + 12 * 1)
    pool.used -= 12
    clock[0] += 3           # none for 3 s
    assert pool.block_seconds() == pytest.approx(20)


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_the_variant_hosts_samples_go_through_the_ingestion_service(project_with_key):
    from agent.tasks import sample_local_host, sampler_add, sampler_remove
    from store import get_store

    project, _ = project_with_key()
    with serve(simulator_config(seed=1)) as sim:
        samplers = gpu_samplers(sim.app.model_stats, simulated_gpus())
        for sampler in samplers:
            sampler_add(sampler)
        try:
            assert sample_local_host() >= 5  # the local host row, and a host + a GPU row per variant host
        finally:
            for sampler in samplers:
                sampler_remove(sampler)
    rows = get_store().query(
        "SELECT host, gpu_index, gpu_memory_used, gpu_memory_total FROM resource_samples "
        "WHERE project_id = {p:UInt64} AND gpu_index >= 0 ORDER BY host", {"p": project.pk}, tag="tests.demo_gpus").dicts()
    assert [r["host"] for r in rows] == ["demo-gpu-fp16", "demo-gpu-int8"]
    fp16, int8 = rows
    assert int8["gpu_memory_used"] < fp16["gpu_memory_used"] < fp16["gpu_memory_total"]


def test_premium_waits_less_than_free_under_a_saturating_load():
    # Few slots, a small KV cache, every request arriving at once: most must wait; the scheduler
    # admits by priority (premium 0, standard 1, free 2), then by arrival.
    config = SimulatorConfig(seed=9, queue_delay_ms=0, prefill_ms=5, decode_ms_per_token=3, jitter=0.0,
                             capacity=4, kv_cache_blocks=16, kv_block_tokens=16, scheduling_policy="priority")
    priorities = [0, 1, 2] * 16
    with serve(config) as sim, ThreadPoolExecutor(len(priorities)) as pool:
        results = list(pool.map(lambda p: (p, _call(sim, "m", max_tokens=30, priority=p)[2]), priorities))
    queued = {p: [float(h["x-sim-queue-ms"]) for q, h in results if q == p] for p in (0, 1, 2)}
    means = {p: statistics.mean(v) for p, v in queued.items()}
    assert means[0] < means[1] < means[2], means
    assert means[0] < 0.5 * means[2], means
    # The same load without the policy: vLLM's answer to a priority it does not schedule by.
    with serve(SimulatorConfig(seed=9, kv_cache_blocks=16)) as sim:
        conn = http.client.HTTPConnection(sim.host, sim.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "priority": 2}))
        response = conn.getresponse()
        assert response.status == 400 and "Priority scheduling is not enabled" in response.read().decode()


def _demo_run(requests: int, seed: int):
    exporter = td.InMemoryExporter()
    tracer = td.Tracer(exporter=exporter, service="chat-api")
    with serve(SimulatorConfig.instant(seed=seed, scheduling_policy="priority")) as sim:
        app = DemoApp(tracer, sim.url, seed=seed, pace=0.0)
        for _ in range(requests):
            app.handle_request()
        if app.judge is not None:
            app.judge.flush()
    return app, exporter.records()


def test_the_demo_apps_spans_carry_the_variant_and_the_tier():
    app, records = _demo_run(800, seed=21)
    roots = [r for r in records if r["name"] == "POST /v1/chat"]
    assert len(roots) == 800
    tiers = Counter(r["attributes"]["user.tier"] for r in roots)
    for tier, share in TIERS.items():  # 800 draws: within 5 points of the weight
        assert abs(tiers[tier] / 800 - share) < 0.05, tiers
    calls = [r for r in records if r["phase"] == "inference"]
    demo_calls = [r for r in calls if r["model"].startswith("demo-llama-8b")]
    assert 0.5 < len(demo_calls) / len(calls) < 0.7  # the demo model's share: 60 %
    by_variant = Counter(r["attributes"]["llm.quantization"] for r in demo_calls)
    assert set(by_variant) == {"fp16", "int8"} and 0.4 < by_variant["int8"] / len(demo_calls) < 0.6, by_variant
    for r in demo_calls:
        variant = VARIANTS[r["attributes"]["llm.quantization"]]
        assert r["model"] == r["attributes"]["gen_ai.request.model"] == variant.model
        assert r["attributes"]["host.name"] == variant.host
        assert r["attributes"]["user.tier"] in TIERS
    for r in calls:
        if not r["model"].startswith("demo-llama-8b"):
            assert "llm.quantization" not in r["attributes"]
    # a trace that called a variant says so on its root too
    root_of = {r["trace_id"]: r for r in roots}
    assert all(root_of[r["trace_id"]]["attributes"]["llm.quantization"] == r["attributes"]["llm.quantization"]
               for r in demo_calls)


def test_the_judges_seeded_scores_put_int8_a_little_lower():
    judge = DemoJudge(td.Tracer(exporter=td.InMemoryExporter()), seed=5, pace=0.0)
    draws = {m: [judge.draw(m) for _ in range(600)] for m in (FP16, INT8)}
    means = {m: statistics.mean(v for v, _, _ in d) for m, d in draws.items()}
    assert all(1 <= v <= 5 and isinstance(v, int) for d in draws.values() for v, _, _ in d)
    assert 4.1 < means[FP16] < 4.45 and 3.9 < means[INT8] < 4.25, means
    assert 0.08 < means[FP16] - means[INT8] < 0.35, means
    late = sum(1 for d in draws.values() for _, is_late, _ in d if is_late) / 1200
    assert 0.25 < late < 0.42
    again = DemoJudge(td.Tracer(exporter=td.InMemoryExporter()), seed=5, pace=0.0)
    assert [again.draw(FP16) for _ in range(600)] == draws[FP16]  # seeded: the same scores every run


def test_the_demo_app_sends_the_judges_scores_int8_lower_some_late():
    app, records = _demo_run(900, seed=8)
    calls = {r["span_id"]: r for r in records if r["phase"] == "inference"}
    scores = app.tracer.exporter.scores
    assert scores and len(scores) == len(app.judge.given)
    # one score per answer from a model (cache hits and failures are not judged), on its model call's span
    answered = {r["span_id"] for r in calls.values() if r["status"] != "error"}
    assert {s["span_id"] for s in scores} <= answered and len({s["span_id"] for s in scores}) == len(scores)
    assert all(s["name"] == "quality" and s["source"] == "eval" and s["author"] == "demo-judge"
               and s["trace_id"] == calls[s["span_id"]]["trace_id"] and 1 <= s["value"] <= 5 for s in scores)
    late = [s for s in scores if s.get("comment") == "late evaluation"]
    assert 0.2 < len(late) / len(scores) < 0.45
    by_variant: dict[str, list[float]] = {"fp16": [], "int8": []}
    for s in scores:
        quantization = calls[s["span_id"]]["attributes"].get("llm.quantization")
        if quantization:
            by_variant[quantization].append(s["value"])
    assert min(len(v) for v in by_variant.values()) > 150, {k: len(v) for k, v in by_variant.items()}
    assert statistics.mean(by_variant["int8"]) < statistics.mean(by_variant["fp16"]) - 0.05, by_variant
