"""The SDK against the real app (uvicorn in-process, ``asgi_server``) and ClickHouse: what a traced
request sends is what the store holds — parents, phases, statuses, tokens, TTFT, events — across
asyncio tasks, a thread, a traceparent hop to a second service, and an instrumented OpenAI-like
client."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import tracedash_sdk as td
from store import get_store
from tests.sdk.fakes import FakeClient

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

FIRST_CHUNK_DELAY = 0.120


def stored_spans(project_id: int) -> dict[str, dict]:
    rows = get_store().query(
        "SELECT trace_id, span_id, parent_span_id, name, phase, service, model, status, status_message,"
        " ttft_ns, input_tokens, output_tokens, cost_usd, duration_ns, attributes, event_names, event_times,"
        " toUnixTimestamp64Nano(start_time) AS start_ns FROM spans WHERE project_id = {p:UInt64}",
        {"p": project_id}, tag="tests.sdk").dicts()
    by_name = {r["name"]: r for r in rows}
    assert len(by_name) == len(rows), [r["name"] for r in rows]
    return by_name


def fake_model_stream(marks: list):
    """A model that thinks for 120 ms, then streams four chunks (``marks`` gets the first one's
    ``perf_counter_ns``: on a loaded machine ``sleep`` may oversleep)."""
    time.sleep(FIRST_CHUNK_DELAY)
    for chunk in ("The", " answer", " is", " 42."):
        if not marks:
            marks.append(time.perf_counter_ns())
        yield chunk
        time.sleep(0.002)


def test_traced_request_lands_in_clickhouse(asgi_server, project_with_key):
    project, key = project_with_key()
    tracer = td.Tracer(endpoint=asgi_server.url, api_key=key, service="chat-api", flush_interval=0.05)

    async def fetch(i: int):
        with tracer.span(f"fetch-{i}", phase="network", attributes={"shard": i}):
            await asyncio.sleep(0.005)

    async def fetch_all():
        await asyncio.gather(fetch(0), fetch(1))

    def rerank():
        with tracer.span("rerank", phase="preprocess"):
            time.sleep(0.002)

    try:
        with tracer.trace("POST /chat", attributes={"http.route": "/chat", "user.tier": "pro"}) as t:
            with t.phase("network"):
                time.sleep(0.003)
            with t.phase("preprocess") as pre:
                with tracer.span("retrieve", phase="preprocess", attributes={"k": 5}) as retrieve:
                    retrieve.set_attribute("index", "docs").add_event("cache_miss", attributes={"key": "q1"})
                asyncio.run(fetch_all())
                worker = threading.Thread(target=td.wrap(rerank))
                worker.start()
                worker.join()
            with t.phase("inference") as inference:
                entered = time.perf_counter_ns()  # the span started just before
                inference.set_model("fake-llm-1")
                marks: list = []
                text = "".join(td.stream(fake_model_stream(marks)))
                inference.set_tokens(input=812).set_cost(0.0042)
            with t.phase("postprocess"):
                with pytest.raises(ValueError):
                    with tracer.span("render", phase="postprocess"):
                        raise ValueError("template failed")
        assert text == "The answer is 42."
        assert tracer.flush(10)
    finally:
        tracer.shutdown(2)
    stats = tracer.exporter.stats
    assert (stats["spans_sent"], stats["spans_dropped"], stats["spans_rejected"], stats["batches_failed"]) == (10, 0, 0, 0)

    spans = stored_spans(project.pk)
    assert set(spans) == {"POST /chat", "network", "preprocess", "retrieve", "fetch-0", "fetch-1", "rerank",
                          "inference", "postprocess", "render"}
    root = spans["POST /chat"]
    assert root["parent_span_id"] == "" and root["phase"] == "other" and root["service"] == "chat-api"
    assert root["attributes"] == {"http.route": "/chat", "user.tier": "pro"}
    assert all(s["trace_id"] == root["trace_id"] and s["service"] == "chat-api" for s in spans.values())
    for phase in ("network", "preprocess", "inference", "postprocess"):
        assert spans[phase]["phase"] == phase and spans[phase]["parent_span_id"] == root["span_id"], phase
    assert spans["retrieve"]["parent_span_id"] == spans["preprocess"]["span_id"]
    assert spans["retrieve"]["attributes"] == {"k": "5", "index": "docs"}
    assert spans["retrieve"]["event_names"] == ["cache_miss"]
    for name in ("fetch-0", "fetch-1"):  # asyncio tasks inherit the current span
        assert spans[name]["parent_span_id"] == spans["preprocess"]["span_id"] and spans[name]["phase"] == "network"
    assert spans["rerank"]["parent_span_id"] == spans["preprocess"]["span_id"]  # a thread, via td.wrap
    render = spans["render"]
    assert render["parent_span_id"] == spans["postprocess"]["span_id"]
    assert (render["status"], render["status_message"]) == ("error", "ValueError: template failed")
    assert render["event_names"] == ["exception"] and root["status"] == "ok"

    inference = spans["inference"]
    assert (inference["model"], inference["input_tokens"], inference["output_tokens"]) == ("fake-llm-1", 812, 4)
    assert inference["cost_usd"] == pytest.approx(0.0042)
    ttft_ms = inference["ttft_ns"] / 1e6
    first_chunk_ms = (marks[0] - entered) / 1e6  # when the first chunk really came (>= 120 ms)
    # TTFT is when the first chunk really arrived (sleep can oversleep on a busy machine), to the ms.
    assert FIRST_CHUNK_DELAY * 1000 <= first_chunk_ms <= ttft_ms < first_chunk_ms + 10, (ttft_ms, first_chunk_ms)
    assert inference["event_names"] == ["first_token"]
    first_token_ns = inference["event_times"][0]
    first_token_ns = first_token_ns if isinstance(first_token_ns, int) else int(first_token_ns.timestamp() * 1e9)
    assert abs(first_token_ns - inference["start_ns"] - inference["ttft_ns"]) < 2_000  # same instant (µs precision)
    assert inference["duration_ns"] > inference["ttft_ns"]
    # times: every child inside its parent, durations exact to the nanosecond as sent
    for span in spans.values():
        if span["parent_span_id"]:
            parent = next(p for p in spans.values() if p["span_id"] == span["parent_span_id"])
            assert parent["start_ns"] <= span["start_ns"]
            assert span["start_ns"] + span["duration_ns"] <= parent["start_ns"] + parent["duration_ns"]


def test_traceparent_makes_the_second_service_a_child(asgi_server, project_with_key):
    project, key = project_with_key()
    frontend = td.Tracer(endpoint=asgi_server.url, api_key=key, service="frontend", flush_interval=0.05)
    backend = td.Tracer(endpoint=asgi_server.url, api_key=key, service="model-server", flush_interval=0.05)

    def model_server(headers: dict) -> str:  # another process in real life: only the headers travel
        with backend.trace("POST /generate", parent=backend.extract(headers)) as span:
            span.set_model("llama-3-8b").set_tokens(input=10, output=20)
            return span.span_id

    try:
        with frontend.trace("POST /chat"):
            with frontend.span("call model-server", phase="network") as call:
                headers = frontend.inject({"content-type": "application/json"})
                assert headers["traceparent"] == f"00-{call.trace_id}-{call.span_id}-01"
                model_server(dict(headers))
        assert frontend.flush(10) and backend.flush(10)
    finally:
        frontend.shutdown(2)
        backend.shutdown(2)
    spans = stored_spans(project.pk)
    remote, call, root = spans["POST /generate"], spans["call model-server"], spans["POST /chat"]
    assert remote["trace_id"] == call["trace_id"] == root["trace_id"]
    assert remote["parent_span_id"] == call["span_id"] and call["parent_span_id"] == root["span_id"]
    assert (remote["service"], call["service"], remote["model"]) == ("model-server", "frontend", "llama-3-8b")


def test_instrumented_openai_client(asgi_server, project_with_key):
    project, key = project_with_key()
    tracer = td.Tracer(endpoint=asgi_server.url, api_key=key, service="chat-api", flush_interval=0.05)
    client = td.instrument_openai(FakeClient(first_token_delay=0.06), tracer=tracer)
    try:
        with tracer.trace("POST /chat") as root:
            response = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
            with tracer.span("stream", phase="other"):
                chunks = list(client.chat.completions.create(model="gpt-4o", messages=[], stream=True))
        assert response.usage.prompt_tokens == 12 and len(chunks) == 4
        assert tracer.flush(10)
    finally:
        tracer.shutdown(2)
    spans = stored_spans(project.pk)
    plain, streamed = spans["chat gpt-4o-mini"], spans["chat gpt-4o"]
    assert plain["parent_span_id"] == root.span_id and streamed["parent_span_id"] == spans["stream"]["span_id"]
    for span in (plain, streamed):
        assert (span["phase"], span["model"], span["input_tokens"], span["output_tokens"]) == (
            "inference", "gpt-4o-mini-2024-07-18", 12, 5)
        assert span["attributes"]["finish_reason"] == "stop" and span["status"] == "ok"
    assert plain["ttft_ns"] is None
    assert 60 <= streamed["ttft_ns"] / 1e6 < 200 and streamed["event_names"] == ["first_token"]
    assert streamed["attributes"]["gen_ai.request.model"] == "gpt-4o"


def test_cache_lookups_reach_the_store_and_the_summaries(asgi_server, project_with_key):
    """``tracer.cache`` spans, sent to the real server: the ingest maps their ``tracedash.cache.hit``
    to ``spans.cache`` and the summariser makes each request a hit, a miss, or neither."""
    from analytics.summarizer import traces_summarize

    project, key = project_with_key()
    tracer = td.Tracer(endpoint=asgi_server.url, api_key=key, service="chat-api", flush_interval=0.05)
    answers = {"what is otlp?": "a protocol"}
    outcomes = {}
    try:
        for question in ("what is otlp?", "what is ttft?", "what is tpot?"):
            with tracer.trace("POST /chat") as t:
                outcomes[question] = t.trace_id
                answer = None
                if question == "what is tpot?":
                    with pytest.raises(ConnectionError), t.cache("semantic"):
                        raise ConnectionError("vector store down")  # the lookup failed: neither hit nor miss
                else:
                    with t.cache("semantic") as c:
                        answer = answers.get(question)
                        c.hit = answer is not None
                if answer is None:
                    with t.phase("inference") as call:
                        call.set_model("fake-llm-1").set_tokens(input=10, output=5)
        assert tracer.flush(10)
    finally:
        tracer.shutdown(2)
    rows = get_store().query("SELECT trace_id, name, phase, cache FROM spans WHERE project_id = {p:UInt64}"
                             " AND name = 'cache semantic'", {"p": project.pk}, tag="tests.sdk").dicts()
    assert {(r["trace_id"], r["phase"], r["cache"]) for r in rows} == {
        (outcomes["what is otlp?"], "preprocess", 2), (outcomes["what is ttft?"], "preprocess", 1),
        (outcomes["what is tpot?"], "preprocess", 0)}
    traces_summarize(project_ids=[project.pk])
    summaries = {r["trace_id"]: r["cache"] for r in get_store().query(
        "SELECT trace_id, cache FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": project.pk},
        tag="tests.sdk").dicts()}
    assert summaries == {outcomes["what is otlp?"]: 2, outcomes["what is ttft?"]: 1, outcomes["what is tpot?"]: 0}
