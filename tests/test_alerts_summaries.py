"""Latency alerts read the per-trace summaries; they bring them up to date themselves only when
the periodic summariser is behind (issue 15: one summariser run per alert window was repeating the
periodic run's work under load)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

import analytics.summarizer as summarizer
from alerts.latency import latency_fetch
from tests.rollup_support import insert_spans
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9


def test_latency_alerts_summarise_only_when_the_periodic_summariser_is_behind(project_with_key, monkeypatch, settings):
    settings.TRACEDASH_SUMMARIZE_SECONDS = 60  # "fresh" = summarised in the last two minutes: no clock race
    project, _ = project_with_key()
    runs = []
    real_run = summarizer.traces_summarize

    def counting_run(**kwargs):
        runs.append(kwargs)
        return real_run(**kwargs)

    monkeypatch.setattr(summarizer, "traces_summarize", counting_run)
    now = datetime.now(tz=timezone.utc)

    def requests_seen() -> float:
        (series,) = latency_fetch(project_id=project.pk, window_seconds=3600, now=now)
        return round(series.values["request_rate"] * 3600)

    insert_spans(project.pk, llm_trace(start_ns=time.time_ns() - 120 * S))
    # Never summarised: the alert runs the summariser itself and sees the new trace.
    assert requests_seen() == 1 and len(runs) == 1
    # The summaries are fresh now: a second window of the same round does not run it again.
    assert requests_seen() == 1 and len(runs) == 1
    # The periodic summariser falls behind (its last run is older than two intervals): run again.
    settings.TRACEDASH_SUMMARIZE_SECONDS = 0.001
    monkeypatch.setattr("alerts.latency.SUMMARIES_FRESH_SECONDS", 0.001)
    insert_spans(project.pk, llm_trace(start_ns=time.time_ns() - 60 * S))
    time.sleep(0.01)
    assert requests_seen() == 2 and len(runs) == 2


def test_a_request_whose_start_moved_counts_once_in_the_window_of_its_latest_start(project_with_key):
    """The latency rules read a window's requests as the panels do (``traces_by_start``, FINAL): a
    summary whose start moved (a longer root arrived later) is counted once, under its latest start
    only, never also under the start it had before (retired by ``starts_retire``)."""
    from tests.explorer_seed import span_rows, summary_moved

    project, _ = project_with_key()
    start = (time.time_ns() - 3 * 3600 * S) // (60 * S) * 60 * S
    rows = span_rows(project_id=project.pk, spans=llm_trace(start_ns=start + 40 * 60 * S))
    # the old start 10 min past `start`, retired
    latest = summary_moved(project_id=project.pk, rows=rows, earlier_ns=30 * 60 * S, tag="tests.alerts_summaries.moved")

    def requests(until_min: int, window_min: int) -> int:
        now = datetime.fromtimestamp((start + until_min * 60 * S) / S, tz=timezone.utc)
        series = latency_fetch(project_id=project.pk, window_seconds=window_min * 60, now=now)
        return sum(round(s.values["request_rate"] * window_min * 60) for s in series)

    assert requests(60, 60) == 1  # both starts inside: once
    assert requests(30, 30) == 0  # only the retired start inside: not counted
    assert requests(60, 30) == 1
    # (since, until]: a request starting exactly at the window's end counts, at its start it does not
    at = (latest["start_time"] - start) / (60 * S)
    now = datetime.fromtimestamp(latest["start_time"] / S, tz=timezone.utc)
    assert at == int(at)
    assert [round(s.values["request_rate"] * 60) for s in latency_fetch(project_id=project.pk, window_seconds=60, now=now)] == [1]
    later = datetime.fromtimestamp((latest["start_time"] + 60 * S) / S, tz=timezone.utc)
    assert latency_fetch(project_id=project.pk, window_seconds=60, now=later) == []


def test_the_window_percentiles_are_exact_and_each_at_its_own_level(project_with_key):
    """P50, P95 and P99 of the roots' durations, per service, are the exact percentiles (linear
    interpolation between the closest ranks, as numpy's default) of the window's requests, each at
    its own level (the three come from one ``quantilesExactInclusive``)."""
    import numpy as np

    project, _ = project_with_key()
    base = time.time_ns() - 600 * S
    durations = {"chat-api": [37.0 + (i * 7919) % 1300 for i in range(41)], "search": [5.5, 900.25, 12.0, 480.0]}
    spans = []
    for service, values in durations.items():
        for i, ms in enumerate(values):
            trace = llm_trace(service=service, start_ns=base + i * S)
            trace[0]["duration_ms"] = ms
            spans += trace
    insert_spans(project.pk, spans)
    now = datetime.fromtimestamp((base + 120 * S) / S, tz=timezone.utc)
    series = {s.labels["service"]: s.values for s in latency_fetch(project_id=project.pk, window_seconds=300, now=now)}
    assert set(series) == set(durations)
    for service, values in durations.items():
        for level in (50, 95, 99):
            expected = float(np.percentile(values, level))
            assert series[service][f"e2e_p{level}_ms"] == pytest.approx(expected, abs=1e-6), (service, level)
    assert len({series["chat-api"][f"e2e_p{level}_ms"] for level in (50, 95, 99)}) == 3
