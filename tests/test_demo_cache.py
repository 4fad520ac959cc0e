"""The demo's semantic cache: a realistic share of its requests are hits (25–35 % once warm), a
hit answers in milliseconds with no model call (no inference span, the simulator never asked),
and a miss calls the model and stores the answer. Against the real LLM simulator (no delays)."""

from __future__ import annotations

import tracedash_sdk as td
from demo.simulator import SimulatorConfig, serve
from demo.workload import DemoApp, SemanticCache, semantic_key

REQUESTS = 600


def test_the_same_question_asked_another_way_is_the_same_key():
    assert semantic_key("How do I reset my password?") == semantic_key("  how do i reset my password ?")
    assert semantic_key("How do I reset my password?") != semantic_key("How do I reset my password in the EU region?")
    cache = SemanticCache(entries=2)
    cache.put("A?", "1")
    cache.put("B?", "2")
    assert cache.get("a") == "1"  # used: B is now the oldest
    cache.put("C?", "3")
    assert cache.get("b") is None and cache.get("A") == "1" and cache.get("c?") == "3"


def test_a_quarter_to_a_third_of_the_demos_requests_are_cache_hits():
    exporter = td.InMemoryExporter()
    tracer = td.Tracer(exporter=exporter, service="chat-api")
    with serve(SimulatorConfig.instant(seed=3, scheduling_policy="priority")) as sim:  # the demo sends tiers as priorities
        app = DemoApp(tracer, sim.url, seed=3, pace=0.0)
        for _ in range(REQUESTS):
            app.handle_request()
        served = sim.stats()["requests"]  # what the simulator was asked: the misses only (no errors here)
    traces: dict[str, list[dict]] = {}
    for record in exporter.records():
        traces.setdefault(record["trace_id"], []).append(record)
    assert len(traces) == REQUESTS == app.stats.requests
    lookups = {tid: next(s for s in spans if s["name"] == "cache semantic") for tid, spans in traces.items()}
    assert all(s["phase"] == "preprocess" and s["attributes"]["tracedash.cache.name"] == "semantic"
               for s in lookups.values())
    hits = [tid for tid, s in lookups.items() if s["attributes"]["tracedash.cache.hit"] is True]
    misses = [tid for tid, s in lookups.items() if s["attributes"]["tracedash.cache.hit"] is False]
    assert len(hits) + len(misses) == REQUESTS and len(hits) == app.stats.cache_hits
    hit_set, warm = set(hits), list(traces)[100:]  # records keep the requests' order; the first 100 warm it up
    warm_rate = sum(1 for tid in warm if tid in hit_set) / len(warm)
    assert 0.25 <= warm_rate <= 0.35, warm_rate
    for tid in hits:  # no model call, no retrieval
        assert not any(s["phase"] == "inference" or s["service"] == "rag-service" for s in traces[tid])
    for tid in misses:
        calls = [s for s in traces[tid] if s["phase"] == "inference"]
        assert calls and calls[0]["input_tokens"] and calls[0]["cost_usd"]
    assert app.stats.retries == 0 and served == len(misses)
