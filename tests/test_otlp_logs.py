"""OTLP/HTTP logs (``POST /v1/logs``): GenAI events exported by the official OpenTelemetry SDK are
stored with their trace and span and shown on the span (page and JSON, escaped); other log records
are accepted and dropped; malformed input is a JSON error or a partial success naming the record;
an outage is answered from the spool."""

from __future__ import annotations

import gzip
import json
import time

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse

import store
from ingest.writer import get_writer
from store import get_store
from tests.conftest import spool_drained
from tests.spans import llm_trace
from tests.test_ingest_durability import down_store
from tests.trace_seed import seed

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = "eee19b7ec3c1b174"


def span_logs_of(project_id: int) -> list[dict]:
    return get_store().query(
        "SELECT trace_id, span_id, toUnixTimestamp64Nano(time) AS time_ns, event_name, severity, body, attributes,"
        " service, resource_attributes FROM span_logs WHERE project_id = {p:UInt64} ORDER BY time, event_name",
        {"p": project_id}, tag="tests.otlp_logs").dicts()


def post(client, key, body, content_type, **headers):
    return client.post("/v1/logs", data=body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {key}", **headers)


def _value(value) -> dict:
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _value(v)} for k, v in value.items()]}}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"stringValue": value}


def json_record(time_ns: int, *, event_name="gen_ai.user.message", body=None, attributes=None, trace_id=TRACE,
                span_id=SPAN, **extra) -> dict:
    record = {"timeUnixNano": str(time_ns), "traceId": trace_id, "spanId": span_id,
              "attributes": [{"key": k, "value": _value(v)} for k, v in (attributes or {}).items()], **extra}
    if event_name:
        record["eventName"] = event_name
    if body is not None:
        record["body"] = _value(body)
    return record


