"""The thin end-to-end slice: POST /api/v1/traces -> ClickHouse -> GET /traces/."""

from __future__ import annotations

import gzip
import json

import pytest

from analytics.summarizer import traces_summarize
from store import get_store
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def post_spans(client, key, payload, **extra):
    body = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    headers.update(extra)
    content_type = headers.pop("content_type", "application/json")
    return client.post("/api/v1/traces", data=body, content_type=content_type, **headers)


def stored_spans(project_id=None):
    sql = "SELECT count() FROM spans" + (" WHERE project_id = {p:UInt64}" if project_id else "")
    return get_store().query(sql, {"p": project_id} if project_id else None, tag="tests.count").scalar()


def test_posted_spans_show_up_on_the_traces_page(client, project_with_key, make_user):
    alice = make_user("alice")
    project, key = project_with_key("shop", members=[alice])
    spans = llm_trace(service="checkout", name="POST /chat")
    response = post_spans(client, key, {"spans": spans})
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 5, "rejected": []}
    assert stored_spans(project.pk) == 5
    traces_summarize()  # the beat task that fills the explorer's summaries

    client.force_login(alice)
    page = client.get("/traces/")
    assert page.status_code == 200
    html = page.content.decode()
    trace_id = spans[0]["trace_id"]
    assert trace_id in html and "POST /chat" in html and "checkout" in html
    row = html[html.index(f'data-trace-id="{trace_id}"'):]
    row = row[: row.index("</tr>")]
    assert "1200.0 ms" in row  # E2E is the root span's duration
    assert '<td class="num">5</td>' in row  # span count


def test_spans_sent_with_project_a_key_are_invisible_to_a_member_of_project_b(client, project_with_key, make_user):
    alice, bob = make_user("alice"), make_user("bob")
    project_a, key_a = project_with_key("a", members=[alice])
    project_b, _ = project_with_key("b", members=[bob])
    spans = llm_trace(name="secret-a-request")
    # The payload cannot pick its project: the key decides.
    for span in spans:
        span["project_id"] = project_b.pk
    assert post_spans(client, key_a, {"spans": spans}).status_code == 200
    assert stored_spans(project_a.pk) == 5 and stored_spans(project_b.pk) == 0
    traces_summarize()

    client.force_login(bob)
    assert "secret-a-request" not in client.get("/traces/").content.decode()
    assert client.get(f"/traces/?project={project_a.pk}").status_code == 404  # not a member: not found
    client.force_login(alice)
    assert "secret-a-request" in client.get("/traces/").content.decode()


def test_pages_require_login(client):
    response = client.get("/traces/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_partial_acceptance_lists_rejected_spans_by_index(client, project_with_key):
    project, key = project_with_key()
    good = llm_trace()
    bad = [
        {**good[1], "span_id": "XYZ"},
        {**good[2], "phase": "thinking"},
        {**good[3], "start_time": "yesterday"},
        {**good[4], "duration_ms": -5},
        {k: v for k, v in good[1].items() if k != "duration_ms"},
    ]
    response = post_spans(client, key, {"spans": [good[0], *bad]})
    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] == 1
    assert [(r["index"], r["field"]) for r in body["rejected"]] == [
        (1, "span_id"), (2, "phase"), (3, "start_time"), (4, "duration_ms"), (5, "end_time")]
    assert all(r["message"] for r in body["rejected"])
    assert stored_spans(project.pk) == 1


