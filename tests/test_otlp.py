"""OTLP/HTTP: spans exported by the official OpenTelemetry SDK arrive with the right phase,
model, tokens, TTFT and cost; OTLP JSON, partial success, metrics and malformed payloads."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)

from store import get_store
from tests.conftest import wait_until

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def spans_of(project_id: int) -> dict[str, dict]:
    rows = get_store().query(
        "SELECT name, phase, service, model, input_tokens, output_tokens, ttft_ns, cost_usd, status, status_message,"
        " span_id, parent_span_id, trace_id, attributes, resource_attributes, duration_ns FROM spans"
        " WHERE project_id = {p:UInt64}", {"p": project_id}, tag="tests.otlp").dicts()
    return {r["name"]: r for r in rows}


def test_official_sdk_exporter_via_environment(asgi_server, project_with_key, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind, Status, StatusCode

    project, key = project_with_key()
    # How users configure any OTLP exporter: the base URL and the key in the standard variables.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", asgi_server.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{key}")
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-chat", "deployment.environment": "test"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("tests.otlp", "1.2.3")

    with tracer.start_as_current_span("POST /chat", kind=SpanKind.SERVER) as root:
        with tracer.start_as_current_span("GET vector-db", kind=SpanKind.CLIENT,
                                          attributes={"http.request.method": "GET", "url.full": "http://db/q"}):
            pass
        with tracer.start_as_current_span("retrieve", attributes={"openinference.span.kind": "RETRIEVER"}):
            pass
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.response.model": "gpt-4o-2024-08-06",
            "gen_ai.usage.input_tokens": 812, "gen_ai.usage.output_tokens": 164,
            "gen_ai.response.time_to_first_chunk": 0.25, "gen_ai.usage.cost": 0.0042,
            "gen_ai.prompt": "<b>hello</b>",
        }):
            pass
        with tracer.start_as_current_span("llm", attributes={
            "openinference.span.kind": "LLM", "llm.model_name": "llama-3-8b", "llm.token_count.prompt": 10,
            "llm.token_count.completion": 5,
        }) as oi_span:
            oi_span.add_event("first_token")
        with tracer.start_as_current_span("render", attributes={"tracedash.phase": "postprocess"}) as render:
            render.set_status(Status(StatusCode.ERROR, "template failed"))
        root.set_attribute("user.tier", "pro")
    assert provider.force_flush(10_000)
    provider.shutdown()

    spans = spans_of(project.pk)
    assert set(spans) == {"POST /chat", "GET vector-db", "retrieve", "chat gpt-4o", "llm", "render"}
    root = spans["POST /chat"]
    assert root["parent_span_id"] == "" and root["phase"] == "other" and root["attributes"]["user.tier"] == "pro"
    assert all(s["trace_id"] == root["trace_id"] for s in spans.values())
    assert all(s["parent_span_id"] == root["span_id"] for n, s in spans.items() if n != "POST /chat")
    assert all(s["service"] == "otel-chat" for s in spans.values())
    assert root["resource_attributes"]["deployment.environment"] == "test"
    assert root["attributes"]["otel.scope.name"] == "tests.otlp"
    assert spans["GET vector-db"]["phase"] == "network"
    assert spans["retrieve"]["phase"] == "preprocess"
    chat = spans["chat gpt-4o"]
    assert (chat["phase"], chat["model"], chat["input_tokens"], chat["output_tokens"]) == ("inference", "gpt-4o-2024-08-06", 812, 164)
    assert chat["ttft_ns"] == 250_000_000 and chat["cost_usd"] == pytest.approx(0.0042)
    assert chat["attributes"]["gen_ai.prompt"] == "<b>hello</b>"
    llm = spans["llm"]
    assert (llm["phase"], llm["model"], llm["input_tokens"], llm["output_tokens"]) == ("inference", "llama-3-8b", 10, 5)
    assert llm["ttft_ns"] is not None and 0 <= llm["ttft_ns"] <= llm["duration_ns"]  # from the first_token event
    assert spans["render"]["phase"] == "postprocess"
    assert (spans["render"]["status"], spans["render"]["status_message"]) == ("error", "template failed")


def otlp_json_span(trace_id="5b8efff798038103d269b633813fc60c", span_id="eee19b7ec3c1b174", **extra):
    span = {"traceId": trace_id, "spanId": span_id, "name": "chat", "kind": 3,
            "startTimeUnixNano": "1764500000000000000", "endTimeUnixNano": "1764500000900000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                           {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "42"}},
                           {"key": "gen_ai.response.time_to_first_chunk", "value": {"doubleValue": 0.125}},
                           {"key": "gen_ai.request.model", "value": {"stringValue": "m1"}},
                           {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"intValue": "1"}]}}},
                           {"key": "meta", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}}}]}
    span.update(extra)
    return span


def post(client, path, key, body, content_type):
    return client.post(path, data=body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_otlp_json_with_partial_success(client, project_with_key):
    import time

    project, key = project_with_key()
    now = time.time_ns()
    good = otlp_json_span(startTimeUnixNano=str(now - 10**9), endTimeUnixNano=str(now))
    bad = otlp_json_span(trace_id="XYZ", span_id="0000000000000001")
    payload = {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]},
                                  "scopeSpans": [{"scope": {"name": "s"}, "spans": [good, bad]}]}]}
    response = post(client, "/v1/traces", key, json.dumps(payload), "application/json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    body = response.json()
    assert body["partialSuccess"]["rejectedSpans"] == "1"  # int64 is a string in OTLP JSON
    assert "traceId" in body["partialSuccess"]["errorMessage"]
    row = spans_of(project.pk)["chat"]
    assert (row["phase"], row["model"], row["input_tokens"], row["ttft_ns"], row["service"]) == ("inference", "m1", 42, 125_000_000, "svc")
    assert row["attributes"]["tags"] == '["a",1]' and row["attributes"]["meta.k"] == "true"


def _attr(key, value):
    kind = {str: "stringValue", int: "intValue", float: "doubleValue"}[type(value)]
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def test_ttft_from_openinference_event_and_openlit_attribute(client, project_with_key):
    """TTFT signals other instrumentations send: OpenInference's ``First Token Stream Event`` span
    event and OpenLIT's ``gen_ai.server.time_to_first_token`` attribute (seconds)."""
    import time

    project, key = project_with_key()
    start = time.time_ns() - 10**9
    oi = otlp_json_span(span_id="00000000000000a1", name="ChatCompletion", attributes=[
        _attr("openinference.span.kind", "LLM"), _attr("llm.model_name", "m1")],
        startTimeUnixNano=str(start), endTimeUnixNano=str(start + 900_000_000),
        events=[{"name": "First Token Stream Event", "timeUnixNano": str(start + 310_000_000)}])
    lit = otlp_json_span(span_id="00000000000000a2", name="chat m1", attributes=[
        _attr("gen_ai.operation.name", "chat"), _attr("gen_ai.request.model", "m1"),
        _attr("gen_ai.server.time_to_first_token", 0.205)],
        startTimeUnixNano=str(start), endTimeUnixNano=str(start + 900_000_000))
    payload = {"resourceSpans": [{"scopeSpans": [{"spans": [oi, lit]}]}]}
    assert post(client, "/v1/traces", key, json.dumps(payload), "application/json").status_code == 200
    spans = spans_of(project.pk)
    assert spans["ChatCompletion"]["ttft_ns"] == 310_000_000
    assert spans["chat m1"]["ttft_ns"] == 205_000_000


