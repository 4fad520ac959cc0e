"""The trace selector, its JSON endpoint and the comparison: scoping, dedup, orphans, skew."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from store import get_store
from dashboard.trace_detail import endpoint_p50, endpoint_recent_traces, trace_get, trace_json
from tests.spans import llm_trace, span_id, trace_id
from tests.trace_seed import insert_spans, seed, summarise

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
MS = 1_000_000


def _by_name(detail):
    return {s.name: s for s in detail.spans}


def test_trace_get_returns_tree_figures_and_critical_path(project_with_key):
    project, _ = project_with_key()
    spans = llm_trace()
    tid = seed(spans, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    assert detail is not None
    assert [s.name for s in detail.spans] == ["chat", "network", "preprocess", "inference", "postprocess"]
    assert [s.depth for s in detail.spans] == [0, 1, 1, 1, 1]
    s = detail.summary
    assert s.e2e_ns == 1200 * MS and s.ttft_ns == int(210.5 * MS)
    assert s.phase_ns["inference"] == 900 * MS and s.phase_ns["network"] == 80 * MS
    assert (s.input_tokens, s.output_tokens) == (812, 164)
    by_name = _by_name(detail)
    assert by_name["chat"].self_ns == (1200 - 1160) * MS  # root minus its children
    assert by_name["chat"].attributes == {"http.route": "/v1/chat", "user.tier": "pro"}
    assert by_name["inference"].events[0]["name"] == "first_token"
    assert by_name["inference"].events[0]["time_ns"] == spans[3]["start_time"] + 210 * MS
    import gc

    assert gc.isenabled()  # paused while the trace was built, and back on
    # All five are on the critical path: the phases run one after another.
    assert {seg[0] for seg in detail.critical_path} == {sp.span_id for sp in detail.spans}
    assert sum(hi - lo for _, lo, hi in detail.critical_path) == 1200 * MS
    assert detail.flags and "Inference is 75%" in detail.flags[0]


def test_unknown_or_malformed_id_is_none(project_with_key):
    project, _ = project_with_key()
    seed(llm_trace(), project_id=project.pk)
    assert trace_get(project_id=project.pk, trace_id=trace_id()) is None
    assert trace_get(project_id=project.pk, trace_id="not-a-trace") is None
    assert trace_get(project_id=project.pk, trace_id="A" * 32) is None  # ids are lowercase


def test_other_projects_trace_is_not_found(project_with_key):
    mine, _ = project_with_key()
    theirs, _ = project_with_key()
    tid = seed(llm_trace(), project_id=theirs.pk)
    assert trace_get(project_id=theirs.pk, trace_id=tid) is not None
    assert trace_get(project_id=mine.pk, trace_id=tid) is None


def test_resent_spans_are_deduplicated_latest_copy_wins(project_with_key):
    project, _ = project_with_key()
    spans = llm_trace()
    insert_spans(spans, project_id=project.pk)
    time.sleep(0.01)  # a later ingested_at
    resent = [dict(sp) for sp in spans]
    resent[4]["name"] = "postprocess (retried)"
    insert_spans(resent, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=spans[0]["trace_id"])
    assert len(detail.spans) == 5 and detail.summary.span_count == 5
    assert "postprocess (retried)" in _by_name(detail)
    assert detail.summary.input_tokens == 812  # not doubled


def test_a_span_twice_in_one_insert_is_stored_twice_and_read_once(project_with_key):
    """Inserts skip ClickHouse's optimize_on_insert (store.backends.SESSION_SETTINGS): the copies of
    a span in one insert (a client's retry inside one batch, two grouped requests) stay apart until
    a merge, as copies from separate inserts always did, and every reader takes one."""
    project, _ = project_with_key()
    spans = llm_trace()
    tid = spans[0]["trace_id"]
    insert_spans(spans + [dict(sp) for sp in spans], project_id=project.pk)  # one insert
    stored = get_store().query("SELECT count() FROM spans WHERE project_id = {p:UInt64} AND trace_id = {t:FixedString(32)}",
                               {"p": project.pk, "t": tid}, tag="tests.count").scalar()
    assert stored == 10  # not merged on insert
    summarise(tid, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    assert len(detail.spans) == 5 and detail.summary.span_count == 5
    assert detail.summary.input_tokens == 812  # not doubled


def test_found_without_a_summary_row_and_with_one(project_with_key):
    project, _ = project_with_key()
    spans = llm_trace()
    tid = seed(spans, project_id=project.pk, summary=False)
    assert trace_get(project_id=project.pk, trace_id=tid).summary.span_count == 5
    seed(llm_trace(), project_id=project.pk)  # another trace, summarised
    summarise(tid, project_id=project.pk)
    assert trace_get(project_id=project.pk, trace_id=tid).summary.span_count == 5


def test_orphans_extra_roots_and_clock_skew_are_kept_and_marked(project_with_key):
    project, _ = project_with_key()
    tid, root, child = trace_id(), span_id(), span_id()
    start = time.time_ns() - 10_000_000_000
    spans = [
        {"trace_id": tid, "span_id": root, "parent_span_id": None, "name": "root", "phase": "other",
         "service": "api", "start_time": start, "duration_ms": 100},
        # clock skew: starts 5 ms before its parent and ends 20 ms after it
        {"trace_id": tid, "span_id": child, "parent_span_id": root, "name": "skewed", "phase": "network",
         "service": "edge", "start_time": start - 5 * MS, "duration_ms": 125},
        {"trace_id": tid, "span_id": span_id(), "parent_span_id": span_id(), "name": "lost child", "phase": "inference",
         "service": "llm", "start_time": start + 10 * MS, "duration_ms": 30},
        {"trace_id": tid, "span_id": span_id(), "parent_span_id": None, "name": "second root", "phase": "other",
         "service": "api", "start_time": start + 1 * MS, "duration_ms": 2},
    ]
    seed(spans, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    by_name = _by_name(detail)
    assert [s.name for s in detail.spans] == ["root", "skewed", "second root", "lost child"]
    assert by_name["lost child"].orphan and by_name["lost child"].depth == 0
    assert by_name["second root"].extra_root and not by_name["second root"].orphan
    assert not by_name["root"].orphan and not by_name["skewed"].orphan
    assert by_name["skewed"].skew_note.startswith("starts 5.0 ms before its parent; ends 20.0 ms after its parent")
    assert by_name["skewed"].start_ns == start - 5 * MS  # drawn where it was reported
    assert by_name["root"].skew_note == ""
    assert detail.summary.e2e_ns == 100 * MS and detail.summary.has_root


def test_critical_path_marks_spans_through_their_children_and_skips_parallel_ones(project_with_key):
    project, _ = project_with_key()
    tid, root, a, a1, b = trace_id(), span_id(), span_id(), span_id(), span_id()
    start = time.time_ns() - 10_000_000_000

    def sp(sid, parent, name, at, dur):
        return {"trace_id": tid, "span_id": sid, "parent_span_id": parent, "name": name, "phase": "network",
                "service": "api", "start_time": start + at * MS, "duration_ms": dur}

    seed([sp(root, None, "root", 0, 100), sp(a, root, "a", 0, 80), sp(a1, a, "a1", 0, 80), sp(b, root, "b", 10, 40)],
         project_id=project.pk)
    by_name = _by_name(trace_get(project_id=project.pk, trace_id=tid))
    assert by_name["a1"].critical_ns == 80 * MS and by_name["a1"].on_critical_path
    assert by_name["a"].critical_ns == 0 and by_name["a"].on_critical_path  # through its child
    assert by_name["root"].critical_ns == 20 * MS
    assert by_name["b"].critical_ns == 0 and not by_name["b"].on_critical_path  # ran in parallel, finished first


def _client(client, user):
    client.force_login(user)
    return client


def test_api_by_key_and_by_session_is_scoped(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, my_key = project_with_key(members=[alice])
    theirs, their_key = project_with_key(members=[bob])
    tid = seed(llm_trace(), project_id=mine.pk)
    url = reverse("dashboard:trace-api", args=[tid])

    ok = client.get(url, HTTP_AUTHORIZATION=f"Bearer {my_key}")
    assert ok.status_code == 200
    body = ok.json()
    assert body["trace_id"] == tid and body["project_id"] == mine.pk
    assert set(body) == {"trace_id", "project_id", "summary", "phases", "flags", "critical_path", "spans",
                         "genai_events", "scores"}  # as in OpenAPI
    assert body["summary"]["e2e_ns"] == 1200 * MS and len(body["spans"]) == 5
    assert {p["phase"] for p in body["phases"]} == {"network", "preprocess", "inference", "postprocess", "other"}
    assert body["critical_path"][-1]["span_id"] == body["spans"][0]["span_id"]  # the root's own last 40 ms

    columns = client.get(url + "?spans=columns", HTTP_AUTHORIZATION=f"Bearer {my_key}").json()["spans"]
    assert [dict(zip(columns["fields"], row)) for row in columns["rows"]] == body["spans"]

    other = client.get(url, HTTP_AUTHORIZATION=f"Bearer {their_key}")
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    assert client.get(url).status_code == 401  # no key, no session
    assert client.get(url, HTTP_AUTHORIZATION="Bearer td_nope").json()["error"]["code"] == "invalid_key"

    assert _client(client, alice).get(url).json()["trace_id"] == tid
    client.logout()
    assert _client(client, bob).get(url).status_code == 404
    assert client.get(url + f"?project={mine.pk}").status_code == 404  # not bob's project
    from django.test import Client

    post = Client(enforce_csrf_checks=True).post(url, HTTP_AUTHORIZATION=f"Bearer {my_key}")
    assert post.status_code == 405 and post.json()["error"]["code"] == "method_not_allowed" and post["Allow"] == "GET, HEAD"
    bad = client.get(reverse("dashboard:trace-api", args=["xyz"]))
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["field"] == "trace_id"


def test_trace_page_is_scoped_to_members(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    project_with_key(members=[bob])
    tid = seed(llm_trace(name="checkout <b>"), project_id=mine.pk)
    url = reverse("dashboard:trace", args=[tid])
    assert client.get(url).status_code == 302  # to the login page
    page = _client(client, alice).get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "checkout &lt;b&gt;" in html and "checkout <b>" not in html.split('id="trace-data"')[0]
    assert "Inference is 75%" in html
    client.logout()
    assert _client(client, bob).get(url).status_code == 404
    assert client.get(reverse("dashboard:trace", args=[trace_id()])).status_code == 404


def test_trace_json_is_json_serialisable_and_round_trips(project_with_key):
    import json

    project, _ = project_with_key()
    tid = seed(llm_trace(error=True), project_id=project.pk)
    body = json.loads(json.dumps(trace_json(trace_get(project_id=project.pk, trace_id=tid))))
    assert body["summary"]["status"] == "error" and body["summary"]["error_message"] == "upstream timeout"


def test_compare_two_traces_and_against_endpoint_p50(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    fast = llm_trace(name="chat")
    slow = llm_trace(name="chat")
    slow[3]["duration_ms"] = 1800  # inference 900 -> 1800 ms, and the root 1200 -> 2100 ms
    slow[0]["duration_ms"] = 2100
    slow[3]["cost_usd"] = 0.00054  # $0.00042 -> $0.00054
    a, b = seed(fast, project_id=project.pk), seed(slow, project_id=project.pk)
    for _ in range(3):
        seed(llm_trace(name="chat"), project_id=project.pk)
    seed(llm_trace(name="other-endpoint"), project_id=project.pk)

    recent = endpoint_recent_traces(project_id=project.pk, trace_id=a, service="chat-api", root_name="chat")
    assert len(recent) == 4 and a not in {t.trace_id for t in recent} and b in {t.trace_id for t in recent}
    assert [t.start_ns for t in recent] == sorted((t.start_ns for t in recent), reverse=True)
    other, _ = project_with_key()
    assert endpoint_recent_traces(project_id=other.pk, trace_id=a, service="chat-api", root_name="chat") == []

    baseline = endpoint_p50(project_id=project.pk, service="chat-api", root_name="chat")
    assert baseline.traces == 5
    assert baseline.figures["inference_ns"] == 900 * MS and baseline.figures["e2e_ns"] == 1200 * MS

    _client(client, alice)
    page = client.get(reverse("dashboard:trace-compare"), {"a": a, "b": b})
    assert page.status_code == 200
    rows = {r["figure"]: r for r in page.context["rows"]}
    assert rows["e2e_ns"]["a"] == 1200 and rows["e2e_ns"]["b"] == 2100 and rows["e2e_ns"]["diff"] == 900
    assert rows["inference_ns"]["diff"] == 900 and rows["inference_ns"]["percent"] == 100.0
    assert rows["network_ns"]["diff"] == 0
    html = page.content.decode()
    cost_row = html[html.index('<tr data-figure="cost_usd">'):]
    cost_row = cost_row[:cost_row.index("</tr>")]
    assert '<td class="a">$0.00042</td>' in cost_row and '<td class="b">$0.00054</td>' in cost_row  # the one money format
    assert '>+$0.00012</td>' in cost_row
    back = client.get(reverse("dashboard:trace-compare"), {"a": b, "b": a}).content.decode()
    assert '>-$0.00012</td>' in back[back.index('<tr data-figure="cost_usd">'):]

    p50 = client.get(reverse("dashboard:trace-compare"), {"a": b, "b": "p50"})
    rows = {r["figure"]: r for r in p50.context["rows"]}
    assert rows["inference_ns"]["a"] == 900 and rows["inference_ns"]["b"] == 1800  # baseline first
    assert rows["inference_ns"]["percent"] == 100.0
    assert "P50 of chat-api · chat" in p50.content.decode()

    assert client.get(reverse("dashboard:trace-compare"), {"a": "nope"}).status_code == 400
    assert client.get(reverse("dashboard:trace-compare"), {"a": trace_id()}).status_code == 404


def test_cost_is_estimated_from_the_price_table_and_marked(client, make_user, project_with_key):
    from analytics.prices import model_price_set

    alice = make_user()
    project, _ = project_with_key(members=[alice])
    spans = llm_trace(model="llama-3-70b")
    del spans[3]["cost_usd"]  # 812 input, 164 output tokens, no cost sent
    model_price_set(project_id=project.pk, model="llama-3-70b", input_usd_per_million="1", output_usd_per_million="10")
    tid = seed(spans, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    assert detail.summary.cost_estimated
    assert detail.summary.cost_usd == pytest.approx((812 * 1 + 164 * 10) / 1e6)
    html = _client(client, alice).get(reverse("dashboard:trace", args=[tid])).content.decode()
    cost = html[html.index('id="fig-cost"'):]
    assert cost.startswith('id="fig-cost">$0.0025 <span class="tag"') and ">estimated</span>" in html  # the one money format


def test_store_down_is_a_503_page_and_a_json_503(client, make_user, project_with_key, monkeypatch):
    from store import StoreError

    alice = make_user()
    _, key = project_with_key(members=[alice])

    def down(**kwargs):
        raise StoreError("connection refused", tag="tests.down")

    monkeypatch.setattr("dashboard.trace_detail.trace_spans", down)
    tid = trace_id()
    api = client.get(reverse("dashboard:trace-api", args=[tid]), HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.status_code == 503 and api.json()["error"]["code"] == "store_unavailable" and api["Retry-After"]
    page = _client(client, alice).get(reverse("dashboard:trace", args=[tid]))
    assert page.status_code == 503 and "The trace store is unavailable" in page.content.decode()
    compare = client.get(reverse("dashboard:trace-compare"), {"a": tid})
    assert compare.status_code == 503


def test_a_deep_chain_of_spans_does_not_recurse(project_with_key):
    project, _ = project_with_key()
    tid, start, ids = trace_id(), time.time_ns() - 60_000_000_000, [span_id() for _ in range(3000)]
    spans = [{"trace_id": tid, "span_id": sid, "parent_span_id": ids[k - 1] if k else None, "name": f"level {k}",
              "phase": "other", "service": "svc", "start_time": start + k * 1000, "duration_ms": 3000 - k * 0.001}
             for k, sid in enumerate(ids)]
    seed(spans, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    assert [s.depth for s in detail.spans] == list(range(3000))
    assert all(s.on_critical_path for s in detail.spans)


def test_the_openapi_document_describes_the_trace_read(client):
    doc = client.get("/api/openapi.json").json()
    operation = doc["paths"]["/api/v1/traces/{trace_id}"]["get"]
    assert {"200", "400", "401", "404", "503"} <= set(operation["responses"])
    assert set(operation["responses"]["200"]["content"]["application/json"]["schema"]["required"]) == {
        "trace_id", "project_id", "summary", "phases", "flags", "critical_path", "spans", "genai_events", "scores"}


def test_a_trace_whose_root_has_not_arrived_is_shown_with_its_orphans(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    spans = llm_trace()[1:]  # the root is still running
    tid = seed(spans, project_id=project.pk)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    assert not detail.summary.has_root and detail.summary.span_count == 4
    assert all(s.orphan and s.depth == 0 for s in detail.spans)
    assert detail.summary.e2e_ns == (80 + 120 + 900 + 60) * MS  # the extent of the spans present
    html = _client(client, alice).get(reverse("dashboard:trace", args=[tid])).content.decode()
    assert ">no root</span>" in html


def test_tokens_not_reported_are_unknown_not_zero(client, make_user, project_with_key):
    """A failed model call sends no token counts: stored as NULL (native path), shown as "—" on the
    span and in the header, and the sums skip it."""
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    spans = llm_trace()
    failed = next(s for s in spans if s.get("phase") == "inference")
    del failed["input_tokens"], failed["output_tokens"]
    tid = seed(spans, project_id=project.pk)
    stored = {r["name"]: r for r in get_store().query(
        "SELECT name, input_tokens, output_tokens FROM spans WHERE project_id = {p:UInt64}", {"p": project.pk},
        tag="tests.trace_detail.tokens").dicts()}
    assert (stored[failed["name"]]["input_tokens"], stored[failed["name"]]["output_tokens"]) == (None, None)
    detail = trace_get(project_id=project.pk, trace_id=tid)
    assert (detail.summary.input_tokens, detail.summary.output_tokens) == (0, 0)
    assert detail.summary.tokens_reported is False
    span = _by_name(detail)[failed["name"]]
    assert (span.input_tokens, span.output_tokens) == (None, None)
    html = _client(client, alice).get(reverse("dashboard:trace", args=[tid])).content.decode()
    assert '<dd id="fig-tokens">—</dd>' in html
