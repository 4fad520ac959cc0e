"""Engine figures computed exactly on seeded ``engine_samples``: gauges over a window, counter
increases across a restart, histogram percentiles from bucket increases (Prometheus'
``histogram_quantile``), per chart bucket, and only the project's own samples."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from analytics import engines
from analytics.engines import histogram_quantile
from store import get_store

pytestmark = [pytest.mark.clickhouse]

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
TARGET = "http://gpu-1:8000/metrics"


def _ns(when: datetime) -> int:
    return int(when.timestamp()) * 10**9


def _row(project_id, when, metric, value, le=0.0, model="llama", target=TARGET, engine="vllm"):
    return {"project_id": project_id, "time": _ns(when), "host": "gpu-1", "engine": engine, "target": target,
            "model": model, "metric": metric, "le": le, "value": float(value)}


def _histogram(project_id, when, metric, cumulative: list[float], total: float):
    rows = [_row(project_id, when, metric, c, le=le) for le, c in zip((0.1, 0.5, 1.0, math.inf), cumulative)]
    return rows + [_row(project_id, when, metric + "_sum", total)]


@pytest.fixture
def seeded():
    pid, other = 9101, 9102
    s = lambda sec: T0 + timedelta(seconds=sec)  # noqa: E731
    rows = [
        # gauges inside the window (0, 60]
        _row(pid, s(10), "kv_cache_usage", 40), _row(pid, s(30), "kv_cache_usage", 95), _row(pid, s(50), "kv_cache_usage", 60),
        _row(pid, s(10), "requests_waiting", 0), _row(pid, s(50), "requests_waiting", 12),
        # a counter that restarts (15 -> 3) inside the window; its baseline (10) is before it
        _row(pid, s(-5), "preemptions", 10), _row(pid, s(20), "preemptions", 15), _row(pid, s(40), "preemptions", 3),
        _row(pid, s(55), "preemptions", 8),
        # TTFT: the baseline before the window, then +10 requests in (0.1, 0.5], one later more in the next minute
        *_histogram(pid, s(-5), "ttft_seconds", [1, 2, 3, 3], 1.0),
        *_histogram(pid, s(45), "ttft_seconds", [1, 12, 13, 13], 4.0),
        *_histogram(pid, s(75), "ttft_seconds", [1, 12, 13, 14], 9.0),  # one request above 1 s
        # another project's samples at the same instance: never counted
        _row(other, s(30), "kv_cache_usage", 100), _row(other, s(20), "preemptions", 999),
        # a second instance of the same project
        _row(pid, s(30), "kv_cache_usage", 10, target="http://gpu-2:8000/metrics"),
    ]
    get_store().insert("engine_samples", rows, tag="tests.engine_figures")
    return pid


def test_window_figures_are_exact(seeded):
    figures = engines.window_figures(project_id=seeded, start=T0, end=T0 + timedelta(seconds=60))
    by_target = {f.instance.target: f for f in figures}
    assert set(by_target) == {TARGET, "http://gpu-2:8000/metrics"}
    f = by_target[TARGET]
    assert f.gauges["kv_cache_usage"] == {"last": 60, "mean": pytest.approx(65), "high": 95, "low": 40}
    assert f.gauges["requests_waiting"]["last"] == 12 and f.gauges["requests_waiting"]["high"] == 12
    assert f.increases["preemptions"] == 5 + 3 + 5  # 10 -> 15, restart -> 3, 3 -> 8
    assert f.observed["ttft_seconds"] == 10
    # 10 observations in (0.1, 0.5]: P50 at rank 5 -> 0.1 + 0.4 * 5/10 s; P95 -> 0.1 + 0.4 * 9.5/10
    assert f.percentiles_ms["ttft_seconds"][0.5] == pytest.approx(300.0)
    assert f.percentiles_ms["ttft_seconds"][0.95] == pytest.approx(480.0)
    assert f.mean_ms["ttft_seconds"] == pytest.approx(300.0)  # (4.0 - 1.0) s / 10
    assert f.last_ms == int((T0 + timedelta(seconds=50)).timestamp() * 1000) and f.host == "gpu-1"


def test_a_window_without_new_observations_has_no_percentile(seeded):
    # (60, 70]: no histogram sample falls in it, its baseline is the one at 45 s
    figures = engines.window_figures(project_id=seeded, start=T0 + timedelta(seconds=60), end=T0 + timedelta(seconds=70))
    assert all("ttft_seconds" not in f.percentiles_ms for f in figures)
    later = engines.window_figures(project_id=seeded, start=T0 + timedelta(seconds=60), end=T0 + timedelta(seconds=90))
    f = next(f for f in later if f.instance.target == TARGET)
    assert f.observed["ttft_seconds"] == 1
    assert f.percentiles_ms["ttft_seconds"][0.95] == 1000.0  # in the +Inf bucket: the highest finite bound


def test_series_buckets_split_the_increases_by_the_later_sample(seeded):
    series = engines.engine_series(project_id=seeded, start=T0, end=T0 + timedelta(seconds=119), step_seconds=60)
    assert series.times == [T0, T0 + timedelta(seconds=60)]
    gpu1 = next(i for i in series.instances if i.instance.target == TARGET)
    first, second = gpu1.buckets
    assert first.increases["preemptions"] == 13 and first.observed["ttft_seconds"] == 10
    assert second.observed["ttft_seconds"] == 1 and "kv_cache_usage" not in second.gauges
    assert series.values(gpu1, lambda f: f.gauges.get("kv_cache_usage", {}).get("high")) == [95, None]


def test_reads_are_scoped_to_the_project(seeded):
    assert engines.window_figures(project_id=9102, start=T0, end=T0 + timedelta(seconds=60))[0].gauges[
        "kv_cache_usage"]["last"] == 100
    assert engines.window_figures(project_id=424242, start=T0, end=T0 + timedelta(seconds=60)) == []
    assert engines.latest_sample_time(project_id=424242) is None
    assert engines.latest_sample_time(project_id=seeded) == T0 + timedelta(seconds=75)


@pytest.mark.parametrize("q, buckets, expected", [
    (0.5, [(0.1, 0), (0.5, 10), (math.inf, 10)], 0.3),
    (0.5, [(0.1, 10), (0.5, 10), (math.inf, 10)], 0.05),  # inside the first bucket, from 0
    (0.99, [(0.1, 5), (0.5, 5), (math.inf, 10)], 0.5),  # in +Inf: the highest finite bound
    (0.5, [(0.1, 0), (math.inf, 0)], None),  # nothing observed
    (0.5, [(0.1, 3), (0.5, 2), (math.inf, 4)], 0.1 * (2 / 3)),  # a falling count is evened out
])
def test_histogram_quantile(q, buckets, expected):
    got = histogram_quantile(q, buckets)
    assert got == (None if expected is None else pytest.approx(expected))
