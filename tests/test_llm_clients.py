"""The LLM instrumentation users already run, unmodified, against tracedash.

Each library (pinned in requirements-dev.in; OpenLIT in requirements-openlit.lock, its own
environment) runs in a process of its own
(``tests/support/llm_clients.py``): the real ``openai`` client calls the project's LLM simulator
(``demo.simulator``) — a plain, a streamed and a failing call, each inside an app span named
``plain``, ``stream`` or ``fail`` — and the library exports over OTLP/HTTP to a real server
(``asgi_server``) configured only through the library's own documented settings. The test then
reads what tracedash stored: phase (the model call's whole time is inference), model, tokens, TTFT
on the streamed call, error status on the failing one, cost where the library sends one, and the
GenAI events a library sends as OTLP logs (OpenLIT), on the span they name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analytics.trace_math import SPAN_FIELDS_SQL, trace_summarize
from dashboard.trace_detail import trace_detail_build
from demo.simulator import SimulatorConfig, serve
from store import get_store
from tests.conftest import wait_until

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
MODEL = "sim-gpt"
PREFILL_MS = 60.0


@pytest.fixture(scope="module")
def simulator():
    # Exact timings (no jitter): TTFT ≈ prefill, then one token every 3 ms. Unknown models are a 404.
    config = SimulatorConfig(queue_delay_ms=0.0, prefill_ms=PREFILL_MS, prefill_ms_per_token=0.0,
                             decode_ms_per_token=3.0, jitter=0.0, strict_models=True, default_model=MODEL)
    with serve(config) as sim:
        yield sim


# OpenLIT's dependencies conflict with this environment's (requirements-openlit.lock): it runs from
# its own, which `make install-dev` makes.
OPENLIT_PYTHON = ROOT / ".venv-openlit" / "bin" / "python"


def run_library(library: str, simulator, server, *args: str) -> dict:
    python = sys.executable
    if library == "openlit":
        assert OPENLIT_PYTHON.exists(), f"{OPENLIT_PYTHON} is missing: run `make install-dev`"
        python = str(OPENLIT_PYTHON)
    command = [python, str(ROOT / "tests" / "support" / "llm_clients.py"), library,
               "--llm", simulator.base_url, "--tracedash", server.url, *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{library} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [d[0] for d in result["done"]] == ["plain", "stream", "fail"], result
    return {"result": result, "stderr": done.stderr}


def stored_spans(project_id: int) -> list[dict]:
    return get_store().query(
        f"SELECT trace_id, {SPAN_FIELDS_SQL}, attributes, resource_attributes, event_names FROM spans"
        " WHERE project_id = {p:UInt64} ORDER BY start_time", {"p": project_id}, tag="tests.llm_clients").dicts()


def calls_by_app_span(project_id: int, count: int = 3) -> dict[str, dict]:
    """{"plain" | "stream" | "fail": {"app": app span, "call": the model call span, "trace": spans, "summary"}}"""
    def ready():
        spans = stored_spans(project_id)
        apps = {s["name"]: s for s in spans if s["name"] in ("plain", "stream", "fail") and not s["model"]}
        return (spans, apps) if len(apps) == count else None

    spans, apps = wait_until(ready, timeout=90, message="the library's spans")
    out = {}
    for name, app in apps.items():
        trace = [s for s in spans if s["trace_id"] == app["trace_id"]]
        calls = [s for s in trace if s["phase"] == "inference"]
        assert len(calls) == 1, (name, [(s["name"], s["phase"], s["attributes"]) for s in trace])
        out[name] = {"app": app, "call": calls[0], "trace": trace, "summary": trace_summarize(trace)}
    return out


def check_common(calls: dict[str, dict], *, ttft_from_span_start: bool = True, inference_share: bool = True,
                 ttft_reported: bool = True) -> None:
    for name, found in calls.items():
        call, summary = found["call"], found["summary"]
        assert call["phase"] == "inference"
        if inference_share and name != "fail":  # a refused call lasts a few ms: the client's own overhead is a large share of it
            # The model call's whole time, whatever the library traced beneath it, is inference on the
            # phase bar (the app's own time around the call, which a busy machine stretches, is not).
            assert summary.phase_ns["inference"] >= call["duration_ns"], (name, summary.phase_ns, call["duration_ns"])
            assert summary.phase_ns["network"] == 0, (name, summary.phase_ns)
    plain, stream, fail = calls["plain"]["call"], calls["stream"]["call"], calls["fail"]["call"]
    assert plain["model"].startswith(MODEL) and plain["status"] == "ok"
    assert plain["input_tokens"] > 0 and plain["output_tokens"] == 12
    assert stream["model"].startswith(MODEL) and stream["status"] == "ok"
    assert stream["input_tokens"] > 0 and stream["output_tokens"] == 16
    # TTFT from the library's first-token signal, within the call; at least the simulator's prefill where
    # the library measures from the span's start.
    if not ttft_reported:  # the library sends no first-token signal: unknown, never made up
        assert stream["ttft_ns"] is None and calls["stream"]["summary"].ttft_ns is None
    else:
        assert stream["ttft_ns"] is not None and 0 < stream["ttft_ns"] <= stream["duration_ns"]
    if ttft_reported and ttft_from_span_start:
        assert stream["ttft_ns"] >= PREFILL_MS * 1e6 * 0.9
    assert fail["status"] == "error"
    assert fail["input_tokens"] is None and fail["output_tokens"] is None  # not reported: unknown, not 0


def test_openinference_openai(asgi_server, project_with_key, simulator):
    project, key = project_with_key()
    run_library("openinference", simulator, asgi_server, "--key", key)
    calls = calls_by_app_span(project.pk)
    check_common(calls)
    assert calls["plain"]["call"]["service"] == "oi-app"
    assert "First Token Stream Event" in calls["stream"]["call"]["event_names"]


def test_openlit_openai(asgi_server, client, project_with_key, simulator):
    project, key = project_with_key()
    ran = run_library("openlit", simulator, asgi_server, "--key", key)
    # OpenLIT exports its GenAI events as OTLP logs to /v1/logs: taken, so it logs no export error.
    assert "/v1/logs" not in ran["stderr"] and "404" not in ran["stderr"], ran["stderr"][-3000:]
    calls = calls_by_app_span(project.pk)
    # OpenLIT's gen_ai.server.time_to_first_token counts from when create() returned the stream (after
    # the response headers, which the simulator sends with the first token), not from the span's start.
    check_common(calls, ttft_from_span_start=False)
    # OpenLIT traces the HTTP request beneath each model call (an httpx CLIENT span, no gen_ai.*): the
    # HTTP client rule makes it network, but it states no phase, so beneath the model call it is part
    # of the call (all inference, as checked above), on the trace page too.
    for name in ("plain", "stream"):
        found = calls[name]
        http = [s for s in found["trace"] if s["parent_span_id"] == found["call"]["span_id"]]
        assert http and all(s["phase"] == "network" and s["phase_fallback"] == 1 for s in http), http
        detail = trace_detail_build(project_id=project.pk, trace_id=found["app"]["trace_id"], rows=found["trace"])
        shown = {v.span_id: v for v in detail.spans}
        assert all(shown[s["span_id"]].phase == "inference" and shown[s["span_id"]].reported_phase == "network"
                   for s in http)
        assert not any("Network time" in flag for flag in detail.flags), detail.flags
    plain = calls["plain"]["call"]
    assert plain["service"] == "openlit-app"
    # OpenLIT prices the call from the price list it was given (gen_ai.usage.cost).
    expected = (plain["input_tokens"] * 0.5 + plain["output_tokens"] * 1.5) / 1000
    assert plain["cost_usd"] == pytest.approx(expected, rel=1e-6)
    # With its default settings OpenLIT sends one gen_ai.client.inference.operation.details event per
    # answered call (the failed call has none), and the trace shows it on the span the record names:
    # the plain call's own span; for the streamed call the app span, because OpenLIT emits that event
    # while the app reads the stream, when the call's span is not the current one.
    for name, output_tokens, owner in (("plain", 12, "call"), ("stream", 16, "app")):
        call, span = calls[name]["call"], calls[name][owner]
        trace = client.get(f"/api/v1/traces/{call['trace_id']}", HTTP_AUTHORIZATION=f"Bearer {key}").json()
        events = {s["span_id"]: s["genai_events"] for s in trace["spans"]}
        (event,) = events.pop(span["span_id"])
        assert not any(events.values()) and trace["genai_events"] == [], name
        assert event["name"] == "gen_ai.client.inference.operation.details"
        attributes = event["attributes"]
        assert "Say <b>hello</b> & goodbye." in attributes["gen_ai.input.messages"]  # the prompt, as sent
        assert json.loads(attributes["gen_ai.output.messages"])[0]["role"] == "assistant"
        assert attributes["gen_ai.usage.output_tokens"] == str(output_tokens)
        assert call["start_ns"] <= event["time_ns"] <= span["start_ns"] + span["duration_ns"]


def test_langfuse_openai(asgi_server, project_with_key, simulator):
    """The Langfuse SDK (v3+, OpenTelemetry-based) changed only in its host and keys: the project
    key's public prefix as LANGFUSE_PUBLIC_KEY, the key as LANGFUSE_SECRET_KEY. It posts to its own
    path (/api/public/otel/v1/traces) with Basic auth and keeps everything in langfuse.* attributes."""
    from projects.services import api_key_public_key

    project, key = project_with_key()
    run_library("langfuse", simulator, asgi_server, "--public-key", api_key_public_key(raw_key=key), "--secret-key", key)
    calls = calls_by_app_span(project.pk)
    # The langfuse.openai wrapper's generation is the model call, a child of the app's span.
    check_common(calls)
    for name, found in calls.items():
        app, call = found["app"], found["call"]
        assert call["parent_span_id"] == app["span_id"] and call["name"] == "OpenAI-generation"
        assert call["attributes"]["langfuse.observation.type"] == "generation"
        # The trace's name, user and session (propagate_attributes) are kept on every span.
        for span in (app, call):
            assert span["attributes"]["langfuse.trace.name"] == f"chat-{name}"
            assert (span["attributes"]["user.id"], span["attributes"]["session.id"]) == ("u-42", "s-7")
            assert span["service"] == "langfuse"  # the SDK names no service
    plain, fail = calls["plain"]["call"], calls["fail"]["call"]
    assert plain["cost_usd"] is None  # the simulator reports no cost: unknown, not 0
    assert fail["model"] == "no-such-model" and "404" in fail["status_message"]
    assert fail["cost_usd"] == 0  # the wrapper records a refused call as costing nothing


def test_otel_genai_openai(asgi_server, project_with_key, simulator, client, make_user):
    """The official OpenTelemetry instrumentation (opentelemetry-instrumentation-openai-v2). It sends no first-token time for a stream
    (no span attribute, event or TTFT histogram): TTFT stays unknown and the trace page says so.
    Its GenAI events (logs) land on the model call's span; its gen_ai.* histograms are taken
    (/v1/metrics answers without refusing a point), so the app logs no export error."""
    user = make_user()
    project, key = project_with_key(members=[user])
    ran = run_library("otel-genai", simulator, asgi_server, "--key", key)
    assert "Failed to export" not in ran["stderr"] and "404" not in ran["stderr"], ran["stderr"][-3000:]
    calls = calls_by_app_span(project.pk)
    check_common(calls, ttft_reported=False)
    stream = calls["stream"]
    assert stream["call"]["service"] == "otel-genai-app"
    client.force_login(user)
    page = client.get(f"/traces/{stream['app']['trace_id']}/?project={project.pk}")
    assert page.status_code == 200
    ttft = page.content.decode().split('id="fig-ttft">', 1)[1].split("</dd>", 1)[0]
    assert "unknown" in ttft, ttft
    plain = calls["plain"]["call"]
    trace = client.get(f"/api/v1/traces/{plain['trace_id']}", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    events = {s["span_id"]: s["genai_events"] for s in trace["spans"]}
    (event,) = events[plain["span_id"]]
    assert event["name"] == "gen_ai.client.inference.operation.details"
    assert "Say <b>hello</b> & goodbye." in event["attributes"]["gen_ai.input.messages"]
    assert json.loads(event["attributes"]["gen_ai.output.messages"])[0]["role"] == "assistant"
