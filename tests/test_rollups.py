"""Rollups: shown percentiles within 1 % of the exact ones over raw spans, late spans and re-runs
never double count, hour/day rollups agree with minutes, reads are scoped to the project."""

from __future__ import annotations

import random
import time
import uuid
from datetime import datetime, timezone

import pytest

from analytics import panel_selectors, rollup_services, rollups, summarizer
from analytics.trace_math import PHASES
from store import get_store
from tests.rollup_support import QUANTILES, exact_from_spans, exact_ms, insert_spans, random_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
NS = 1_000_000_000


def utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS, tz=timezone.utc)


def run_tasks(project_id: int) -> None:
    summarizer.traces_summarize(project_ids=[project_id])
    rollup_services.rollups_update(project_ids=[project_id])


def assert_close(shown: dict, exact: dict, what: str) -> None:
    for q in QUANTILES:
        if exact[q] is None:
            assert shown[q] is None, (what, q)
            continue
        if exact[q] == 0:
            assert shown[q] == 0, (what, q)
            continue
        error = abs(shown[q] - exact[q]) / exact[q]
        assert error <= 0.01, f"{what} P{q * 100:g}: shown {shown[q]} vs exact {exact[q]} ({error:.2%})"


def assert_window_agrees(project_id: int, start_ns: int, end_ns: int, **filters) -> rollups.WindowStats:
    stats = rollups.window_stats(project_id=project_id, start=utc(start_ns), end=utc(end_ns), **filters)
    exact = exact_from_spans(project_id, start_ns=start_ns, end_ns=end_ns, **filters)
    assert stats.requests == exact["requests"]
    assert stats.errors == exact["errors"]
    assert stats.output_tokens == exact["output_tokens"] and stats.input_tokens == exact["input_tokens"]
    assert stats.cost_usd == pytest.approx(exact["cost_usd"], rel=1e-9, abs=1e-12)
    if exact["requests"]:
        assert stats.e2e_mean_ms == pytest.approx(exact["e2e_sum"] / exact["requests"] / 1e6)
    assert_close(stats.e2e_ms, exact_ms(exact["e2e"]), "e2e")
    assert_close(stats.ttft_ms, exact_ms(exact["ttft"]), "ttft")
    assert_close(stats.tpot_ms, exact_ms(exact["tpot"]), "tpot")
    for phase in PHASES:
        assert_close(stats.phase_ms[phase], exact_ms(exact[phase]), phase)
    return stats


@pytest.fixture
def seeded(project_with_key):
    """1,200 traces over the three hours ending 20 minutes ago, two services and two models."""
    project, _ = project_with_key()
    rng = random.Random(6)
    end = (time.time_ns() - 20 * 60 * NS) // (60 * NS) * 60 * NS
    start = end - 3 * 3600 * NS
    spans = []
    for _ in range(1200):
        spans += random_trace(rng, start_ns=rng.randrange(start, end), service=rng.choice(["chat-api", "search"]),
                              model=rng.choice(["gpt-4o-mini", "llama-3-70b"]), error=rng.random() < 0.05,
                              network=rng.random() < 0.9)
    insert_spans(project.pk, spans)
    run_tasks(project.pk)
    return project, start, end


def test_rollup_percentiles_agree_with_exact_over_raw_spans(seeded):
    project, start, end = seeded
    stats = assert_window_agrees(project.pk, start, end)  # 3 hours: minute rollups
    assert stats.requests == 1200
    # a window over 2 days reads hour rollups for its whole hours, minutes at its edges
    wide = assert_window_agrees(project.pk, start - 2 * 86400 * NS - 17 * 60 * NS, end + 60 * NS)
    assert wide.requests == 1200
    # a window that cuts through hours, and filters
    assert_window_agrees(project.pk, start + 37 * 60 * NS, end - 71 * 60 * NS, service="search")
    assert_window_agrees(project.pk, start, end, model="llama-3-70b")
    assert_window_agrees(project.pk, start, end, service="chat-api", model="gpt-4o-mini")


def test_series_buckets_agree_with_exact(seeded):
    project, start, end = seeded
    series = rollups.window_series(project_id=project.pk, start=utc(start), end=utc(end), points=6,
                                   histograms=rollups.HISTOGRAMS)
    assert series.step_seconds == 1800
    total = 0
    for t, bucket in zip(series.times, series.buckets):
        t_ns = int(t.timestamp()) * NS
        exact = exact_from_spans(project.pk, start_ns=t_ns, end_ns=t_ns + series.step_seconds * NS)
        if bucket is None:
            assert exact["requests"] == 0
            continue
        total += bucket.requests
        assert bucket.requests == exact["requests"]
        assert_close(bucket.e2e_ms, exact_ms(exact["e2e"]), f"e2e at {t}")
        assert_close(bucket.phase_ms["inference"], exact_ms(exact["inference"]), f"inference at {t}")
    assert total == 1200
    heatmap = rollups.latency_heatmap(project_id=project.pk, start=utc(start), end=utc(end), points=6)
    assert sum(heatmap.totals) == 1200
    spend = rollups.spend_by_model(project_id=project.pk, start=utc(start), end=utc(end), points=6)
    assert set(spend.cost_by_model) == {"gpt-4o-mini", "llama-3-70b"}
    exact = exact_from_spans(project.pk, start_ns=start, end_ns=end)
    assert sum(v or 0 for values in spend.cost_by_model.values() for v in values) == pytest.approx(exact["cost_usd"])


