"""The trace page's scores in a real headless Chromium: scores sent through the API (a late one, on
a trace 20 days old) are listed as text; a reviewer clicks Good, gives 4 stars with a comment, sees
both listed without a reload, and rating again replaces their rating."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from analytics.scores import trace_scores
from tests.test_browser import PASSWORD, browser, log_in, open_page, page, post_spans  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
TRACE = "1234abcd" * 4
HOSTILE = '<img src=x onerror="window.hacked=1">'


def review_state(state: str) -> str:
    """JS: the review form is there and in ``state`` (scores.js sets ``data-state``)."""
    return f"document.getElementById('trace-review')?.dataset.state === '{state}'"


REVIEW_READY = review_state("ready")


def post_scores(server, key, scores):
    request = urllib.request.Request(
        f"{server.url}/api/v1/scores", data=json.dumps({"scores": scores}).encode(), method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert body == {"accepted": len(scores), "rejected": []}, body


def rows(page):
    return [r.split("\t") for r in page.locator("#trace-scores-body tr").evaluate_all(
        "(trs) => trs.map((tr) => Array.from(tr.cells, (c) => c.textContent).join('\\t'))")]


def saved(page):
    page.wait_for_function(f"() => {review_state('saved')}")


def test_review_good_then_rate_then_rate_again(page, asgi_server, make_user, project_with_key):
    from django.contrib.auth import get_user_model

    make_user("rita", password=PASSWORD)
    project, key = project_with_key("review", members=[get_user_model().objects.get(username="rita")])
    old = time.time_ns() - 20 * 86_400 * 10**9
    post_spans(asgi_server, key, [{"trace_id": TRACE, "span_id": "00000000000000a1", "name": "POST /chat",
                                   "start_time": old, "duration_ms": 250, "service": "chat-api"}])
    post_scores(asgi_server, key, [{"trace_id": TRACE, "name": HOSTILE, "value": "meh", "comment": HOSTILE,
                                    "source": "eval", "author": "judge"}])

    log_in(page, asgi_server, "rita")
    open_page(page, f"{asgi_server.url}/traces/{TRACE}/?project={project.pk}", REVIEW_READY)
    [late] = rows(page)
    assert late[:5] == [HOSTILE, "meh", "eval", "judge", HOSTILE]  # shown as text, not markup

    page.click("#review-good")
    saved(page)
    expect(page.locator("#trace-scores-body tr", has_text="review.good")).to_contain_text("true")
    page.fill("#review-comment", "clear <b>answer</b>")
    page.click("#review-rating-4")
    saved(page)
    by_name = {r[0]: r for r in rows(page)}
    assert by_name["review.good"][1:4] == ["true", "annotation", "rita"]
    assert by_name["review.rating"][1:5] == ["4", "annotation", "rita", "clear <b>answer</b>"]
    assert page.locator("#review-comment").input_value() == ""

    # Rating again replaces the rating (one per reviewer); Bad replaces Good.
    page.click("#review-rating-2")
    saved(page)
    page.click("#review-bad")
    saved(page)
    page.reload()
    page.wait_for_function(f"() => {REVIEW_READY}")
    by_name = {}
    for r in rows(page):
        assert r[0] not in by_name, rows(page)
        by_name[r[0]] = r
    assert by_name["review.rating"][1] == "2" and by_name["review.good"][1] == "false"
    assert page.evaluate("() => window.hacked") is None
    assert page.watch.page_errors == []
    stored = {s["name"]: s for s in trace_scores(project_id=project.pk, trace_id=TRACE)}
    assert (stored["review.rating"]["value"], stored["review.rating"]["author"],
            stored["review.rating"]["source"]) == (2.0, "rita", "annotation")
    assert stored["review.good"]["value"] is False


def test_a_non_member_cannot_review_another_projects_trace(page, asgi_server, make_user, project_with_key):
    from django.contrib.auth import get_user_model

    make_user("mallory", password=PASSWORD)
    make_user("owner", password=PASSWORD)
    theirs, their_key = project_with_key("theirs", members=[get_user_model().objects.get(username="owner")])
    mine, my_key = project_with_key("mine", members=[get_user_model().objects.get(username="mallory")])
    mine_trace = "9" * 32
    post_spans(asgi_server, their_key, [{"trace_id": TRACE, "span_id": "00000000000000a1", "name": "POST /chat",
                                         "start_time": time.time_ns(), "duration_ms": 5}])
    post_spans(asgi_server, my_key, [{"trace_id": mine_trace, "span_id": "00000000000000a2", "name": "POST /mine",
                                      "start_time": time.time_ns(), "duration_ms": 5}])
    log_in(page, asgi_server, "mallory")
    open_page(page, f"{asgi_server.url}/traces/{mine_trace}/?project={mine.pk}", REVIEW_READY)
    token = page.locator("#trace-review [name=csrfmiddlewaretoken]").input_value()
    assert token
    send = """async ([url, token]) => {
        const body = new FormData(); body.append('verdict', 'good');
        if (token) body.append('csrfmiddlewaretoken', token);
        const r = await fetch(url, {method: 'POST', body, headers: {'Accept': 'application/json'}});
        return r.status; }"""
    # Their project (not hers), and her project with their trace id (not in it): both 404.
    assert page.evaluate(send, [f"{asgi_server.url}/traces/{TRACE}/scores/?project={theirs.pk}", token]) == 404
    assert page.evaluate(send, [f"{asgi_server.url}/traces/{TRACE}/scores/?project={mine.pk}", token]) == 404
    # Without the CSRF token even her own trace is refused.
    assert page.evaluate(send, [f"{asgi_server.url}/traces/{mine_trace}/scores/?project={mine.pk}", ""]) == 403
    assert trace_scores(project_id=theirs.pk, trace_id=TRACE) == []
    assert trace_scores(project_id=mine.pk, trace_id=TRACE) == []
    assert trace_scores(project_id=mine.pk, trace_id=mine_trace) == []
    # With it, it is stored.
    assert page.evaluate(send, [f"{asgi_server.url}/traces/{mine_trace}/scores/?project={mine.pk}", token]) == 200
    assert [s["author"] for s in trace_scores(project_id=mine.pk, trace_id=mine_trace)] == ["mallory"]
