"""The SDK's scores: ``span.score`` and ``tracer.score`` against the real app and ClickHouse, and
against a scripted server for the retries and the flush at shutdown."""

from __future__ import annotations

import pytest

import tracedash_sdk as td
from analytics.scores import trace_scores
from tests.sdk.conftest import Answer

TRACE = "f" * 32


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_span_and_tracer_scores_land_in_clickhouse(asgi_server, project_with_key, make_tracer):
    project, key = project_with_key()
    tracer = make_tracer(asgi_server.url, api_key=key, service="chat-api", flush_interval=0.05)
    with tracer.trace("POST /chat") as root:
        with root.phase("inference") as model:
            model.score("judge.correct", True, source="eval", author="judge-v2", comment="<b>right</b>")
        root.score("tone", "friendly")
    tracer.score(root.trace_id, "user.feedback", 1, author="u-17")
    tracer.score(root.trace_id, "quality", 3.5, score_id="eval-run-9")
    tracer.score(root.trace_id, "quality", 4.5, score_id="eval-run-9")  # the same id again: replaces
    tracer.score(root.trace_id, "user.feedback", 0, author="u-17")  # derived id again: replaces
    assert tracer.flush(30)
    stats = tracer.exporter.stats
    assert stats["scores_sent"] == 6 and stats["scores_rejected"] == 0 and stats["spans_sent"] == 2, stats

    scores = {s["name"]: s for s in trace_scores(project_id=project.pk, trace_id=root.trace_id)}
    assert set(scores) == {"judge.correct", "tone", "user.feedback", "quality"}
    judge = scores["judge.correct"]
    assert (judge["span_id"], judge["value"], judge["source"], judge["author"], judge["comment"]) == (
        model.span_id, True, "eval", "judge-v2", "<b>right</b>")
    assert (scores["tone"]["span_id"], scores["tone"]["value"], scores["tone"]["source"]) == (root.span_id, "friendly",
                                                                                              "sdk")
    assert (scores["user.feedback"]["span_id"], scores["user.feedback"]["value"]) == ("", 0.0)
    assert (scores["quality"]["id"], scores["quality"]["value"]) == ("eval-run-9", 4.5)


@pytest.mark.parametrize("call, words", [
    (lambda t: t.score("nope", "q", 1), "trace_id"),
    (lambda t: t.score(TRACE, "", 1), "name"),
    (lambda t: t.score(TRACE, "q", float("nan")), "finite"),
    (lambda t: t.score(TRACE, "q", [1]), "bool, int, float or str"),
    (lambda t: t.score(TRACE, "q", 1, data_type="boolean"), "data_type"),
    (lambda t: t.score(TRACE, "q", 1, source="human"), "source"),
    (lambda t: t.score(TRACE, "q", 1, span_id="xyz"), "span_id"),
])
def test_a_bad_score_raises_at_the_call_naming_the_argument(call, words):
    exporter = td.InMemoryExporter()
    tracer = td.Tracer(exporter=exporter)
    with pytest.raises((ValueError, TypeError), match=words):
        call(tracer)
    assert exporter.scores == []


def test_scores_are_retried_batched_and_sent_by_shutdown(trace_server, make_tracer):
    trace_server.answer(Answer(status=503, headers={"Retry-After": "0"}))
    tracer = make_tracer(trace_server.url, flush_interval=3600,
                         exporter_kwargs={"flush_interval": 3600, "backoff_initial": 0.01})
    for i in range(5):
        tracer.score(TRACE, f"s{i}", i)
    assert tracer.shutdown(30)  # nothing sent before: shutdown sends them
    paths = [r["path"] for r in trace_server.requests]
    assert paths == ["/api/v1/scores", "/api/v1/scores"]  # the 503, then the retry of the same batch
    assert [s["name"] for s in trace_server.requests[-1]["payload"]["scores"]] == [f"s{i}" for i in range(5)]
    assert trace_server.requests[-1]["headers"]["Authorization"] == "Bearer td_test_key"
    stats = tracer.exporter.stats
    assert stats["scores_sent"] == 5 and stats["retries"] == 1 and stats["spans_queued"] == 0, stats


def test_a_batch_the_server_refuses_is_counted_not_retried(trace_server, make_tracer):
    trace_server.answer(Answer(status=400, body={"error": {"code": "invalid_scores", "message": "all 1 scores were rejected",
                                                           "details": [{"index": 0, "field": "name", "message": "x"}]}}))
    tracer = make_tracer(trace_server.url, exporter_kwargs={"flush_interval": 3600})
    tracer.score(TRACE, "q", 1)
    assert tracer.flush(30)
    assert len(trace_server.requests) == 1
    assert tracer.exporter.stats["scores_rejected"] == 1


def test_a_sampled_out_span_checks_its_score_and_drops_it():
    exporter = td.InMemoryExporter()
    tracer = td.Tracer(exporter=exporter, sample_rate=0.0)
    with tracer.trace("x") as span:
        span.score("q", 2)
        with pytest.raises(ValueError):
            span.score("q", float("inf"))
    assert exporter.scores == []