def test_absent_tokens_stay_absent(client, project_with_key):
    """A span without token attributes (a failed call) stores NULL, not 0: unknown."""
    import time

    project, key = project_with_key()
    now = time.time_ns()
    span = otlp_json_span(startTimeUnixNano=str(now - 10**9), endTimeUnixNano=str(now), status={"code": 2},
                          attributes=[_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.request.model", "m1")])
    payload = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    assert post(client, "/v1/traces", key, json.dumps(payload), "application/json").status_code == 200
    row = spans_of(project.pk)["chat"]
    assert (row["status"], row["input_tokens"], row["output_tokens"]) == ("error", None, None)


def test_malformed_otlp_is_a_json_400(client, project_with_key):
    _, key = project_with_key()
    response = post(client, "/v1/traces", key, b"\x0a\xff\xff\xff\xff\x0f garbage", "application/x-protobuf")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_otlp" and "ExportTraceServiceRequest" in response.json()["error"]["message"]
    response = post(client, "/v1/traces", key, '{"resourceSpans": 5}', "application/json")
    assert response.status_code == 400 and "resourceSpans must be a list" in response.json()["error"]["message"]
    # A structure where OTLP has a string: refused while decoding (a number in it could not be
    # flattened back to JSON text).
    nested = otlp_json_span(attributes=[{"key": "a", "value": {"stringValue": [1.5]}}])
    response = post(client, "/v1/traces", key, json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [nested]}]}]}),
                    "application/json")
    assert response.status_code == 400 and "stringValue must be a string" in response.json()["error"]["message"]
    assert post(client, "/v1/traces", key, b"{}", "text/plain").status_code == 415
    empty = post(client, "/v1/traces", key, b"{}", "application/json")  # an empty export is valid
    assert empty.status_code == 200 and empty.json() == {}


