"""Scores in: ``POST /api/v1/scores`` (bad input named per field with nothing written, duplicates
counted once, late scores on old traces, projects kept apart), the reader ``analytics.scores``, and
the OTel convention (span attributes ``tracedash.score.<name>`` and events ``tracedash.score``)
through the real OpenTelemetry SDK exporter and the native span API."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from analytics.scores import scores_for_traces, trace_scores
from ingest.scores import derived_score_id
from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

TRACE = "a" * 32
SPAN = "b" * 16
DAY_NS = 86_400 * 10**9


def _post(url: str, key: str, body, *, path="/api/v1/scores") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _raw_count(project_id: int) -> int:
    return get_store().query("SELECT count() FROM scores WHERE project_id = {p:UInt64}", {"p": project_id},
                             tag="tests.scores").scalar()


def _score(**over) -> dict:
    return {"trace_id": TRACE, "name": "quality", "value": 4, **over}


@pytest.mark.parametrize("score, field, words", [
    (_score(trace_id="xyz"), "trace_id", "matching regex"),
    (_score(trace_id="0" * 32), "trace_id", "all zero"),
    (_score(span_id="123"), "span_id", "matching regex"),
    (_score(name=""), "name", "length"),
    (_score(name="n" * 201), "name", "length"),
    (_score(name="   "), "name", "non-empty"),
    ({"trace_id": TRACE, "value": 1}, "name", "missing required field"),
    ({"trace_id": TRACE, "name": "q"}, "value", "missing required field"),
    (_score(value=None), "value", "got `null`"),
    (_score(value=[1, 2]), "value", "Expected"),
    (_score(value={"a": 1}), "value", "Expected"),
    (_score(value=""), "value", "non-empty"),
    (_score(value="x" * 300), "value", "at most"),
    (_score(data_type="boolean"), "data_type", "does not fit"),
    (_score(value=True, data_type="numeric"), "data_type", "does not fit"),
    (_score(value="good", data_type="numeric"), "data_type", "does not fit"),
    (_score(data_type="stars"), "data_type", "expected one of"),
    (_score(source="human"), "source", "expected one of"),
    (_score(comment=7), "comment", "Expected"),
    (_score(comment="c" * 5000), "comment", "length"),
    (_score(author="a" * 300), "author", "length"),
    (_score(id=""), "id", "length"),
    (_score(time="yesterday"), "time", "RFC 3339"),
    (_score(time=5), "time", "outside"),
])
def test_bad_scores_are_refused_naming_the_field_and_nothing_is_written(asgi_server, project_with_key, score, field,
                                                                         words):
    project, key = project_with_key()
    status, body = _post(asgi_server.url, key, {"scores": [score]})
    assert status == 400, body
    assert body["error"]["code"] == "invalid_scores"
    detail = body["error"]["details"][0]
    assert detail["index"] == 0 and detail["field"] == field and words in detail["message"], detail
    assert _raw_count(project.pk) == 0


def test_nan_and_infinity_are_refused(asgi_server, project_with_key):
    project, key = project_with_key()
    status, body = _post(asgi_server.url, key, b'{"scores": [{"trace_id": "' + TRACE.encode() + b'", "name": "q", "value": NaN}]}')
    assert status == 400 and body["error"]["code"] == "invalid_json", body
    # 1e999 is valid JSON that decodes to infinity: refused naming the value.
    status, body = _post(asgi_server.url, key, b'{"scores": [{"trace_id": "' + TRACE.encode() + b'", "name": "q", "value": 1e999}]}')
    assert status == 400 and body["error"]["details"][0]["field"] == "value", body
    assert "out of range" in body["error"]["details"][0]["message"]
    assert _raw_count(project.pk) == 0


@pytest.mark.parametrize("body, status, code", [
    (b"not json", 400, "invalid_json"),
    ({"score": []}, 400, "invalid_payload"),
    ({"scores": {}}, 400, "invalid_payload"),
])
def test_bad_envelopes(asgi_server, project_with_key, body, status, code):
    _, key = project_with_key()
    got, answer = _post(asgi_server.url, key, body)
    assert got == status and answer["error"]["code"] == code, answer


def test_a_wrong_key_is_401_and_a_get_405(asgi_server):
    status, answer = _post(asgi_server.url, "td_nope_nope", {"scores": [_score()]})
    assert status == 401, answer
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(asgi_server.url + "/api/v1/scores", timeout=30)
    assert caught.value.code in (401, 405)


def test_too_many_scores_is_413(asgi_server, project_with_key, settings):
    settings.TRACEDASH_INGEST_MAX_SPANS = 3
    project, key = project_with_key()
    status, answer = _post(asgi_server.url, key, {"scores": [_score(name=f"s{i}") for i in range(4)]})
    assert status == 413 and answer["error"]["code"] == "too_many_items", answer
    assert _raw_count(project.pk) == 0


# A given time a day ago, to the millisecond: older than the retention, a score is dropped by the
# table's TTL (a fixed date in the test expired once the calendar passed it).
GIVEN_MS = (int(time.time()) - 86400) * 1000 + 123
GIVEN_TIME = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(GIVEN_MS // 1000)) + ".123Z"


def test_a_batch_stores_the_good_scores_and_names_the_bad_ones(asgi_server, project_with_key):
    project, key = project_with_key()
    status, body = _post(asgi_server.url, key, {"scores": [
        _score(value=4.5, comment="<b>fine</b>", author="ana"),
        _score(name="correct", value=True, span_id=SPAN, source="eval"),
        _score(name="flavour", value="terse", source="sdk", time=GIVEN_TIME),
        _score(name="bad", value="x", data_type="numeric"),
    ]})
    assert status == 200, body
    assert body["accepted"] == 3
    assert body["rejected"] == [{"index": 3, "field": "data_type", "message": body["rejected"][0]["message"]}]
    scores = {s["name"]: s for s in trace_scores(project_id=project.pk, trace_id=TRACE)}
    assert set(scores) == {"quality", "correct", "flavour"}
    quality = scores["quality"]
    assert (quality["data_type"], quality["value"], quality["source"], quality["author"], quality["comment"],
            quality["span_id"]) == ("numeric", 4.5, "api", "ana", "<b>fine</b>", "")
    assert quality["id"] == derived_score_id(TRACE, "", "quality", "api", "ana")
    assert (scores["correct"]["data_type"], scores["correct"]["value"], scores["correct"]["span_id"],
            scores["correct"]["source"]) == ("boolean", True, SPAN, "eval")
    assert (scores["flavour"]["data_type"], scores["flavour"]["value"]) == ("categorical", "terse")
    assert scores["flavour"]["time_ms"] == GIVEN_MS
    assert abs(quality["time_ms"] - time.time() * 1000) < 600_000  # no time sent: now


def test_duplicates_are_counted_once(asgi_server, project_with_key):
    project, key = project_with_key()
    # The same id sent twice (a retried request), and a derived id (no id: same trace, span, name,
    # source and author) sent twice with a new value: one score each, the later value kept.
    for value in (3, 5):
        status, body = _post(asgi_server.url, key, {"scores": [
            _score(id="run-42/quality", value=value, source="eval"),
            _score(name="helpful", value=value == 5, author="bo"),
        ]})
        assert status == 200 and body["accepted"] == 2, body
    scores = trace_scores(project_id=project.pk, trace_id=TRACE)
    assert sorted((s["name"], s["id"], s["value"]) for s in scores) == [
        ("helpful", derived_score_id(TRACE, "", "helpful", "api", "bo"), True),
        ("quality", "run-42/quality", 5.0),
    ]
    # A different author is another score, not a replacement.
    _post(asgi_server.url, key, {"scores": [_score(name="helpful", value=False, author="cy")]})
    assert len(trace_scores(project_id=project.pk, trace_id=TRACE)) == 3


def test_a_late_score_on_a_trace_20_days_old_lands(asgi_server, project_with_key):
    project, key = project_with_key()
    old_ns = time.time_ns() - 20 * DAY_NS
    trace = "c" * 32
    status, body = _post(asgi_server.url, key, {"spans": [{
        "trace_id": trace, "span_id": SPAN, "name": "old request", "start_time": old_ns, "duration_ms": 120}]},
        path="/api/v1/traces")
    assert status == 200 and body["accepted"] == 1, body
    status, body = _post(asgi_server.url, key, {"scores": [{"trace_id": trace, "name": "quality", "value": 2,
                                                            "comment": "looked again today"}]})
    assert status == 200 and body["accepted"] == 1, body
    [score] = trace_scores(project_id=project.pk, trace_id=trace)
    assert score["value"] == 2.0 and score["comment"] == "looked again today"


def test_another_projects_key_neither_reads_nor_overwrites(asgi_server, project_with_key):
    mine, my_key = project_with_key()
    theirs, their_key = project_with_key()
    assert _post(asgi_server.url, my_key, {"scores": [_score(id="s-1", value=5)]})[0] == 200
    # Their key writes into their project only, even with my trace id and my score id.
    assert _post(asgi_server.url, their_key, {"scores": [_score(id="s-1", value=1)]})[0] == 200
    [my_score] = trace_scores(project_id=mine.pk, trace_id=TRACE)
    [their_score] = trace_scores(project_id=theirs.pk, trace_id=TRACE)
    assert my_score["value"] == 5.0 and their_score["value"] == 1.0
    assert scores_for_traces(project_id=mine.pk + theirs.pk + 1000, trace_ids=[TRACE]) == {}


def test_the_trace_json_carries_its_scores_for_its_own_key_only(asgi_server, project_with_key):
    mine, my_key = project_with_key()
    _, their_key = project_with_key()
    trace = "f0" * 16
    assert _post(asgi_server.url, my_key, {"spans": [{"trace_id": trace, "span_id": SPAN, "name": "r",
                                                       "start_time": time.time_ns(), "duration_ms": 4}]},
                 path="/api/v1/traces")[0] == 200
    assert _post(asgi_server.url, my_key, {"scores": [_score(trace_id=trace, comment="mine")]})[0] == 200

    def get(key):
        request = urllib.request.Request(f"{asgi_server.url}/api/v1/traces/{trace}",
                                         headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = get(my_key)
    assert status == 200 and [(s["name"], s["value"], s["comment"]) for s in body["scores"]] == [
        ("quality", 4.0, "mine")]
    status, body = get(their_key)
    assert status == 404 and b"mine" not in json.dumps(body).encode()


def test_scores_for_traces_groups_by_trace(asgi_server, project_with_key):
    project, key = project_with_key()
    other = "d" * 32
    _post(asgi_server.url, key, {"scores": [_score(), _score(trace_id=other, value=1), _score(trace_id=other, name="x",
                                                                                             value="ok")]})
    found = scores_for_traces(project_id=project.pk, trace_ids=[TRACE, other, "e" * 32])
    assert set(found) == {TRACE, other} and len(found[other]) == 2
    assert scores_for_traces(project_id=project.pk, trace_ids=[]) == {}


# --- the OTel convention --------------------------------------------------------------------------
def test_otel_score_attributes_and_events_through_the_official_exporter(asgi_server, project_with_key):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    project, key = project_with_key()
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-scores"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=f"{asgi_server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})))
    tracer = provider.get_tracer("tests.scores")
    with tracer.start_as_current_span("answer", attributes={
            "tracedash.score.quality": 4.5, "tracedash.score.grounded": True,
            "tracedash.score.tone": "friendly"}) as span:
        span.add_event("tracedash.score", {"name": "judge.correct", "value": False, "comment": "<i>wrong city</i>",
                                           "author": "gpt-judge"})
        span.add_event("unrelated", {"name": "x"})
        trace_id = format(span.get_span_context().trace_id, "032x")
        span_id = format(span.get_span_context().span_id, "016x")
    with tracer.start_as_current_span("plain"):
        pass
    assert provider.force_flush(30_000)
    provider.shutdown()

    scores = {s["name"]: s for s in trace_scores(project_id=project.pk, trace_id=trace_id)}
    assert set(scores) == {"quality", "grounded", "tone", "judge.correct"}
    assert all(s["span_id"] == span_id and s["source"] == "sdk" for s in scores.values())
    assert (scores["quality"]["data_type"], scores["quality"]["value"]) == ("numeric", 4.5)
    assert (scores["grounded"]["data_type"], scores["grounded"]["value"]) == ("boolean", True)
    assert (scores["tone"]["data_type"], scores["tone"]["value"]) == ("categorical", "friendly")
    judge = scores["judge.correct"]
    assert (judge["value"], judge["comment"], judge["author"]) == (False, "<i>wrong city</i>", "gpt-judge")
    spans = get_store().query("SELECT name FROM spans WHERE project_id = {p:UInt64} ORDER BY name", {"p": project.pk},
                              tag="tests.scores").dicts()
    assert [s["name"] for s in spans] == ["answer", "plain"]


def test_native_span_attributes_follow_the_same_convention_and_a_bad_score_rejects_its_span(asgi_server,
                                                                                             project_with_key):
    project, key = project_with_key()
    now = time.time_ns()
    status, body = _post(asgi_server.url, key, {"spans": [
        {"trace_id": TRACE, "span_id": SPAN, "name": "ok", "start_time": now, "duration_ms": 5,
         "attributes": {"tracedash.score.quality": 3, "other": "x"},
         "events": [{"name": "tracedash.score", "time": now + 1000, "attributes": {"name": "tone", "value": "dry"}}]},
        {"trace_id": TRACE, "span_id": "c" * 16, "name": "bad", "start_time": now, "duration_ms": 5,
         "attributes": {"tracedash.score.quality": "NaN"}},
        {"trace_id": TRACE, "span_id": "d" * 16, "name": "bad event", "start_time": now, "duration_ms": 5,
         "events": [{"name": "tracedash.score", "time": now, "attributes": {"value": 1}}]},
    ]}, path="/api/v1/traces")
    assert status == 200, body
    assert body["accepted"] == 1
    assert [(r["index"], r["field"]) for r in body["rejected"]] == [
        (1, "attributes.tracedash.score.quality"), (2, "events[0].attributes.name")]
    scores = {s["name"]: s for s in trace_scores(project_id=project.pk, trace_id=TRACE)}
    assert {n: (s["value"], s["span_id"]) for n, s in scores.items()} == {"quality": (3.0, SPAN), "tone": ("dry", SPAN)}
    spans = get_store().query("SELECT name FROM spans WHERE project_id = {p:UInt64}", {"p": project.pk},
                              tag="tests.scores").dicts()
    assert [s["name"] for s in spans] == ["ok"]  # the rejected spans' scores and the spans: neither written


# --- durability -----------------------------------------------------------------------------------
def test_scores_sent_during_an_outage_are_spooled_and_replayed(client, project_with_key):
    import store
    from ingest.writer import get_writer
    from tests.conftest import spool_drained
    from tests.test_ingest_durability import down_store

    project, key = project_with_key()
    trace = "e" * 32
    spans = [{"trace_id": trace, "span_id": SPAN, "name": "scored", "start_time": time.time_ns(), "duration_ms": 3,
              "attributes": {"tracedash.score.quality": 5}}]
    real = store.set_store(down_store())
    try:
        response = client.post("/api/v1/scores", data=json.dumps({"scores": [_score(trace_id=trace, name="late")]}),
                               content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 200 and response.json()["accepted"] == 1, response.content
        response = client.post("/api/v1/traces", data=json.dumps({"spans": spans}), content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {key}")
        assert response.status_code == 200 and response.json()["accepted"] == 1, response.content
        assert get_writer().spool.pending() >= 2
    finally:
        store.set_store(real)
    spool_drained(get_writer(), timeout=60)
    scores = {s["name"]: s["value"] for s in trace_scores(project_id=project.pk, trace_id=trace)}
    assert scores == {"late": 4.0, "quality": 5.0}