def test_series_finer_than_a_minute_agree_with_exact(seeded):
    """A window of an hour or less is drawn in buckets under a minute, from the summaries aggregated
    as the rollups are: every bucket's counts are exact, its percentiles within the rollups' 1 %,
    the heatmap and the spend add up to the window, whatever second the window starts on."""
    project, start, end = seeded
    lo, hi = start + 37 * NS + 61 * 60 * NS, start + 37 * NS + 101 * 60 * NS  # 40 minutes, off the minute
    series = rollups.window_series(project_id=project.pk, start=utc(lo), end=utc(hi), points=120,
                                   histograms=rollups.HISTOGRAMS)
    assert series.step_seconds == 30
    total = 0
    for t, bucket in zip(series.times, series.buckets):
        t_ns = max(int(t.timestamp()) * NS, lo)
        exact = exact_from_spans(project.pk, start_ns=t_ns, end_ns=min(int(t.timestamp()) * NS + 30 * NS, hi))
        if bucket is None:
            assert exact["requests"] == 0, t
            continue
        total += bucket.requests
        assert bucket.requests == exact["requests"] and bucket.errors == exact["errors"], t
        assert bucket.output_tokens == exact["output_tokens"], t
        assert_close(bucket.e2e_ms, exact_ms(exact["e2e"]), f"e2e at {t}")
        assert_close(bucket.ttft_ms, exact_ms(exact["ttft"]), f"ttft at {t}")
        assert_close(bucket.phase_ms["network"], exact_ms(exact["network"]), f"network at {t}")
    window = exact_from_spans(project.pk, start_ns=lo, end_ns=hi)
    assert total == window["requests"] > 100
    heatmap = rollups.latency_heatmap(project_id=project.pk, start=utc(lo), end=utc(hi), points=120)
    assert heatmap.step_seconds == 30 and sum(heatmap.totals) == window["requests"]
    spend = rollups.spend_by_model(project_id=project.pk, start=utc(lo), end=utc(hi), points=120)
    assert spend.step_seconds == 30
    assert sum(v or 0 for values in spend.cost_by_model.values() for v in values) == pytest.approx(window["cost_usd"])
    service = rollups.window_series(project_id=project.pk, start=utc(lo), end=utc(hi), points=120, service="search")
    assert sum(b.requests for b in service.buckets if b) == exact_from_spans(
        project.pk, start_ns=lo, end_ns=hi, service="search")["requests"]


def _table_totals(project_id: int, table: str) -> dict:
    return get_store().query(
        f"SELECT sum(requests) AS requests, sum(errors) AS errors, sum(e2e_sum_ns) AS e2e, sum(output_tokens) AS tokens,"
        f" sumMap(e2e_hist) AS h, sumMap(inference_hist) AS hi FROM {table} FINAL WHERE project_id = {{p:UInt64}}",
        {"p": project_id}, tag="tests.rollups.totals").dicts()[0]