def test_a_fully_rejected_batch_is_400_and_stores_nothing(client, project_with_key):
    project, key = project_with_key()
    response = post_spans(client, key, {"spans": [{"trace_id": "nope"}, 7]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_spans"
    assert [d["field"] for d in error["details"]] == ["trace_id", "span"]
    assert stored_spans(project.pk) == 0


@pytest.mark.parametrize(
    "key, body, extra, status, code",
    [
        (None, {"spans": []}, {}, 401, "missing_key"),
        ("td_000000000000_nope", {"spans": []}, {}, 401, "invalid_key"),
        ("KEY", {"spans": []}, {"HTTP_AUTHORIZATION": "Basic abc"}, 401, "bad_authorization"),
        ("KEY", "{not json", {}, 400, "invalid_json"),
        ("KEY", b"\xff\xfe{}", {}, 400, "invalid_utf8"),
        ("KEY", "[]", {}, 400, "invalid_payload"),
        ("KEY", {"spans": {"a": 1}}, {}, 400, "invalid_payload"),
        ("KEY", {"spans": []}, {"content_type": "text/plain"}, 415, "unsupported_media_type"),
        ("KEY", "[" * 100000 + "]" * 100000, {}, 400, "invalid_payload"),
        ("KEY", '{"spans": [' + "[" * 100000 + "]" * 100000 + "]}", {}, 400, "invalid_json"),
    ],
)
def test_bad_requests_get_json_errors_naming_the_problem(client, project_with_key, key, body, extra, status, code):
    _, real_key = project_with_key()
    response = post_spans(client, real_key if key == "KEY" else key, body, **extra)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_gzip_bodies_are_accepted_and_bombs_refused(client, project_with_key, settings):
    project, key = project_with_key()
    body = gzip.compress(json.dumps({"spans": llm_trace()}).encode())
    assert post_spans(client, key, body, HTTP_CONTENT_ENCODING="gzip").status_code == 200
    assert stored_spans(project.pk) == 5

    settings.TRACEDASH_INGEST_MAX_BODY_BYTES = 1_000_000
    bomb = gzip.compress(b"{" + b" " * 50_000_000 + b"}")  # 50 MB of spaces in ~50 kB
    response = post_spans(client, key, bomb, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    truncated = post_spans(client, key, body[: len(body) // 2], HTTP_CONTENT_ENCODING="gzip")
    assert truncated.status_code == 400 and truncated.json()["error"]["code"] == "bad_gzip"
    assert post_spans(client, key, body, HTTP_CONTENT_ENCODING="br").status_code == 415


def test_fields_are_stored_as_sent(client, project_with_key):
    project, key = project_with_key()
    spans = llm_trace(model="llama-3-70b")
    spans[0]["start_time"] = "2026-11-30T01:02:03.123456789Z"
    spans[0]["end_time"] = "2026-11-30T01:02:04.5Z"
    del spans[0]["duration_ms"]
    spans[0]["attributes"] = {"nested": {"k": 1, "flag": True}, "list": [1, "a"], "xss": "<script>alert(1)</script>"}
    assert post_spans(client, key, {"spans": spans[:1] + spans[3:4]}).json()["accepted"] == 2
    rows = {r["phase"]: r for r in get_store().query(
        "SELECT phase, toUnixTimestamp64Nano(start_time) AS ns, duration_ns, attributes, ttft_ns, input_tokens,"
        " output_tokens, cost_usd, model, event_names FROM spans WHERE project_id = {p:UInt64}",
        {"p": project.pk}, tag="tests.read").dicts()}
    root, inference = rows["other"], rows["inference"]
    assert root["ns"] % 10**9 == 123_456_789 and root["duration_ns"] == 1_376_543_211
    assert root["attributes"] == {"nested.k": "1", "nested.flag": "true", "list": '[1,"a"]',
                                  "xss": "<script>alert(1)</script>"}
    assert root["ttft_ns"] is None and root["cost_usd"] is None
    assert inference["ttft_ns"] == 210_500_000 and inference["model"] == "llama-3-70b"
    assert (inference["input_tokens"], inference["output_tokens"], inference["cost_usd"]) == (812, 164, 0.00042)
    assert inference["event_names"] == ["first_token"]


def test_user_strings_are_escaped_on_the_page(client, project_with_key, make_user):
    alice = make_user()
    _, key = project_with_key(members=[alice])
    spans = llm_trace(name='"><img src=x onerror=alert(1)>', service="<script>alert(2)</script>")
    post_spans(client, key, {"spans": spans})
    traces_summarize()
    client.force_login(alice)
    html = client.get("/traces/").content.decode()
    assert "<img src=x" not in html and "<script>alert(2)" not in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
