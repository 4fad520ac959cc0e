"""BatchExporter against a scripted local HTTP server: the body it sends, retries (Retry-After,
backoff), drops (full queue, refused batches, server down), flush and shutdown, and that
``Span.end()`` stays fast whatever the server does. No ClickHouse involved."""

from __future__ import annotations

import gzip
import json
import logging
import time

import pytest

import tracedash_sdk as td
from tests.sdk.conftest import Answer

DOCUMENTED_FIELDS = {"trace_id", "span_id", "parent_span_id", "name", "phase", "service", "model", "start_time",
                     "end_time", "status", "status_message", "ttft_ms", "input_tokens", "output_tokens", "cost_usd",
                     "attributes", "events"}


def test_batch_is_gzip_json_in_the_documented_format(trace_server, make_tracer):
    tracer = make_tracer(trace_server.url, api_key="td_abc_secret", service="svc", flush_interval=60)
    with tracer.trace("POST /chat", attributes={"http.route": "/chat"}) as root:
        with root.phase("inference") as call:
            call.set_model("gpt-4o").set_tokens(input=812, output=164).set_cost(0.0042).set_ttft(0.21)
            call.add_event("first_token", {"n": 1})
    assert tracer.flush(5)

    (request,) = trace_server.requests
    assert request["path"] == "/api/v1/traces"
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == "Bearer td_abc_secret"
    assert headers["content-type"] == "application/json" and headers["content-encoding"] == "gzip"
    assert headers["user-agent"].startswith("tracedash-sdk/0.1.0")
    payload = json.loads(gzip.decompress(request["raw"]))  # the body itself is a plain gzip stream
    assert list(payload) == ["spans"]
    spans = {s["name"]: s for s in payload["spans"]}
    assert set(spans) == {"POST /chat", "inference"}
    for span in spans.values():
        assert set(span) == DOCUMENTED_FIELDS
        assert len(span["trace_id"]) == 32 and len(span["span_id"]) == 16
        assert isinstance(span["start_time"], int) and span["end_time"] >= span["start_time"] > 1.7e18
    root, call = spans["POST /chat"], spans["inference"]
    assert root["parent_span_id"] is None and call["parent_span_id"] == root["span_id"]
    assert call["trace_id"] == root["trace_id"]
    # No phase given: sent as null (the span states none; the server counts it as other, or as part of
    # a model call it lies beneath).
    assert (root["phase"], root["service"], root["status"], root["attributes"]) == (None, "svc", "ok", {"http.route": "/chat"})
    assert (call["phase"], call["model"], call["input_tokens"], call["output_tokens"]) == ("inference", "gpt-4o", 812, 164)
    assert call["cost_usd"] == 0.0042 and call["ttft_ms"] == pytest.approx(210.0)
    assert call["events"][0]["name"] == "first_token" and call["events"][0]["attributes"] == {"n": 1}
    assert root["ttft_ms"] is None and root["input_tokens"] is None and root["model"] is None  # unknown, not 0
    stats = tracer.exporter.stats
    assert (stats["spans_queued"], stats["spans_sent"], stats["batches_sent"], stats["spans_dropped"]) == (2, 2, 1, 0)


def test_batches_are_split_at_max_batch_spans(trace_server, make_tracer):
    tracer = make_tracer(trace_server.url, max_batch_spans=10, flush_interval=60)
    for i in range(25):
        tracer.span(f"s{i}").end()
    assert tracer.flush(5)
    assert sorted(len(r["payload"]["spans"]) for r in trace_server.requests) == [5, 10, 10]
    assert tracer.exporter.stats["batches_sent"] == 3 and tracer.exporter.stats["spans_sent"] == 25


def test_retry_after_is_honoured(trace_server, make_tracer):
    trace_server.answer(Answer(503, headers={"Retry-After": "1"}))
    tracer = make_tracer(trace_server.url, flush_interval=60)
    tracer.span("one").end()
    assert tracer.flush(60)
    first, second = trace_server.requests
    gap = second["time"] - first["time"]
    # never sooner than Retry-After; the upper bound only says it did not fall back to a long backoff
    # (a busy machine may run late)
    assert 1.0 <= gap < 10, gap
    assert second["payload"] == first["payload"]
    stats = tracer.exporter.stats
    assert (stats["retries"], stats["spans_sent"], stats["batches_sent"], stats["batches_failed"]) == (1, 1, 1, 0)


def test_429_without_retry_after_backs_off_exponentially(trace_server, make_tracer):
    trace_server.answer(Answer(429), Answer(429), Answer(502))
    tracer = make_tracer(trace_server.url, exporter_kwargs={"flush_interval": 60, "backoff_initial": 0.05})
    tracer.span("one").end()
    assert tracer.flush(5)
    times = [r["time"] for r in trace_server.requests]
    assert len(times) == 4
    gaps = [b - a for a, b in zip(times, times[1:])]
    # full backoff is 0.05, 0.1, 0.2 s, each with jitter to 50..100 % of it
    for gap, base in zip(gaps, (0.05, 0.1, 0.2)):
        assert base * 0.5 <= gap < base + 0.1, gaps
    assert tracer.exporter.stats["retries"] == 3 and tracer.exporter.stats["spans_sent"] == 1