def _gauge(metric, name, unit, points):
    metric.name, metric.unit = name, unit
    for value, attributes, time_ns in points:
        point = metric.gauge.data_points.add()
        point.as_double, point.time_unix_nano = value, time_ns
        for k, v in attributes.items():
            kv = point.attributes.add()
            kv.key = k
            if isinstance(v, int):
                kv.value.int_value = v
            else:
                kv.value.string_value = v


def test_otlp_metrics_map_gpu_and_host_gauges(client, project_with_key):
    import time

    project, key = project_with_key()
    t = time.time_ns() // 10**9 * 10**9
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = "host.name", "gpu-node-7"
    metrics = rm.scope_metrics.add().metrics
    # OpenTelemetry hardware semantic conventions (ratio utilisation, bytes)
    _gauge(metrics.add(), "hw.gpu.utilization", "1", [(0.93, {"hw.id": "gpu0"}, t)])
    _gauge(metrics.add(), "hw.gpu.memory.usage", "By", [(70 * 2**30, {"hw.id": "gpu0"}, t)])
    _gauge(metrics.add(), "hw.gpu.memory.limit", "By", [(80 * 2**30, {"hw.id": "gpu0"}, t)])
    # OpenLIT's GPU gauges (percent, MiB)
    _gauge(metrics.add(), "gpu.utilization", "", [(40.0, {"gpu_index": 1, "gpu_uuid": "GPU-abc", "gpu_name": "H100"}, t)])
    _gauge(metrics.add(), "gpu.memory.used", "", [(1024.0, {"gpu_index": 1}, t)])
    _gauge(metrics.add(), "gpu.temperature", "Cel", [(66.0, {"gpu_index": 1}, t)])
    _gauge(metrics.add(), "gpu.power.draw", "W", [(301.5, {"gpu_index": 1}, t)])
    # host: per-CPU idle ratios and memory by state
    _gauge(metrics.add(), "system.cpu.utilization", "1", [(0.2, {"cpu": 0, "system.cpu.state": "idle"}, t),
                                                          (0.4, {"cpu": 1, "system.cpu.state": "idle"}, t),
                                                          (0.7, {"cpu": 0, "system.cpu.state": "user"}, t)])
    _gauge(metrics.add(), "system.memory.usage", "By", [(6 * 2**30, {"system.memory.state": "used"}, t),
                                                       (10 * 2**30, {"system.memory.state": "free"}, t)])
    _gauge(metrics.add(), "gpu.utilization", "", [(-5.0, {"gpu_index": 2}, t)])  # rejected
    response = post(client, "/v1/metrics", key, request.SerializeToString(), "application/x-protobuf")
    assert response.status_code == 200
    assert ExportMetricsServiceResponse.FromString(response.content).partial_success.rejected_data_points == 1
    rows = {r["gpu_index"]: r for r in get_store().query(
        "SELECT * FROM resource_samples WHERE project_id = {p:UInt64}", {"p": project.pk}, tag="tests.metrics").dicts()}
    assert set(rows) == {-1, 0, 1}
    assert all(r["host"] == "gpu-node-7" for r in rows.values())
    assert rows[0]["gpu_utilization"] == pytest.approx(93.0)
    assert rows[0]["gpu_memory_used"] / rows[0]["gpu_memory_total"] == pytest.approx(0.875)
    assert (rows[1]["gpu_utilization"], rows[1]["gpu_memory_used"], rows[1]["gpu_temperature"]) == (40.0, 2**30, 66.0)
    assert (rows[1]["gpu_uuid"], rows[1]["gpu_name"], rows[1]["gpu_power_watts"]) == ("GPU-abc", "H100", pytest.approx(301.5))
    assert rows[1]["gpu_memory_total"] is None  # not sent: missing, never 0
    assert rows[-1]["cpu_percent"] == pytest.approx(70.0)  # 1 - mean idle (0.2, 0.4)
    assert (rows[-1]["memory_used"], rows[-1]["memory_total"]) == (6 * 2**30, 16 * 2**30)