def json_logs(*records, service="chat-api") -> str:
    return json.dumps({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeLogs": [{"scope": {"name": "tests.logs", "version": "0.1"}, "logRecords": list(records)}]}]})


def test_official_sdk_log_exporter_keeps_genai_events_with_their_span(asgi_server, client, make_user,
                                                                       project_with_key, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    user = make_user()
    project, key = project_with_key(members=[user])
    # As users configure any OTLP exporter: base URL and key in the standard variables, gzip on.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", asgi_server.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{key}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    resource = Resource.create({"service.name": "otel-chat"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter()))
    tracer, logger = tracer_provider.get_tracer("app"), logger_provider.get_logger("tests.genai", "1.0")

    with tracer.start_as_current_span("POST /chat") as root:
        with tracer.start_as_current_span("chat m1", attributes={"gen_ai.operation.name": "chat",
                                                                  "gen_ai.request.model": "m1"}) as call:
            logger.emit(event_name="gen_ai.system.message", body={"content": "You answer briefly."},
                        attributes={"gen_ai.system": "openai"})
            logger.emit(event_name="gen_ai.user.message", body={"content": "Say <b>hello</b> & bye", "role": "user"},
                        attributes={"gen_ai.system": "openai"})
            logger.emit(event_name="gen_ai.choice", body={"index": 0, "finish_reason": "stop",
                                                          "message": {"role": "assistant", "content": "hello"}})
            # Older SDKs name the event in an attribute; a record with gen_ai.* attributes only is one too.
            logger.emit(body="tool said hi", attributes={"event.name": "gen_ai.tool.message"})
            logger.emit(attributes={"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 12})
            logger.emit(body="plain application log line", severity_text="INFO")  # not GenAI: dropped
    logger.emit(event_name="gen_ai.user.message", body="outside any trace")  # no trace: dropped
    assert tracer_provider.force_flush(10_000) and logger_provider.force_flush(10_000)
    tracer_provider.shutdown()
    logger_provider.shutdown()

    trace_id = format(root.get_span_context().trace_id, "032x")
    call_id = format(call.get_span_context().span_id, "016x")
    rows = span_logs_of(project.pk)
    assert [r["event_name"] for r in rows] == ["gen_ai.system.message", "gen_ai.user.message", "gen_ai.choice",
                                               "gen_ai.tool.message", ""]
    assert {(r["trace_id"], r["span_id"], r["service"]) for r in rows} == {(trace_id, call_id, "otel-chat")}
    user_message = rows[1]
    assert json.loads(user_message["body"]) == {"content": "Say <b>hello</b> & bye", "role": "user"}
    assert user_message["attributes"]["gen_ai.system"] == "openai"
    assert user_message["attributes"]["otel.scope.name"] == "tests.genai"
    assert json.loads(rows[3]["body"]) == "tool said hi"
    assert rows[4]["attributes"]["gen_ai.usage.input_tokens"] == "12" and rows[4]["body"] == ""
    assert all(r["time_ns"] > 0 for r in rows)  # no timestamp of its own: the observed time

    # The trace's JSON lists them on the model call's span, oldest first, the body as sent.
    client.force_login(user)
    body = client.get(f"/api/v1/traces/{trace_id}", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    spans = {s["name"]: s for s in body["spans"]}
    events = spans["chat m1"]["genai_events"]
    assert [e["name"] for e in events] == [r["event_name"] for r in rows]
    assert events[1]["body"] == {"content": "Say <b>hello</b> & bye", "role": "user"}
    assert events[2]["body"]["message"]["content"] == "hello"
    assert spans["POST /chat"]["genai_events"] == [] and body["genai_events"] == []
    start = spans["chat m1"]["start_ns"]
    assert all(start <= e["time_ns"] <= start + spans["chat m1"]["duration_ns"] for e in events)


def test_protobuf_gzip_and_partial_success_names_the_record(client, project_with_key):
    project, key = project_with_key()
    now = time.time_ns()
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    kv = resource_logs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "svc"
    records = resource_logs.scope_logs.add().log_records
    good = records.add()
    good.time_unix_nano, good.event_name, good.severity_number = now, "gen_ai.assistant.message", 9
    good.trace_id, good.span_id = bytes.fromhex(TRACE), bytes.fromhex(SPAN)
    message = good.body.kvlist_value.values.add()
    message.key, message.value.string_value = "content", "<script>alert(1)</script>"
    bad = records.add()  # a GenAI event with a 3-byte span id
    bad.time_unix_nano, bad.event_name = now, "gen_ai.choice"
    bad.trace_id, bad.span_id = bytes.fromhex(TRACE), b"\x01\x02\x03"
    dropped = records.add()  # not GenAI, and its bad ids do not matter: it is not kept
    dropped.time_unix_nano, dropped.span_id = now, b"\x01"
    dropped.body.string_value = "GET /healthz 200"

    response = post(client, key, gzip.compress(request.SerializeToString()), "application/x-protobuf",
                    HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 200 and response["Content-Type"] == "application/x-protobuf"
    partial = ExportLogsServiceResponse.FromString(response.content).partial_success
    assert partial.rejected_log_records == 1
    assert partial.error_message.startswith("log record 1: spanId: expected 16 hex characters")
    (row,) = span_logs_of(project.pk)
    assert (row["event_name"], row["severity"], row["span_id"], row["service"]) == (
        "gen_ai.assistant.message", "INFO", SPAN, "svc")
    assert json.loads(row["body"]) == {"content": "<script>alert(1)</script>"}


def test_otlp_json_logs(client, project_with_key, settings):
    settings.TRACEDASH_INGEST_MAX_VALUE_BYTES = 200
    project, key = project_with_key()
    now = time.time_ns()
    records = [
        json_record(now, body={"content": "hi", "role": "user"}, severityNumber="SEVERITY_NUMBER_WARN"),
        json_record(now, span_id="", event_name="gen_ai.client.inference.operation.details",  # the trace's, no span
                    attributes={"gen_ai.input.messages": "[]"}, severityText="debug"),
        json_record(now, trace_id="XYZ"),
        json_record(now, body="x" * 300),
        json_record(0),  # neither a time nor an observed time
        json_record(now, event_name="app.started", body="booted"),  # not GenAI: accepted, dropped
        json_record(now, trace_id="0" * 32),  # GenAI, but of no trace: accepted, dropped
        json_record(0, observedTimeUnixNano=str(now + 5)),
    ]
    response = post(client, key, json_logs(*records), "application/json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "3"  # int64 is a string in OTLP JSON
    message = partial["errorMessage"]
    assert "log record 2: traceId: expected 32 hex characters" in message
    assert "log record 3: body: longer than 200 bytes" in message
    assert "log record 4: timeUnixNano:" in message
    rows = span_logs_of(project.pk)
    assert [(r["event_name"], r["span_id"], r["severity"], r["time_ns"]) for r in rows] == [
        ("gen_ai.client.inference.operation.details", "", "debug", now), ("gen_ai.user.message", SPAN, "WARN", now),
        ("gen_ai.user.message", SPAN, "", now + 5)]
    assert rows[0]["attributes"]["gen_ai.input.messages"] == "[]"
    assert rows[1]["resource_attributes"]["service.name"] == "chat-api"


def test_malformed_input_is_a_clear_json_error_and_stores_nothing(client, project_with_key):
    project, key = project_with_key()
    now = time.time_ns()
    cases = [
        (b"\x0a\xff\xff\xff\xff\x0f garbage", "application/x-protobuf", 400, "invalid_otlp", "ExportLogsServiceRequest"),
        (b'{"resourceLogs": 5}', "application/json", 400, "invalid_otlp", "resourceLogs must be a list"),
        (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [7]}]}]}', "application/json", 400, "invalid_otlp",
         "a log record is not an object"),
        (json_logs(json_record("soon")).encode(), "application/json", 400, "invalid_otlp", "timeUnixNano"),
        (json_logs(json_record(now, severityNumber="LOUD")).encode(), "application/json", 400, "invalid_otlp",
         "severityNumber"),
        (json_logs({**json_record(now), "body": {"stringValue": {"nested": 1.5}}}).encode(), "application/json", 400,
         "invalid_otlp", "stringValue must be a string"),
        (b"{not json", "application/json", 400, "invalid_otlp", "not valid JSON"),
        (b"\xff\xfe", "application/json", 400, "invalid_utf8", "UTF-8"),
        (b"{}", "text/plain", 415, "unsupported_media_type", "application/x-protobuf"),
    ]
    for body, content_type, status, code, words in cases:
        response = post(client, key, body, content_type)
        assert response.status_code == status, (body[:60], response.content[:300])
        error = response.json()["error"]
        assert error["code"] == code and words in error["message"], (body[:60], error)
    bad_gzip = post(client, key, b"not gzip", "application/json", HTTP_CONTENT_ENCODING="gzip")
    assert bad_gzip.status_code == 400 and bad_gzip.json()["error"]["code"] == "bad_gzip"
    no_key = client.post("/v1/logs", data=json_logs(json_record(now)), content_type="application/json")
    assert no_key.status_code == 401 and no_key.json()["error"]["code"]
    wrong_key = post(client, "td_000000000000_nope", json_logs(json_record(now)), "application/json")
    assert wrong_key.status_code == 401
    get = client.get("/v1/logs", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert get.status_code == 405 and get.json()["error"]["code"] == "method_not_allowed"
    assert span_logs_of(project.pk) == []
    empty = post(client, key, b"{}", "application/json")  # an empty export is valid
    assert empty.status_code == 200 and empty.json() == {}


def test_rate_limit_counts_log_records(client, project_with_key, settings):
    settings.TRACEDASH_INGEST_RATE_LIMIT = 2  # per second per key; bursts of 2 s = 4 records
    project, key = project_with_key()
    now = time.time_ns()
    assert post(client, key, json_logs(*[json_record(now + i) for i in range(3)]), "application/json").status_code == 200
    limited = post(client, key, json_logs(*[json_record(now + i) for i in range(3)]), "application/json")
    assert limited.status_code == 429 and limited["Retry-After"]
    assert len(span_logs_of(project.pk)) == 3


def test_outage_is_acknowledged_from_the_spool_and_replayed(client, project_with_key):
    project, key = project_with_key()
    now = time.time_ns()
    real = store.set_store(down_store())
    try:
        response = post(client, key, json_logs(json_record(now), json_record(now + 1)), "application/json")
        assert response.status_code == 200 and response.json() == {}
        assert get_writer().spool.pending() >= 1
    finally:
        store.set_store(real)
    spool_drained(get_writer(), timeout=30)
    assert len(span_logs_of(project.pk)) == 2


def test_trace_page_and_json_show_genai_events_escaped(client, make_user, project_with_key):
    user = make_user()
    project, key = project_with_key(members=[user])
    spans = llm_trace()
    trace_id = seed(spans, project_id=project.pk)
    by_name = {s["name"]: s for s in spans}
    inference = by_name["inference"]
    at = inference["start_time"] + 5_000_000
    records = [
        json_record(at, trace_id=trace_id, span_id=inference["span_id"], body={"content": "<b>bold</b> prompt"}),
        json_record(at + 1, trace_id=trace_id, span_id="00000000000000ff", event_name="gen_ai.choice",
                    body="<i>reply</i> of a span not arrived"),
    ]
    assert post(client, key, json_logs(*records), "application/json").json() == {}

    body = client.get(f"/api/v1/traces/{trace_id}", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    span = next(s for s in body["spans"] if s["name"] == "inference")
    assert [(e["name"], e["body"], e["time_ns"] - span["start_ns"]) for e in span["genai_events"]] == [
        ("gen_ai.user.message", {"content": "<b>bold</b> prompt"}, 5_000_000)]
    assert [(e["span_id"], e["body"]) for e in body["genai_events"]] == [
        ("00000000000000ff", "<i>reply</i> of a span not arrived")]  # its span is not in the trace

    client.force_login(user)
    page = client.get(f"/traces/{trace_id}/")
    html = page.content.decode()
    assert page.status_code == 200
    # The span's events travel in the page's JSON (json_script escapes <, > and &), the trace-level
    # ones are rendered by the template, escaped: the markup shows as text.
    assert "<b>bold</b>" not in html and "\\u003Cb\\u003Ebold\\u003C/b\\u003E prompt" in html
    assert "<i>reply</i>" not in html and "&lt;i&gt;reply&lt;/i&gt; of a span not arrived" in html
    assert 'id="trace-genai-events"' in html
    data = json.loads(html.split('<script id="trace-data" type="application/json">')[1].split("</script>")[0])
    fields = data["spans"]["fields"]
    rows = {row[fields.index("name")]: row for row in data["spans"]["rows"]}
    (event,) = rows["inference"][fields.index("genai_events")]
    assert event["body"] == {"content": "<b>bold</b> prompt"}


def test_span_logs_are_read_within_the_project(client, project_with_key):
    mine, my_key = project_with_key()
    theirs, their_key = project_with_key()
    spans = llm_trace()
    trace_id = seed(spans, project_id=mine.pk)
    at = spans[0]["start_time"]
    # The other project sends an event with the same trace id: never shown in mine.
    post(client, their_key, json_logs(json_record(at, trace_id=trace_id, span_id=spans[0]["span_id"])),
         "application/json")
    body = client.get(f"/api/v1/traces/{trace_id}", HTTP_AUTHORIZATION=f"Bearer {my_key}").json()
    assert all(s["genai_events"] == [] for s in body["spans"]) and body["genai_events"] == []
    assert len(span_logs_of(theirs.pk)) == 1 and span_logs_of(mine.pk) == []
