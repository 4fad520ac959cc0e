"""A load test from the page against the built-in simulator, driven past its knee (a constant rate
above what its KV cache lets it serve): the
simulator's vLLM-style /metrics is scraped during the run, so the report shows — on one time axis —
the KV cache filling and requests waiting while the clients' TTFT rises, and the same samples land
in engine_samples for the Engines page."""

from __future__ import annotations

import json

import pytest

from loadtests import runner
from loadtests.models import LoadTestRun
from loadtests.runner import load_test_execute
from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

# 8 slots of ~250 ms requests (about 32 rps), and a KV cache of 30 blocks: 6 requests of a 50-token
# prompt and 20 answer tokens (5 blocks each) fill it, so the cache is the limit and it fills first.
SMALL_ENGINE = {"queue_delay_ms": 2.0, "prefill_ms": 40.0, "prefill_ms_per_token": 0.0, "decode_ms_per_token": 10.0,
                "capacity": 8, "load_slowdown": 0.2, "jitter": 0.05, "error_rate": 0.0, "kv_cache_blocks": 30,
                "kv_block_tokens": 16}


def _figure(html: str, element_id: str) -> dict:
    marker = f'<script id="{element_id}" type="application/json">'
    start = html.index(marker) + len(marker)
    return json.loads(html[start:html.index("</script>", start)])


def test_past_the_knee_the_kv_cache_fills_and_requests_wait_as_ttft_rises(asgi_server, project_with_key, make_user,
                                                                          client, monkeypatch):
    monkeypatch.setattr(runner, "DEFAULT_SIMULATOR", SMALL_ENGINE)
    user = make_user()
    project, _ = project_with_key(members=[user])
    # 40 requests/s against a capacity near 24/s (6 requests in flight at ~250 ms): open-loop, so the queue
    # grows for the whole run, the cache stays full and TTFT climbs
    run = LoadTestRun.objects.create(project=project, run_id="r-knee", test_type="concurrency",
                                     target_url="built-in simulator",
                                     config={"source": "page", "test_type": "concurrency", "qps": 40.0, "duration": 12.0,
                                             "target": "simulator", "target_url": ""})
    load_test_execute(run_pk=run.pk, trace_endpoint=asgi_server.url)
    run.refresh_from_db()
    assert run.status == "completed", run.error
    report = run.report
    engine = report["engine"]["timeline"]
    assert len(engine) >= 5
    full = [r for r in engine if (r["kv_cache_percent"] or 0) >= 90 and (r["waiting"] or 0) >= 1]
    assert full, (report["steps"], report.get("knee"), engine)  # past the knee: the cache is full and requests wait for it
    assert max(r["preemptions"] for r in engine) >= 0
    # The clients' TTFT (per window of the report's timeline) while the engine is full, against the
    # first seconds of the test (light load): it has risen, at the same time.
    timeline = [r for r in report["timeline"] if r.get("ttft_p95_ms") is not None]
    early = min(r["ttft_p95_ms"] for r in timeline[:2])
    window = report["timeline"][1]["t"] - report["timeline"][0]["t"]
    during = [r["ttft_p95_ms"] for r in timeline
              if any(abs(r["t"] + window / 2 - f["t"]) <= window for f in full)]
    assert during and max(during) >= 2 * early, (early, during)

    stored = get_store().query(
        "SELECT metric, max(value) AS high FROM engine_samples WHERE project_id = {p:UInt64} AND engine = 'vllm' "
        "GROUP BY metric", {"p": project.pk}, tag="tests.loadtest_engine").dicts()
    highs = {r["metric"]: r["high"] for r in stored}
    assert highs["kv_cache_usage"] >= 90 and highs["requests_waiting"] >= 1 and "ttft_seconds" in highs

    client.force_login(user)
    page = client.get(f"/loadtests/{run.pk}/").content.decode()
    figure = _figure(page, "fig-engine")
    names = [trace["name"] for trace in figure["data"]]
    assert names == ["client TTFT P95 (ms)", "waiting requests", "running requests", "KV cache %"]
    assert {trace.get("xaxis", "x") for trace in figure["data"]} == {"x"}  # one time axis for all three rows
    assert "Inside the engine" in page and f"/engines/?project={project.pk}" in page