def test_native_resource_samples(client, project_with_key):
    import time

    project, key = project_with_key()
    now = time.time_ns()
    samples = [
        {"host": "h1", "time": now, "cpu_percent": 55.5, "memory_used": 4, "memory_total": 8},
        {"host": "h1", "time": now, "gpu_index": 0, "gpu_uuid": "GPU-1", "gpu_memory_used": 85, "gpu_memory_total": 100,
         "gpu_utilization": 99.0, "processes": [{"pid": 42, "name": "vllm", "gpu_memory": 80}]},
        {"host": "h1", "time": now, "gpu_index": 1, "gpu_memory_used": 101, "gpu_memory_total": 100},
        {"host": "", "time": now},
        {"host": "h1", "time": now, "cpu_percent": 120},
    ]
    response = post(client, "/api/v1/resources", key, json.dumps({"samples": samples}), "application/json")
    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == 2
    assert [(r["index"], r["field"]) for r in body["rejected"]] == [(2, "gpu_memory_used"), (3, "host"), (4, "cpu_percent")]
    rows = get_store().query("SELECT gpu_index, process_pids, process_names, process_gpu_memory, cpu_percent"
                             " FROM resource_samples WHERE project_id = {p:UInt64} ORDER BY gpu_index",
                             {"p": project.pk}, tag="tests.samples").rows
    assert rows == [(-1, [], [], [], pytest.approx(55.5)), (0, [42], ["vllm"], [80], None)]