def test_retries_stop_after_max_retry_time_and_drop_the_batch(trace_server, make_tracer, caplog):
    trace_server.default = Answer(503, headers={"Retry-After": "0.2"})
    tracer = make_tracer(trace_server.url, exporter_kwargs={"flush_interval": 60, "max_retry_time": 0.5})
    for _ in range(3):
        tracer.span("x").end()
    with caplog.at_level(logging.WARNING, logger="tracedash_sdk"):
        assert tracer.flush(5)
    stats = tracer.exporter.stats
    assert stats["batches_failed"] == 1 and stats["spans_dropped"] == 3 and stats["spans_sent"] == 0
    assert 2 <= stats["retries"] <= 3 and len(trace_server.requests) == stats["retries"] + 1
    assert any("gave up" in r.getMessage() for r in caplog.records)


def test_4xx_drops_the_batch_and_logs_once(trace_server, make_tracer, caplog):
    trace_server.default = Answer(400, body={"error": {"code": "invalid_spans", "message": "all 1 spans were rejected",
                                                       "details": [{"index": 0, "field": "name", "message": "bad"}]}})
    tracer = make_tracer(trace_server.url, flush_interval=60)
    with caplog.at_level(logging.WARNING, logger="tracedash_sdk"):
        for _ in range(3):
            tracer.span("x").end()
            assert tracer.flush(5)
    assert len(trace_server.requests) == 3  # never retried
    stats = tracer.exporter.stats
    assert (stats["batches_failed"], stats["spans_dropped"], stats["retries"]) == (3, 3, 0)
    logged = [r for r in caplog.records if r.name == "tracedash_sdk"]
    assert len(logged) == 1 and "HTTP 400" in logged[0].getMessage() and "field name: bad" in logged[0].getMessage()


def test_partial_rejection_is_counted_and_warned(trace_server, make_tracer, caplog):
    trace_server.answer(Answer(200, body={"accepted": 1, "rejected": [
        {"index": 1, "field": "attributes.k", "message": "value longer than 10 bytes"}]}))
    tracer = make_tracer(trace_server.url, flush_interval=60)
    tracer.span("a").end()
    tracer.span("b").end()
    with caplog.at_level(logging.WARNING, logger="tracedash_sdk"):
        assert tracer.flush(5)
    stats = tracer.exporter.stats
    assert (stats["spans_sent"], stats["spans_rejected"], stats["batches_sent"]) == (1, 1, 1)
    (record,) = [r for r in caplog.records if r.name == "tracedash_sdk"]
    assert "rejected 1 of 2" in record.getMessage() and "value longer than 10 bytes" in record.getMessage()


def test_413_halves_the_batch(trace_server, make_tracer):
    trace_server.answer(Answer(413))
    tracer = make_tracer(trace_server.url, flush_interval=60)
    for i in range(8):
        tracer.span(f"s{i}").end()
    assert tracer.flush(5)
    assert [len(r["payload"]["spans"]) for r in trace_server.requests] == [8, 4, 4]
    assert tracer.exporter.stats["spans_sent"] == 8


def _end_durations(tracer, n):
    durations = []
    for i in range(n):
        span = tracer.span("hot", attributes={"i": i})
        t0 = time.perf_counter()
        span.end()
        durations.append(time.perf_counter() - t0)
    return sorted(durations)


