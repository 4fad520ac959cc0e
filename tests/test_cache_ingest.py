"""A span says whether a cache answered it: ``tracedash.cache.hit`` and the conventions docs/otlp.md
lists ("Caches") become ``spans.cache`` (0 nothing said, 1 miss, 2 hit) on both ingestion paths —
the native JSON API and OTLP sent by the official OpenTelemetry SDK exporter — and a cache-hit
value that is not a boolean rejects the span naming the attribute."""

from __future__ import annotations

import json

import pytest

from ingest.schemas import CACHE_HIT, CACHE_MISS, CACHE_NONE, FieldError, cache_state
from store import get_store
from tests.spans import span_id, trace_id

NS = 1_000_000_000


def stored_cache(project_id: int) -> dict[str, int]:
    rows = get_store().query("SELECT name, cache FROM spans WHERE project_id = {p:UInt64}", {"p": project_id},
                             tag="tests.cache_ingest").dicts()
    return {r["name"]: r["cache"] for r in rows}


@pytest.mark.parametrize("attributes, state", [
    ({}, CACHE_NONE),
    ({"http.route": "/chat"}, CACHE_NONE),
    ({"tracedash.cache.hit": True}, CACHE_HIT),
    ({"tracedash.cache.hit": False}, CACHE_MISS),
    ({"tracedash.cache.hit": "true"}, CACHE_HIT),  # the native API flattens a JSON boolean to text
    ({"tracedash.cache.hit": " FALSE "}, CACHE_MISS),
    ({"tracedash.cache.hit": 1}, CACHE_HIT),
    ({"tracedash.cache.hit": ""}, CACHE_NONE),  # null, flattened: says nothing
    ({"gen_ai.cache.hit": True}, CACHE_HIT),
    ({"cache.hit": "false"}, CACHE_MISS),
    ({"tracedash.cache.hit": False, "cache.hit": True}, CACHE_MISS),  # the first convention present wins
    ({"http.response.header.x-portkey-cache-status": ["SEMANTIC HIT"]}, CACHE_HIT),
    ({"http.response.header.x-portkey-cache-status": '["SEMANTIC MISS"]'}, CACHE_MISS),  # flattened list
    ({"http.response.header.x-portkey-cache-status": ["DISABLED"]}, CACHE_NONE),
    ({"http.response.header.x-portkey-cache-status": ["REFRESH"]}, CACHE_NONE),
    ({"http.response.header.helicone-cache": ["HIT"]}, CACHE_HIT),
    ({"http.response.header.helicone-cache": "miss"}, CACHE_MISS),
])
def test_cache_state_of_attributes(attributes, state):
    assert cache_state(attributes) == state


@pytest.mark.parametrize("value", ["maybe", 2, 0.5, "yes"])
def test_a_cache_hit_that_is_not_a_boolean_is_refused_naming_the_attribute(value):
    with pytest.raises(FieldError) as raised:
        cache_state({"tracedash.cache.hit": value})
    assert raised.value.field == "attributes.tracedash.cache.hit" and "expected a boolean" in raised.value.message


def _span(name, tid, parent, start, attributes=None, **extra):
    return {"trace_id": tid, "span_id": extra.pop("sid", None) or span_id(), "parent_span_id": parent, "name": name,
            "service": "chat-api", "start_time": start, "duration_ms": 5.0, "attributes": attributes or {}, **extra}


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_native_spans_are_mapped_and_a_bad_value_is_a_clear_rejection(client, project_with_key):
    import time

    project, key = project_with_key()
    start = time.time_ns() - 60 * NS
    tid, root = trace_id(), span_id()
    spans = [
        _span("POST /chat", tid, None, start, sid=root),
        _span("cache semantic", tid, root, start, {"tracedash.cache.hit": True, "tracedash.cache.name": "semantic"},
              phase="preprocess"),
        _span("cache exact", tid, root, start, {"tracedash.cache.hit": False}),
        _span("gen_ai lookup", tid, root, start, {"gen_ai.cache.hit": False}),
        _span("generic lookup", tid, root, start, {"cache.hit": True}),
        _span("via portkey", tid, root, start, {"http.response.header.x-portkey-cache-status": ["SEMANTIC HIT"]}),
        _span("via helicone", tid, root, start, {"http.response.header.helicone-cache": ["MISS"]}),
        _span("broken", tid, root, start, {"tracedash.cache.hit": "sometimes"}),
    ]
    response = client.post("/api/v1/traces", data=json.dumps({"spans": spans}), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["accepted"] == 7
    assert body["rejected"] == [{"index": 7, "field": "attributes.tracedash.cache.hit",
                                 "message": "expected a boolean (true or false), got 'sometimes'"}]
    assert stored_cache(project.pk) == {"POST /chat": 0, "cache semantic": 2, "cache exact": 1, "gen_ai lookup": 1,
                                        "generic lookup": 2, "via portkey": 2, "via helicone": 1}
    name = get_store().query("SELECT attributes['tracedash.cache.name'] FROM spans WHERE project_id = {p:UInt64}"
                             " AND name = 'cache semantic'", {"p": project.pk}, tag="tests.cache_ingest").scalar()
    assert name == "semantic"  # the name stays an attribute

    only_bad = client.post("/api/v1/traces", data=json.dumps({"spans": spans[-1:]}), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert only_bad.status_code == 400
    assert "attributes.tracedash.cache.hit" in json.dumps(only_bad.json()["error"])


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_otlp_spans_from_the_official_sdk_are_mapped(asgi_server, project_with_key):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    project, key = project_with_key()
    exporter = OTLPSpanExporter(endpoint=f"{asgi_server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-chat"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.cache_ingest")
    with tracer.start_as_current_span("POST /chat", kind=SpanKind.SERVER):
        with tracer.start_as_current_span("semantic cache", attributes={"tracedash.cache.hit": False,
                                                                        "tracedash.cache.name": "semantic"}):
            pass
        with tracer.start_as_current_span("redis cache", attributes={"cache.hit": True}):
            pass
        with tracer.start_as_current_span("genai cache", attributes={"gen_ai.cache.hit": True}):
            pass
        # A gateway's answer header, as HTTP client instrumentations capture it (a list of strings).
        with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT, attributes={
                "http.request.method": "POST", "url.full": "https://gateway/v1/chat/completions",
                "http.response.header.x-portkey-cache-status": ("SEMANTIC MISS",)}):
            pass
        with tracer.start_as_current_span("helicone", kind=SpanKind.CLIENT, attributes={
                "http.request.method": "POST", "http.response.header.helicone-cache": ("HIT",)}):
            pass
        with tracer.start_as_current_span("text flag", attributes={"tracedash.cache.hit": "TRUE"}):
            pass
        with tracer.start_as_current_span("not a flag", attributes={"tracedash.cache.hit": 3}):
            pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    assert stored_cache(project.pk) == {"POST /chat": 0, "semantic cache": 1, "redis cache": 2, "genai cache": 2,
                                        "POST": 1, "helicone": 2, "text flag": 2}  # "not a flag": rejected