def test_rate_limit_answers_429_with_retry_after(client, project_with_key, settings):
    from tests.spans import llm_trace

    settings.TRACEDASH_INGEST_RATE_LIMIT = 4  # spans/s per key; bursts of 2 s = 8 spans
    _, key = project_with_key()
    _, other_key = project_with_key()
    send = lambda k: post(client, "/api/v1/traces", k, json.dumps({"spans": llm_trace()}), "application/json")  # noqa: E731
    assert send(key).status_code == 200  # 5 of 8
    limited = send(key)  # 10 > 8
    assert limited.status_code == 429 and int(limited["Retry-After"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limited"
    assert send(other_key).status_code == 200  # per key


def test_revoked_key_is_refused_at_once(client, project_with_key):
    from projects.models import ApiKey
    from projects.services import api_key_revoke

    project, key = project_with_key()
    assert post(client, "/v1/traces", key, b"{}", "application/json").status_code == 200
    api_key_revoke(key=ApiKey.objects.get(project=project))
    response = post(client, "/v1/traces", key, b"{}", "application/json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"


def test_oversized_bodies_are_refused_before_reading(asgi_server, project_with_key, settings):
    import http.client

    settings.TRACEDASH_INGEST_MAX_BODY_BYTES = 50_000
    _, key = project_with_key()
    conn = http.client.HTTPConnection("127.0.0.1", asgi_server.port, timeout=10)
    # Content-Length over the limit: answered without the body ever being sent.
    conn.putrequest("POST", "/api/v1/traces")
    conn.putheader("Authorization", f"Bearer {key}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(10**9))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["code"] == "body_too_large"
    conn.close()
    # Chunked, no Content-Length: refused once the limit is passed (the whole request fits in the
    # socket buffers, so the client can read the answer even though the server stops reading).
    import socket

    chunk = b"x" * 10_000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(6)) + b"0\r\n\r\n"
    head = (f"POST /api/v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", asgi_server.port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    assert answer.startswith(b"HTTP/1.1 413")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_too_large"


# --- the Langfuse SDK's attributes ----------------------------------------------------------------
def _langfuse_span(span_id, name, start, attributes, **extra):
    """A span as the Langfuse SDK (v3+) exports it: its tracer's scope, ``langfuse.*`` attributes."""
    return {"traceId": "7b8efff798038103d269b633813fc60c", "spanId": span_id, "name": name, "kind": 1,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 900_000_000),
            "attributes": [_attr(k, v) for k, v in attributes.items()], **extra}


def _langfuse_export(spans, resource=None):
    resource = resource or {"service.name": "unknown_service:python", "telemetry.sdk.language": "python"}
    return {"resourceSpans": [{"resource": {"attributes": [_attr(k, v) for k, v in resource.items()]},
                               "scopeSpans": [{"scope": {"name": "langfuse-sdk", "version": "5.2.0"}, "spans": spans}]}]}


def _rfc3339(ns: int) -> str:
    from datetime import datetime, timezone

    seconds, rest = divmod(ns, 10**9)
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{rest // 1000:06d}Z"


def test_langfuse_observations_are_mapped(client, project_with_key):
    """Langfuse puts model, usage, cost, first-token time and level in its own attributes (JSON text
    for usage, cost and time, as langfuse 5.2.0 writes them) and names no service."""
    import time

    project, key = project_with_key()
    start = (time.time_ns() - 10**9) // 1000 * 1000  # Langfuse's times have microseconds
    spans = [
        _langfuse_span("00000000000000b1", "plain", start, {
            "langfuse.observation.type": "span", "langfuse.trace.name": "chat-plain", "user.id": "u-42",
            "session.id": "s-7", "langfuse.observation.input": '{"q": "<b>hi</b>"}'}),
        _langfuse_span("00000000000000b2", "OpenAI-generation", start, {
            "langfuse.observation.type": "generation", "langfuse.observation.model.name": "gpt-4o",
            "langfuse.observation.usage_details": json.dumps({"completion_tokens": 16, "prompt_tokens": 12,
                                                              "total_tokens": 28, "prompt_tokens_details": None}),
            "langfuse.observation.cost_details": json.dumps({"input": 0.001, "output": 0.002}),
            "langfuse.observation.completion_start_time": json.dumps(_rfc3339(start + 250_000_000)),
            "user.id": "u-42"}, parentSpanId="00000000000000b1"),
        _langfuse_span("00000000000000b3", "embed", start, {
            "langfuse.observation.type": "embedding", "langfuse.observation.model.name": "text-embedding-3-small",
            "langfuse.observation.usage_details": json.dumps({"input": 7}),
            "langfuse.observation.cost_details": json.dumps({"input": 0.0001, "total": 0.0003})}),
        _langfuse_span("00000000000000b4", "failed", start, {
            "langfuse.observation.type": "generation", "langfuse.observation.model.name": "no-such-model",
            "langfuse.observation.level": "ERROR", "langfuse.observation.status_message": "Error code: 404",
            "langfuse.observation.cost_details": json.dumps({"input": 0, "output": 0, "total": 0})}),
        _langfuse_span("00000000000000b5", "search", start, {"langfuse.observation.type": "retriever"}),
        _langfuse_span("00000000000000b6", "moderate", start, {"langfuse.observation.type": "guardrail"}),
        _langfuse_span("00000000000000b7", "score", start, {"langfuse.observation.type": "evaluator"}),
        _langfuse_span("00000000000000b8", "lookup", start, {"langfuse.observation.type": "tool"}),
        # Stronger signals win over the observation type.
        _langfuse_span("00000000000000b9", "stated", start, {"langfuse.observation.type": "generation",
                                                              "tracedash.phase": "postprocess"}),
        _langfuse_span("00000000000000ba", "otel-chat", start, {"langfuse.observation.type": "span",
                                                                 "gen_ai.operation.name": "chat"}),
        # A first-token time after the span ended is not the span's TTFT.
        _langfuse_span("00000000000000bb", "late", start, {
            "langfuse.observation.type": "generation",
            "langfuse.observation.completion_start_time": _rfc3339(start + 2 * 10**9)}),
    ]
    response = post(client, "/api/public/otel/v1/traces", key, json.dumps(_langfuse_export(spans)), "application/json")
    assert response.status_code == 200 and response.json() == {}, response.content
    rows = spans_of(project.pk)
    assert {name: row["phase"] for name, row in rows.items()} == {
        "plain": "other", "OpenAI-generation": "inference", "embed": "inference", "failed": "inference",
        "search": "preprocess", "moderate": "postprocess", "score": "postprocess", "lookup": "other",
        "stated": "postprocess", "otel-chat": "inference", "late": "inference"}
    # No service.name of its own (OpenTelemetry's unknown_service:python): "langfuse".
    assert {row["service"] for row in rows.values()} == {"langfuse"}
    generation = rows["OpenAI-generation"]
    assert (generation["model"], generation["input_tokens"], generation["output_tokens"]) == ("gpt-4o", 12, 16)
    assert generation["ttft_ns"] == 250_000_000 and generation["status"] == "ok"
    assert generation["cost_usd"] == pytest.approx(0.003)  # no total: the sum of the entries
    embed = rows["embed"]
    assert (embed["model"], embed["input_tokens"], embed["output_tokens"]) == ("text-embedding-3-small", 7, None)
    assert embed["cost_usd"] == pytest.approx(0.0003) and embed["ttft_ns"] is None  # the total wins
    failed = rows["failed"]
    assert (failed["status"], failed["status_message"]) == ("error", "Error code: 404")
    assert (failed["input_tokens"], failed["output_tokens"], failed["cost_usd"]) == (None, None, 0.0)
    assert rows["late"]["ttft_ns"] is None
    plain = rows["plain"]
    assert (plain["model"], plain["input_tokens"], plain["cost_usd"], plain["status"]) == ("", None, None, "ok")
    assert plain["attributes"]["langfuse.trace.name"] == "chat-plain"
    assert (plain["attributes"]["user.id"], plain["attributes"]["session.id"]) == ("u-42", "s-7")
    assert plain["attributes"]["langfuse.observation.input"] == '{"q": "<b>hi</b>"}'
    assert plain["attributes"]["otel.scope.name"] == "langfuse-sdk"


def test_a_langfuse_app_names_its_service_the_opentelemetry_way(client, project_with_key):
    """OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) reaches the resource Langfuse exports."""
    import time

    project, key = project_with_key()
    span = _langfuse_span("00000000000000c1", "chat", time.time_ns() - 10**9, {"langfuse.observation.type": "span"})
    payload = _langfuse_export([span], resource={"service.name": "support-bot", "langfuse.environment": "prod"})
    assert post(client, "/api/public/otel/v1/traces", key, json.dumps(payload), "application/json").status_code == 200
    row = spans_of(project.pk)["chat"]
    assert row["service"] == "support-bot" and row["resource_attributes"]["langfuse.environment"] == "prod"


@pytest.mark.parametrize("attributes, field, message", [
    ({"langfuse.observation.usage_details": "{prompt_tokens: 3"}, "attributes.langfuse.observation.usage_details",
     "expected a JSON object as text"),
    ({"langfuse.observation.usage_details": "[3, 4]"}, "attributes.langfuse.observation.usage_details",
     "expected a JSON object, got list"),
    ({"langfuse.observation.usage_details": '{"input": -3}'}, "attributes.langfuse.observation.usage_details.input",
     "non-negative"),
    ({"langfuse.observation.usage_details": '{"completion_tokens": 2.5}'},
     "attributes.langfuse.observation.usage_details.completion_tokens", "whole number"),
    ({"langfuse.observation.usage_details": '{"prompt_tokens": {"n": 1}}'},
     "attributes.langfuse.observation.usage_details.prompt_tokens", "expected a number"),
    ({"langfuse.observation.cost_details": '{"total": "lots"}'}, "attributes.langfuse.observation.cost_details.total",
     "expected a number"),
    ({"langfuse.observation.cost_details": '{"input": -0.5}'}, "attributes.langfuse.observation.cost_details.input",
     "non-negative"),
    ({"langfuse.observation.completion_start_time": '"yesterday"'},
     "attributes.langfuse.observation.completion_start_time", "RFC 3339"),
    ({"langfuse.observation.completion_start_time": 1.5},
     "attributes.langfuse.observation.completion_start_time", "as text"),
])
def test_bad_langfuse_values_reject_the_span(attributes, field, message):
    from ingest import otlp
    from ingest.schemas import FieldError, Limits

    span = otlp.OtlpSpan(trace_id="7b8efff798038103d269b633813fc60c", span_id="00000000000000d1", parent_span_id="",
                         name="OpenAI-generation", kind=1, start_ns=1_796_000_000_000_000_000,
                         end_ns=1_796_000_000_900_000_000, attributes={"langfuse.observation.type": "generation",
                                                                       **attributes},
                         events=[], status_code=0, status_message="", resource={}, scope_name="langfuse-sdk")
    with pytest.raises(FieldError) as refused:
        otlp.span_row(span, project_id=1, limits=Limits())
    assert refused.value.field == field and message in refused.value.message


def test_each_span_gets_its_own_resource_and_a_bad_resource_rejects_its_spans_only():
    """The spans of one resource share its flattened attributes (flattened once a request); spans of
    another resource in the same request get theirs, and a resource that cannot be stored rejects
    each of its spans, naming it, while the other resource's spans are kept."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from ingest import otlp
    from ingest.schemas import Limits, parse_each

    request = ExportTraceServiceRequest()
    deep = {"v": "x"}
    for _ in range(10):
        deep = {"n": deep}

    def any_value(target, value):
        if isinstance(value, dict):
            for key, inner in value.items():
                kv = target.kvlist_value.values.add()
                kv.key = key
                any_value(kv.value, inner)
        else:
            target.string_value = value

    for n, attributes in enumerate(({"service.name": "a", "region": "eu"}, {"service.name": "b"},
                                    {"service.name": "c", "deep": deep}, {"service.name": "a", "region": "eu"})):
        resource_spans = request.resource_spans.add()
        for key, value in attributes.items():
            kv = resource_spans.resource.attributes.add()
            kv.key = key
            any_value(kv.value, value)
        scope_spans = resource_spans.scope_spans.add()
        for i in range(2):
            span = scope_spans.spans.add()
            span.trace_id = bytes.fromhex(f"{n + 1:032x}")
            span.span_id = bytes.fromhex(f"{10 * n + i + 1:016x}")
            span.name = f"op {n}.{i}"
            span.start_time_unix_nano = 1_767_225_600_000_000_000
            span.end_time_unix_nano = 1_767_225_600_001_000_000
    spans = otlp.decode_traces(request.SerializeToString(), otlp.PROTOBUF)
    rows, rejected = parse_each(spans, lambda span: otlp.span_row(span, project_id=1, limits=Limits()))
    assert [r["resource_attributes"] for r in rows] == [{"service.name": "a", "region": "eu"}] * 2 + [
        {"service.name": "b"}] * 2 + [{"service.name": "a", "region": "eu"}] * 2
    assert [r["service"] for r in rows] == ["a", "a", "b", "b", "a", "a"]
    assert [(r["index"], r["field"]) for r in rejected] == [(4, "resource.attributes"), (5, "resource.attributes")]