def test_full_queue_drops_new_spans_and_end_stays_fast_while_the_server_hangs(trace_server, make_tracer):
    trace_server.default = Answer(hang=True)
    tracer = make_tracer(trace_server.url, max_queue_spans=100, max_batch_spans=10, flush_interval=0.01, timeout=30)
    durations = _end_durations(tracer, 2000)
    assert durations[len(durations) // 2] < 100e-6, durations[len(durations) // 2]
    assert durations[int(len(durations) * 0.99)] < 2e-3 and durations[-1] < 250e-3, durations[-20:]
    stats = tracer.exporter.stats
    assert stats["spans_queued"] + stats["spans_dropped"] == 2000
    assert 100 <= stats["spans_queued"] <= 100 + 10  # the queue, and at most one batch taken
    assert stats["spans_sent"] == 0
    assert not tracer.flush(0.2)  # the server still hangs
    trace_server.release.set()
    trace_server.default = Answer()
    assert tracer.flush(5)
    assert tracer.exporter.stats["spans_sent"] == stats["spans_queued"]


def test_server_down_retries_then_drops_and_end_stays_fast(closed_port_url, make_tracer):
    tracer = make_tracer(closed_port_url, exporter_kwargs={
        "flush_interval": 0.01, "max_queue_spans": 50, "max_batch_spans": 10, "max_retry_time": 0.3,
        "backoff_initial": 0.05})
    durations = _end_durations(tracer, 1000)
    assert durations[int(len(durations) * 0.99)] < 2e-3, durations[-20:]
    assert tracer.flush(5)
    stats = tracer.exporter.stats
    assert stats["spans_sent"] == 0 and stats["spans_dropped"] == 1000 and stats["retries"] >= 2
    assert stats["batches_failed"] >= 1


def test_slow_server_past_the_timeout_is_retried(trace_server, make_tracer):
    trace_server.answer(Answer(delay=0.6))  # the first answer comes after the client's timeout
    tracer = make_tracer(trace_server.url, exporter_kwargs={"flush_interval": 60, "timeout": 0.3, "backoff_initial": 0.05})
    tracer.span("x").end()
    assert tracer.flush(5)
    stats = tracer.exporter.stats
    assert stats["retries"] == 1 and stats["spans_sent"] == 1 and len(trace_server.requests) == 2


def test_reconnects_when_the_server_closed_the_keep_alive_connection(trace_server, make_tracer):
    trace_server.answer(Answer(close=True))  # the server drops the idle keep-alive connection
    tracer = make_tracer(trace_server.url, flush_interval=60)
    tracer.span("a").end()
    assert tracer.flush(5)
    time.sleep(0.05)
    tracer.span("b").end()
    assert tracer.flush(5)
    assert [s["name"] for s in trace_server.spans] == ["a", "b"]
    assert tracer.exporter.stats["retries"] == 0


def test_shutdown_flushes_and_then_refuses(trace_server, make_tracer):
    tracer = make_tracer(trace_server.url, flush_interval=60)
    for i in range(5):
        tracer.span(f"s{i}").end()
    assert trace_server.requests == []  # nothing sent before its time
    assert tracer.shutdown(timeout=5)
    assert len(trace_server.spans) == 5
    tracer.span("late").end()
    assert tracer.exporter.stats["spans_dropped"] == 1 and len(trace_server.spans) == 5
    assert tracer.shutdown(timeout=1)  # idempotent


def test_shutdown_is_bounded_when_the_server_is_down(closed_port_url, make_tracer):
    tracer = make_tracer(closed_port_url, flush_interval=60)
    tracer.span("x").end()
    t0 = time.monotonic()
    tracer.shutdown(timeout=0.5)
    # bounded by its timeout, not by the retries' backoff (tens of seconds); slack for a busy machine
    assert time.monotonic() - t0 < 5
    assert tracer.exporter.stats["spans_dropped"] == 1


def test_without_endpoint_spans_are_dropped_with_one_log_line(monkeypatch, caplog):
    monkeypatch.delenv("TRACEDASH_ENDPOINT", raising=False)
    monkeypatch.delenv("TRACEDASH_API_KEY", raising=False)
    tracer = td.Tracer()
    with caplog.at_level(logging.WARNING, logger="tracedash_sdk"):
        for _ in range(3):
            with tracer.trace("x") as t:
                t.set_attribute("k", "v")
    assert tracer.flush(1) and tracer.shutdown(1)
    assert tracer.exporter.stats["spans_dropped"] == 3 and tracer.exporter.stats["spans_sent"] == 0
    (record,) = [r for r in caplog.records if r.name == "tracedash_sdk"]
    assert "no endpoint" in record.getMessage()


def test_endpoint_and_key_from_the_environment(trace_server, monkeypatch):
    monkeypatch.setenv("TRACEDASH_ENDPOINT", trace_server.url + "/")
    monkeypatch.setenv("TRACEDASH_API_KEY", "td_env_key")
    tracer = td.Tracer(flush_interval=60)
    try:
        tracer.span("x").end()
        assert tracer.flush(5)
    finally:
        tracer.shutdown(1)
    (request,) = trace_server.requests
    assert request["path"] == "/api/v1/traces"
    assert {k.lower(): v for k, v in request["headers"].items()}["authorization"] == "Bearer td_env_key"


def test_spans_are_flushed_at_interpreter_exit(trace_server):
    import subprocess
    import sys

    from tests.sdk.conftest import ROOT

    script = (
        "import tracedash_sdk as td\n"
        f"tracer = td.Tracer(endpoint={trace_server.url!r}, api_key='k', flush_interval=60)\n"
        "for i in range(3):\n"
        "    with tracer.trace(f'at-exit-{i}'):\n"
        "        pass\n"
    )  # no flush, no shutdown: the atexit hook sends them
    env = {"PYTHONPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=20)
    assert sorted(s["name"] for s in trace_server.spans) == ["at-exit-0", "at-exit-1", "at-exit-2"]


def test_endpoint_forms():
    from tracedash_sdk._exporter import _parse_endpoint

    assert _parse_endpoint("http://127.0.0.1:8000") == ("http", "127.0.0.1", 8000, "/api/v1/traces")
    assert _parse_endpoint("127.0.0.1:8000/") == ("http", "127.0.0.1", 8000, "/api/v1/traces")
    assert _parse_endpoint("https://td.example.com/base/") == ("https", "td.example.com", 443, "/base/api/v1/traces")
    assert _parse_endpoint("http://[::1]:9000/api/v1/traces") == ("http", "::1", 9000, "/api/v1/traces")
    with pytest.raises(ValueError):
        _parse_endpoint("ftp://x")