def test_hour_and_day_rollups_agree_with_minutes(seeded):
    """The hours that have ended agree with their minutes at once; the hour, six hours and day under
    way are left to the first run after they end (no reader takes them before), and then all agree."""
    project, start, end = seeded

    def per_hour(table: str) -> list:
        source = "toStartOfHour(bucket)" if table == "rollup_minute" else "bucket"
        return get_store().query(
            f"SELECT {source} AS h, sum(requests) AS n, sumMap(ttft_hist) AS t FROM {table} FINAL"
            " WHERE project_id = {p:UInt64} AND h < {ready:DateTime('UTC')} - toIntervalHour(1) + toIntervalSecond(1)"
            " GROUP BY h HAVING n > 0 ORDER BY h",
            {"p": project.pk, "ready": utc(rollup_services.rollups_ready_ns(project_id=project.pk)).strftime(
                "%Y-%m-%d %H:%M:%S")}, tag="tests.rollups.by_hour").rows

    assert _table_totals(project.pk, "rollup_minute")["requests"] == 1200
    ended = per_hour("rollup_minute")
    assert ended and per_hour("rollup_hour") == ended == per_hour("rollup_hour_all")
    # A run after the day ends (a trace arrived meanwhile: its minute is marked) recomputes what was
    # left open: every level then agrees with the minutes.
    ready_s = rollup_services.rollups_ready_ns(project_id=project.pk) // NS
    insert_spans(project.pk, random_trace(random.Random(60), start_ns=start + 90 * NS, service="chat-api"))
    summarizer.traces_summarize(project_ids=[project.pk])
    rollup_services.rollups_update(project_ids=[project.pk], now_ns=(ready_s // 86400 + 1) * 86400 * NS + 120 * NS)
    minute, hour, six, day = (_table_totals(project.pk, t) for t in ("rollup_minute", "rollup_hour", "rollup_6h",
                                                                      "rollup_day"))
    assert minute["requests"] == 1201
    assert minute == hour == six == day
    assert (_table_totals(project.pk, "rollup_hour_all")["requests"] == _table_totals(project.pk, "rollup_6h_all")["requests"]
            == _table_totals(project.pk, "rollup_day_all")["requests"] == 1201)
    everything = per_hour("rollup_minute")  # every hour now: READY is past the day's end
    assert sum(int(n) for _, n, _ in everything) == 1201
    assert per_hour("rollup_hour") == everything


def test_an_hour_six_hours_and_day_under_way_are_rolled_up_once_they_have_ended(project_with_key, settings):
    """A run recomputes the minutes that ended, but not the hour, six hours or day they belong to
    while that is still under way (a minute whose traces keep arriving is marked again on every
    run, and each recomputed all six coarser levels with it); the first run after one ends does.
    Until then readers take those minutes from the minute rollup, so nothing is missing."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    day = (time.time_ns() // NS // 86400 - 2) * 86400  # two days ago, midnight (unix s)
    hour = day + 7 * 3600  # 07:00, in the six hours 06:00-12:00
    rng = random.Random(31)

    def add(at_s: int) -> None:
        insert_spans(project.pk, random_trace(rng, start_ns=at_s * NS, service="under-way"))
        summarizer.traces_summarize(project_ids=[project.pk])

    def requests(table: str, bucket_s: int) -> int:
        return int(get_store().query(
            f"SELECT sum(requests) FROM {table} FINAL WHERE project_id = {{p:UInt64}} AND bucket = {{b:DateTime('UTC')}}",
            {"p": project.pk, "b": utc(bucket_s * NS).strftime("%Y-%m-%d %H:%M:%S")}, tag="tests.rollups.under_way").scalar())

    add(hour + 5 * 60)
    rollup_services.rollups_update(project_ids=[project.pk], now_ns=(hour + 30 * 60) * NS)
    assert requests("rollup_minute", hour + 5 * 60) == 1
    assert requests("rollup_hour", hour) == requests("rollup_6h", day + 6 * 3600) == requests("rollup_day", day) == 0
    window = (utc((hour - 3600) * NS), utc((hour + 30 * 60) * NS))
    assert rollups.window_stats(project_id=project.pk, start=window[0], end=window[1]).requests == 1
    assert "under-way" in panel_selectors.panel_facets(project_id=project.pk, start=window[0], end=window[1])["services"]

    add(hour + 40 * 60)
    rollup_services.rollups_update(project_ids=[project.pk], now_ns=(hour + 61 * 60) * NS)  # the hour has ended
    assert requests("rollup_hour", hour) == requests("rollup_hour_all", hour) == 2
    assert requests("rollup_6h", day + 6 * 3600) == requests("rollup_day", day) == 0  # still under way
    assert rollups.window_stats(project_id=project.pk, start=utc((hour - 3600) * NS),
                                end=utc((hour + 61 * 60) * NS)).requests == 2

    add(hour + 50 * 60)  # a late trace in the hour that ended: that hour again, at once
    rollup_services.rollups_update(project_ids=[project.pk], now_ns=(day + 86400 + 60) * NS)  # the day has ended
    assert requests("rollup_hour", hour) == 3
    assert requests("rollup_6h", day + 6 * 3600) == requests("rollup_6h_all", day + 6 * 3600) == 3
    assert requests("rollup_day", day) == requests("rollup_day_all", day) == 3
    assert rollups.window_stats(project_id=project.pk, start=utc((day - 86400) * NS),
                                end=utc((day + 2 * 86400) * NS)).requests == 3


def no_model_requests(project_id: int, table: str = "rollup_minute") -> int:
    return get_store().query(f"SELECT sum(requests) FROM {table} FINAL WHERE project_id = {{p:UInt64}} AND model = ''",
                             {"p": project_id}, tag="tests.rollups.no_model").scalar()


def test_late_spans_and_reruns_never_double_count(project_with_key):
    project, _ = project_with_key()
    rng = random.Random(7)
    end = (time.time_ns() - 3 * 3600 * NS) // (60 * NS) * 60 * NS  # outside the late-arrival window
    start = end - 3600 * NS
    traces = [random_trace(rng, start_ns=rng.randrange(start, end), model=rng.choice(["a", "b"])) for _ in range(300)]
    early, late = [], []
    for i, spans in enumerate(traces):
        if i % 3 == 0:  # the root arrives late: the trace is no request yet
            early += spans[1:]
            late += spans[:1]
        elif i % 3 == 1:  # the model call arrives late: the trace moves from model '' to its model
            early += [s for s in spans if s["phase"] != "inference"]
            late += [s for s in spans if s["phase"] == "inference"]
        else:
            early += spans
    insert_spans(project.pk, early)
    run_tasks(project.pk)
    first = rollups.window_stats(project_id=project.pk, start=utc(start), end=utc(end))
    assert first.requests == 200  # the rootless third is not counted yet
    assert no_model_requests(project.pk) == 100
    insert_spans(project.pk, late)
    insert_spans(project.pk, traces[2] + traces[5])  # re-sent spans (a retrying client)
    for _ in range(3):  # re-runs
        run_tasks(project.pk)
    stats = assert_window_agrees(project.pk, start, end)
    assert stats.requests == 300
    assert no_model_requests(project.pk) == 0  # the rows of model '' were zeroed, not left behind
    assert assert_window_agrees(project.pk, start, end, model="a").requests + \
        assert_window_agrees(project.pk, start, end, model="b").requests == 300
    # the same minutes recomputed again, directly (and with them every coarser level, ended or
    # not): the minutes do not change, and a second time nothing does
    before = _table_totals(project.pk, "rollup_minute")
    rollup_services.rollup_minutes_recompute(project_id=project.pk, minutes=range(start // NS, end // NS, 60))
    assert _table_totals(project.pk, "rollup_minute") == before
    assert before["requests"] == 300
    after = _table_totals(project.pk, "rollup_day")
    rollup_services.rollup_minutes_recompute(project_id=project.pk, minutes=range(start // NS, end // NS, 60))
    assert (_table_totals(project.pk, "rollup_minute"), _table_totals(project.pk, "rollup_day")) == (before, after)
    for table in ("rollup_hour", "rollup_6h", "rollup_day", "rollup_hour_all", "rollup_6h_all", "rollup_day_all"):
        assert _table_totals(project.pk, table)["requests"] == 300, table
    assert no_model_requests(project.pk, "rollup_hour") == no_model_requests(project.pk, "rollup_day") == 0
    # long windows read hours and days (and their totals over every model): the same counts
    wide = (utc(start - 2 * 86400 * NS), utc(end + 86400 * NS))
    assert rollups.window_stats(project_id=project.pk, start=wide[0], end=wide[1]).requests == 300
    assert sum(rollups.window_stats(project_id=project.pk, start=wide[0], end=wide[1], model=m).requests
               for m in ("a", "b")) == 300
    assert _table_totals(project.pk, "rollup_hour_all") == _table_totals(project.pk, "rollup_hour")


def test_rebuild_over_a_range_matches_incremental(project_with_key):
    project, _ = project_with_key()
    rng = random.Random(8)
    end = (time.time_ns() - 2 * 86400 * NS) // NS * NS
    start = end - 6 * 3600 * NS
    insert_spans(project.pk, [s for _ in range(200) for s in random_trace(rng, start_ns=rng.randrange(start, end))])
    summarizer.traces_rebuild(project_id=project.pk, from_ns=start, to_ns=end)
    seen = []
    rollup_services.rollups_rebuild(project_id=project.pk, from_ns=start, to_ns=end, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1][0] == seen[-1][1]
    assert assert_window_agrees(project.pk, start, end).requests == 200
    assert _table_totals(project.pk, "rollup_day")["requests"] == 200


def test_reads_are_scoped_to_the_project(seeded, project_with_key):
    project, start, end = seeded
    other, _ = project_with_key()
    stats = rollups.window_stats(project_id=other.pk, start=utc(start), end=utc(end))
    assert stats.requests == 0 and stats.e2e_ms[0.95] is None
    assert rollups.window_series(project_id=other.pk, start=utc(start), end=utc(end)).buckets == \
        [None] * len(rollups.window_series(project_id=other.pk, start=utc(start), end=utc(end)).times)


def test_segments_cover_each_bucket_once():
    day = 86400
    for start, end, step in [(0, 3 * day, None), (1234567, 1234567 + 90 * day + 3717, None),
                             (1234567, 1234567 + 90 * day, 3600), (60 * 7, 60 * 50, None),
                             (1234567, 1234567 + 30 * day, 21600), (1234567, 1234567 + 30 * day, 10800)]:
        covered = []
        for level, lo, hi in rollups.rollup_segments(start_s=start, end_s=end, step=step):
            size = {"minute": 60, "hour": 3600, "6h": 21600, "day": day}[level]
            assert lo % size == 0 and hi % size == 0 or level == "minute"
            covered.append((lo, hi))
        covered.sort()
        assert covered[0][0] == start // 60 * 60 and covered[-1][1] == end
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


def test_compare_reports_percent_change(seeded):
    project, start, end = seeded
    mid = start + (end - start) // 2
    comparison = rollups.compare_windows(project_id=project.pk, a=(utc(start), utc(mid)), b=(utc(mid), utc(end)))
    rows = {r.name: r for r in comparison.rows}
    assert rows["requests"].a + rows["requests"].b == 1200
    p95 = rows["e2e_p95_ms"]
    assert p95.change_percent == pytest.approx((p95.b - p95.a) / p95.a * 100)
    assert p95.better == (p95.b < p95.a)
    by_model = rollups.compare_models(project_id=project.pk, start=utc(start), end=utc(end),
                                      model_a="gpt-4o-mini", model_b="llama-3-70b")
    assert by_model.a.requests + by_model.b.requests == 1200


def test_compare_attribute_values(project_with_key):
    project, _ = project_with_key()
    rng = random.Random(9)
    end = (time.time_ns() - 600 * NS) // NS * NS
    start = end - 2 * 3600 * NS
    sides = {"v1": [], "v2": [], None: []}
    spans = []
    for i in range(240):
        trace = random_trace(rng, start_ns=rng.randrange(start, end))
        release = ("v1", "v2", None)[i % 3]
        if release:
            trace[3].setdefault("attributes", {})["release"] = release  # on the model call, not the root
        sides[release].append(trace[0]["trace_id"])
        spans += trace
    insert_spans(project.pk, spans)
    run_tasks(project.pk)
    result = rollups.compare_attribute(project_id=project.pk, start=utc(start), end=utc(end), key="release",
                                       value_a="v1", value_b="v2")
    assert result.a.requests == result.b.requests == 80
    exact = exact_from_spans(project.pk, start_ns=start, end_ns=end)
    assert result.a.requests + result.b.requests < exact["requests"] == 240
    from tests.rollup_support import nearest_rank

    rows = get_store().query("SELECT trace_id, e2e_ns FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": project.pk},
                             tag="tests.rollups.e2e").rows
    e2e = dict(rows)
    for stats, release in ((result.a, "v1"), (result.b, "v2")):
        values = [e2e[t] for t in sides[release]]
        assert stats.e2e_ms[0.95] == pytest.approx(nearest_rank(values, 0.95) / 1e6, rel=0.005)
        assert stats.errors == 0 and stats.output_tokens > 0
    none = rollups.compare_attribute(project_id=project.pk, start=utc(start), end=utc(end), key="release",
                                     value_a="v3", value_b="v1")
    assert none.a.requests == 0 and none.a.e2e_ms[0.95] is None and none.b.requests == 80


def test_totals_over_services_and_models_agree_with_the_groups(seeded):
    project, start, end = seeded
    # every level of the seeded minutes, those under way included (a run leaves them to its first
    # run after they end: test_an_hour_six_hours_and_day_under_way_...)
    rollup_services.rollup_minutes_recompute(project_id=project.pk, minutes=range(start // NS, end // NS, 60))
    for level in ("hour", "6h", "day"):
        groups = get_store().query(
            f"SELECT bucket, sum(requests), sum(errors), sum(e2e_sum_ns), sumMap(e2e_hist), sumMap(ttft_hist),"
            f" max(e2e_max_ns) FROM rollup_{level} FINAL WHERE project_id = {{p:UInt64}} GROUP BY bucket ORDER BY bucket",
            {"p": project.pk}, tag="tests.rollups.groups").rows
        totals = get_store().query(
            f"SELECT bucket, requests, errors, e2e_sum_ns, e2e_hist, ttft_hist, e2e_max_ns FROM rollup_{level}_all FINAL"
            f" WHERE project_id = {{p:UInt64}} AND requests > 0 ORDER BY bucket", {"p": project.pk}, tag="tests.rollups.totals").rows
        assert groups == totals and sum(r[1] for r in totals) == 1200


def test_series_compute_the_percentiles_asked_for(seeded):
    project, start, end = seeded
    default = rollups.window_series(project_id=project.pk, start=utc(start), end=utc(end), points=6)
    full = rollups.window_series(project_id=project.pk, start=utc(start), end=utc(end), points=6,
                                 histograms=rollups.HISTOGRAMS)
    bare = rollups.window_series(project_id=project.pk, start=utc(start), end=utc(end), points=6, histograms=())
    for d, f, b in zip(default.buckets, full.buckets, bare.buckets):
        if d is None:  # the bucket holding the window's end, when the end falls on a step boundary
            assert f is None and b is None
            continue
        assert d.requests == f.requests == b.requests and d.phase_mean_ms == b.phase_mean_ms
        assert d.e2e_ms == f.e2e_ms and d.phase_ms["network"] == f.phase_ms["network"] and d.ttft_ms == f.ttft_ms
        assert d.phase_ms["inference"][0.95] is None and f.phase_ms["inference"][0.95] is not None
        assert b.e2e_ms[0.5] is None
    with pytest.raises(ValueError):
        rollups.window_series(project_id=project.pk, start=utc(start), end=utc(end), histograms=("nope",))


def test_stats_without_percentiles(seeded):
    project, start, end = seeded
    full = rollups.window_stats(project_id=project.pk, start=utc(start), end=utc(end))
    bare = rollups.window_stats(project_id=project.pk, start=utc(start), end=utc(end), histograms=())
    # ClickHouse sums Float64 in whatever order its threads finish: two reads of the same rows may
    # differ in the last bit (seen once: 0.24238500000000002 vs …04), never more.
    assert bare.requests == full.requests == 1200 and bare.cost_usd == pytest.approx(full.cost_usd, rel=1e-12)
    assert bare.e2e_ms[0.95] is None and full.e2e_ms[0.95] is not None


def test_an_idle_project_writes_nothing(project_with_key, settings):
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0  # (with an overlap, idle from its end on)
    project, _ = project_with_key()
    insert_spans(project.pk, random_trace(random.Random(3), start_ns=time.time_ns() - 120 * NS))
    run_tasks(project.pk)

    def rows():
        return [get_store().query(f"SELECT count() FROM {t} WHERE project_id = {{p:UInt64}}", {"p": project.pk},
                                  tag="tests.rollups.rows").scalar()
                for t in ("traces", "rollup_minute", "rollup_day_all", "task_watermarks")]

    before = rows()
    assert before[0] == 1 and before[1] >= 1
    for _ in range(3):
        assert rollup_services.rollups_update(project_ids=[project.pk]).minutes == 0
        summarizer.traces_summarize(project_ids=[project.pk])
    after = rows()
    assert after == before  # no summaries, no rollup rows, no watermarks: an idle project writes nothing


@pytest.mark.django_db(transaction=False)
def test_any_arrival_order_with_reruns_stays_exact(db):
    """Property: whatever order a trace's spans arrive in, whatever is re-sent and however often
    the tasks run in between, the rollups end up equal to the figures over the raw spans."""
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

    from projects.services import project_create

    # two days ago: every hour, six hours and day has ended, so each run recomputes them with their
    # minutes (a bucket under way waits for its end: test_an_hour_six_hours_and_day_under_way_...)
    base = (time.time_ns() - 2 * 86400 * NS) // (60 * NS) * 60 * NS

    @hsettings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 10**6), traces=st.integers(1, 8), rounds=st.integers(1, 3),
           resend=st.floats(0, 0.5), runs=st.lists(st.integers(0, 2), min_size=3, max_size=3))
    def check(seed, traces, rounds, resend, runs):
        rng = random.Random(seed)
        project, _ = project_create(name=f"prop-{uuid.uuid4().hex}")
        spans = [s for _ in range(traces)
                 for s in random_trace(rng, start_ns=base + rng.randrange(0, 2 * 3600 * NS), model=rng.choice("xy"),
                                       error=rng.random() < 0.2)]
        plan = [[] for _ in range(rounds)]
        for span in spans:
            plan[rng.randrange(rounds)].append(span)
            if rng.random() < resend:
                plan[rng.randrange(rounds)].append(span)
        for i, batch in enumerate(plan):
            if batch:
                insert_spans(project.pk, batch)
            for _ in range(runs[i]):
                run_tasks(project.pk)
        run_tasks(project.pk)
        window = (base - 86400 * NS, base + 4 * 86400 * NS)  # hours, six hours, days and minutes
        stats = rollups.window_stats(project_id=project.pk, start=utc(window[0]), end=utc(window[1]))
        exact = exact_from_spans(project.pk, start_ns=window[0], end_ns=window[1])
        assert stats.requests == exact["requests"] and stats.errors == exact["errors"]
        assert stats.output_tokens == exact["output_tokens"]
        assert stats.cost_usd == pytest.approx(exact["cost_usd"], abs=1e-12)
        assert_close(stats.e2e_ms, exact_ms(exact["e2e"]), "e2e")
        assert_close(stats.ttft_ms, exact_ms(exact["ttft"]), "ttft")
        minute = _table_totals(project.pk, "rollup_minute")
        assert minute["requests"] == exact["requests"]
        assert _table_totals(project.pk, "rollup_day") == minute == _table_totals(project.pk, "rollup_day_all")

    check()


def test_a_stream_whose_tokens_all_came_with_the_first_rolls_up(project_with_key):
    """A streamed call whose TTFT is its whole duration (every token in the first chunk, as a fast
    or cached answer gives) has a TPOT of 0, and one with a single token has none: the rollup keys
    them without failing and the percentiles stay readable (a served demo's rollup run once failed on such a value: log(0)
    cannot be cast to an integer where ClickHouse evaluates both branches of the key's ``if``)."""
    project, _ = project_with_key()
    rng = random.Random(17)
    now = time.time_ns()
    instant = random_trace(rng, start_ns=now - 180 * NS)
    call = next(s for s in instant if s["phase"] == "inference")
    call["ttft_ms"] = call["duration_ms"]
    others = [random_trace(rng, start_ns=now - 170 * NS + i * NS) for i in range(5)]
    # One output token: no TPOT (NULL), whatever the column's slot under the NULL holds (0/0 = NaN
    # for the call whose one token came at its end, inf for the other).
    for i, trace in enumerate(others[:2]):
        one = next(s for s in trace if s["phase"] == "inference")
        one["output_tokens"] = 1
        if i == 0:
            one["ttft_ms"] = one["duration_ms"]
    insert_spans(project.pk, [s for t in [instant, *others] for s in t])
    run_tasks(project.pk)
    tpots = get_store().query("SELECT tpot_ns FROM traces FINAL WHERE project_id = {p:UInt64} ORDER BY start_time",
                              {"p": project.pk}, tag="tests.rollups.tpot").rows
    assert tpots[0] == (0.0,) and tpots[1] == tpots[2] == (None,) and all(t[0] > 0 for t in tpots[3:]), tpots
    start = datetime.fromtimestamp((now - 600 * NS) / NS, tz=timezone.utc)
    stats = rollups.window_stats(project_id=project.pk, start=start, end=datetime.now(timezone.utc))
    assert stats.requests == 6 and stats.tpot_ms[0.5] is not None


def test_the_late_window_is_recovered_at_most_once_an_interval(project_with_key, settings):
    """Marked minutes are recomputed on every run; the whole late-arrival window only when
    TRACEDASH_ROLLUP_LATE_EVERY_SECONDS have passed since it last was (or on every run at 0)."""
    settings.TRACEDASH_ROLLUP_LATE_SECONDS = 600
    settings.TRACEDASH_ROLLUP_LATE_EVERY_SECONDS = 3600
    project, _ = project_with_key()
    rng = random.Random(11)
    window_minutes = 600 // 60  # (the current minute waits until it has ended)

    insert_spans(project.pk, random_trace(rng, start_ns=time.time_ns() - 120 * NS))
    summarizer.traces_summarize(project_ids=[project.pk])
    first = rollup_services.rollups_update(project_ids=[project.pk])
    assert first.minutes >= window_minutes  # the first run covers the window

    late_start = time.time_ns() - 3 * 3600 * NS  # a late trace, hours before the window
    insert_spans(project.pk, random_trace(rng, start_ns=late_start))
    summarizer.traces_summarize(project_ids=[project.pk])
    second = rollup_services.rollups_update(project_ids=[project.pk])
    assert 1 <= second.minutes <= 2  # only the marked minute(s): the window was covered an instant ago
    minute = utc(late_start // (60 * NS) * 60 * NS)
    requests = get_store().query(
        "SELECT sum(requests) FROM rollup_minute FINAL WHERE project_id = {p:UInt64} AND bucket = {b:DateTime('UTC')}",
        {"p": project.pk, "b": minute.strftime("%Y-%m-%d %H:%M:%S")}, tag="tests.rollups.late_minute").scalar()
    assert int(requests) == 1  # the late trace is in its minute's rollup all the same

    settings.TRACEDASH_ROLLUP_LATE_EVERY_SECONDS = 0
    insert_spans(project.pk, random_trace(rng, start_ns=time.time_ns() - 60 * NS))
    summarizer.traces_summarize(project_ids=[project.pk])
    assert rollup_services.rollups_update(project_ids=[project.pk]).minutes >= window_minutes


def test_an_open_minute_is_rolled_up_once_it_has_ended_and_read_from_the_summaries_until_then(project_with_key, settings):
    """A run does not recompute the minute still going on (its traces keep arriving: at the default
    10 s it was recomputed about six times); it recomputes it at its first run after the minute
    ended, marks or not. Until then every read takes that minute from the summaries, so a window
    never misses a request the rollups do not hold yet."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    minute = (time.time_ns() - 3600 * NS) // (60 * NS) * 60 * NS  # "now" below is 30 s into this minute
    insert_spans(project.pk, random_trace(random.Random(12), start_ns=minute + 10 * NS, service="late-svc"))
    summarizer.traces_summarize(project_ids=[project.pk])

    def rolled_up() -> int:
        return int(get_store().query(
            "SELECT sum(requests) FROM rollup_minute FINAL WHERE project_id = {p:UInt64} AND bucket = {b:DateTime('UTC')}",
            {"p": project.pk, "b": utc(minute).strftime("%Y-%m-%d %H:%M:%S")}, tag="tests.rollups.open_minute").scalar())

    def shown(end_ns: int) -> int:
        return rollups.window_stats(project_id=project.pk, start=utc(minute - 600 * NS), end=utc(end_ns)).requests

    rollup_services.rollups_update(project_ids=[project.pk], now_ns=minute + 30 * NS)
    assert rolled_up() == 0  # open: not recomputed
    assert rollup_services.rollups_ready_ns(project_id=project.pk) == minute
    assert shown(minute + 30 * NS) == 1  # the partial minute, from the summaries
    assert shown(minute + 120 * NS) == 1  # the whole minute too: the rollups do not hold it yet
    assert panel_selectors.first_request_since(project_id=project.pk, since=utc(minute - 600 * NS)) == utc(minute)
    assert "late-svc" in panel_selectors.panel_facets(project_id=project.pk, start=utc(minute - 600 * NS),
                                                      end=utc(minute + 30 * NS))["services"]

    report = rollup_services.rollups_update(project_ids=[project.pk], now_ns=minute + 70 * NS)  # no new marks
    assert report.minutes == 1 and rolled_up() == 1  # recomputed once it ended
    assert rollup_services.rollups_ready_ns(project_id=project.pk) == minute + 60 * NS
    assert shown(minute + 120 * NS) == 1
    assert panel_selectors.first_request_since(project_id=project.pk, since=utc(minute - 600 * NS)) == utc(minute)

    def watermarks() -> int:
        return int(get_store().query("SELECT count() FROM task_watermarks WHERE project_id = {p:UInt64}",
                                     {"p": project.pk}, tag="tests.rollups.watermarks").scalar())

    before = watermarks()
    assert rollup_services.rollups_update(project_ids=[project.pk], now_ns=minute + 130 * NS).minutes == 0
    assert watermarks() == before  # idle again: nothing written


def test_the_summarisers_marks_are_held_in_memory_until_its_watermark_is_stored(project_with_key, monkeypatch):
    """On the embedded store a summariser run holds the minutes to roll up again in memory
    (analytics.rollup_marks) while its watermark moves in memory alone; the rollup run recomputes
    them and forgets them; and they are inserted into ``rollup_dirty`` just before the watermark is
    stored (a restart starts from the watermark stored and summarises, and marks, again what came
    after it: no minute is left behind)."""
    from analytics import rollup_marks, watermarks

    project, _ = project_with_key()
    store = get_store()
    held = rollup_marks.held_for(store)
    rng = random.Random(41)
    base = (time.time_ns() - 3 * 3600 * NS) // (60 * NS) * (60 * NS)  # a minute start, hours ago
    minute = lambda k: base // NS + 60 * k  # noqa: E731 - the k-th minute, unix s

    def stored_marks() -> set[int]:
        return {int(r[0]) for r in store.query(
            "SELECT DISTINCT toUnixTimestamp(bucket) FROM rollup_dirty WHERE project_id = {p:UInt64}"
            " AND bucket >= toDateTime({m:UInt32})", {"p": project.pk, "m": minute(0)}, tag="tests.rollups.marks").rows}

    def rolled_up(k: int) -> int:
        return int(store.query("SELECT sum(requests) FROM rollup_minute FINAL WHERE project_id = {p:UInt64}"
                               " AND bucket = toDateTime({m:UInt32})", {"p": project.pk, "m": minute(k)},
                               tag="tests.rollups.minute").scalar() or 0)

    def held_minutes() -> set[int]:
        return {m // NS for m in held.taken(project.pk)[0]}

    storing = []
    real_insert = store.insert
    monkeypatch.setattr(store, "insert", lambda table, rows, **kw: (storing.append((table, None)),
                                                                    real_insert(table, rows, **kw))[1])

    insert_spans(project.pk, random_trace(rng, start_ns=base + 10 * NS))
    summarizer.traces_summarize(project_ids=[project.pk])  # the watermark stored: the marks just before it
    assert stored_marks() == {minute(0)} and held_minutes() == set()
    assert [t for t, _ in storing if t in ("rollup_dirty", "task_watermarks")] == ["rollup_dirty", "task_watermarks"]

    storing.clear()
    insert_spans(project.pk, random_trace(rng, start_ns=base + 70 * NS))
    summarizer.traces_summarize(project_ids=[project.pk])  # the watermark moves in memory: the mark is held
    assert stored_marks() == {minute(0)} and held_minutes() == {minute(1)}
    assert not [t for t, _ in storing if t in ("rollup_dirty", "task_watermarks")]
    rollup_services.rollups_update(project_ids=[project.pk])
    assert (rolled_up(0), rolled_up(1)) == (1, 1) and held_minutes() == set(), "recomputed, then forgotten"

    insert_spans(project.pk, random_trace(rng, start_ns=base + 130 * NS))
    summarizer.traces_summarize(project_ids=[project.pk])
    assert held_minutes() == {minute(2)} and minute(2) not in stored_marks()
    # Ten seconds of progress later the watermark is stored, and the marks held just before it.
    storing.clear()
    insert_spans(project.pk, random_trace(rng, start_ns=base + 190 * NS))
    monkeypatch.setattr(watermarks.KnownWatermarks, "advance", lambda self, *args, **kwargs: False)
    summarizer.traces_summarize(project_ids=[project.pk])
    assert stored_marks() >= {minute(2), minute(3)} and held_minutes() == set()
    assert [t for t, _ in storing if t in ("rollup_dirty", "task_watermarks")] == ["rollup_dirty", "task_watermarks"]
    rollup_services.rollups_update(project_ids=[project.pk])
    assert (rolled_up(2), rolled_up(3)) == (1, 1)


def test_held_marks_made_again_after_the_rollups_took_them_stay():
    """A minute marked again while a rollup run recomputes it (after it took the marks) is kept for
    the next run; ``flush`` stores what is held and forgets it; a server's store holds nothing."""
    from types import SimpleNamespace

    from analytics import rollup_marks

    held = rollup_marks.HeldMarks()
    held.add(7, [60 * NS, 120 * NS])
    minutes, sequence = held.taken(7)
    assert minutes == [60 * NS, 120 * NS] and held.taken(8) == ([], sequence)
    held.add(7, [120 * NS])  # marked again meanwhile
    held.done(7, sequence)
    assert held.taken(7)[0] == [120 * NS]
    inserted = []
    held.flush(SimpleNamespace(insert=lambda table, rows, tag: inserted.append((table, rows))), 7)
    assert inserted == [("rollup_dirty", [{"project_id": 7, "bucket": 120 * NS}])] and held.taken(7)[0] == []
    assert rollup_marks.held_for(SimpleNamespace(kind="native")) is None


def test_a_rollup_run_stores_its_watermarks_in_one_insert_and_only_those_that_move(project_with_key, monkeypatch):
    """Under traffic every run defers the open minute: its watermark is written when it moves (once
    a minute), not on every run, and the run's watermarks travel in one insert."""
    project, _ = project_with_key()
    store = get_store()
    rng = random.Random(43)
    writes = []
    real_insert = store.insert
    monkeypatch.setattr(store, "insert", lambda table, rows, **kw: (
        writes.append(sorted(r["job"] for r in rows)) if table == "task_watermarks" else None,
        real_insert(table, rows, **kw))[1])
    second = time.time() % 60
    if not 5 < second < 40:  # both runs' traces and runs within one open minute
        time.sleep((65 - second) % 60)
    for run in range(2):
        insert_spans(project.pk, random_trace(rng, start_ns=time.time_ns() - NS))
        summarizer.traces_summarize(project_ids=[project.pk])
        writes.clear()
        rollup_services.rollups_update(project_ids=[project.pk])
        assert len(writes) == 1 and "rollup" in writes[0], writes
        deferred = summarizer.watermark_get(project_id=project.pk, job=rollup_services.DEFERRED_JOB)
        assert deferred == (time.time_ns() // NS // 60 + 1) * 60_000, "the open minute, deferred"
        if run:
            assert "rollup_deferred" not in writes[0], writes  # the same open minute: not written again
