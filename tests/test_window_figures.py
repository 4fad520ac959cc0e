"""Figures that mean what they say (DOMAIN.md "Status", "Over a time window", "Cost"):

- a request's status is its root's: a 429 answered by a successful retry is ``recovered``, never
  counted as an error (tiles, charts, rollups, compare, series API, alerts, explorer filter);
- every window counts exactly the requests whose root starts in it, whatever second it starts on
  (the tile, the chart's buckets and the exact count agree; the previous period shares nothing);
- the monthly projection is based on the time the data covers, and says so;
- RPS is shown twice: the current rate and the window's average;
- each model call is priced and counted under its own model.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from alerts.latency import latency_fetch
from analytics import rollups
from store import get_store
from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace, span_id

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9
MS = 10**6


def utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // 1000 / 1e6, tz=timezone.utc).replace(microsecond=ns // 1000 % 1_000_000)


def iso(ns: int) -> str:
    return utc(ns).isoformat().replace("+00:00", "Z")


def retried(start_ns: int) -> list[dict]:
    """The first model call answered 429, the retry succeeded: the root is ok."""
    spans = llm_trace(start_ns=start_ns)
    spans.append({"trace_id": spans[0]["trace_id"], "span_id": span_id(), "parent_span_id": spans[0]["span_id"],
                  "name": "inference", "phase": "inference", "service": "chat-api", "model": "gpt-4o-mini",
                  "start_time": start_ns + 200 * MS, "duration_ms": 5, "status": "error",
                  "status_message": "429 Too Many Requests"})
    return spans


def minute_ago(minutes: int) -> int:
    return (time.time_ns() - minutes * 60 * S) // (60 * S) * (60 * S)


@pytest.fixture
def statuses(make_user, project_with_key):
    alice = make_user()
    project, key = project_with_key(members=[alice])
    t0 = minute_ago(30)
    ok, recovered, failed = llm_trace(start_ns=t0 + 10 * S), retried(t0 + 20 * S), llm_trace(start_ns=t0 + 30 * S,
                                                                                               error=True)
    rootless = llm_trace(start_ns=t0 + 40 * S, error=True)[1:]
    rootless[0].update(status="error", status_message="connection reset")
    seed_rolled_up(project_id=project.pk, traces=[ok, recovered, failed, rootless])
    ids = {"ok": ok[0]["trace_id"], "recovered": recovered[0]["trace_id"], "failed": failed[0]["trace_id"],
           "rootless": rootless[0]["trace_id"]}
    # A 2-hour window starting on a :30 second: its series come from the rollups (1-minute steps).
    window = {"from": iso(t0 - 2 * 3600 * S + 30 * S), "to": iso(t0 + 10 * 60 * S + 30 * S)}
    return {"user": alice, "project": project, "key": key, "ids": ids, "t0": t0, "window": window}


def test_a_retried_call_is_recovered_not_an_error_anywhere(client, statuses):
    client.force_login(statuses["user"])
    project, window, ids = statuses["project"], statuses["window"], statuses["ids"]
    body = client.get("/overview.json", window).json()
    stats = body["stats"]
    assert (stats["requests"], stats["errors"], stats["recovered"], stats["error_spans"]) == (3, 1, 1, 2)
    assert stats["error_rate"] == pytest.approx(1 / 3)
    kpis = {k["key"]: k["value"] for k in body["kpis"]}
    assert kpis["error_rate"] == pytest.approx(100 / 3) and kpis["recovered"] == 1 and kpis["error_spans"] == 2
    assert body["series"]["step_seconds"] >= 60  # the chart reads the rollups
    error_rates = [v for v in body["figures"]["fig-traffic"]["data"][1]["y"] if v is not None]
    assert error_rates == [pytest.approx(100 / 3, abs=0.01)]
    # the rollups themselves
    errors, recovered, error_spans = get_store().query(
        "SELECT sum(errors), sum(recovered), sum(error_spans) FROM rollup_minute FINAL WHERE project_id = {p:UInt64}",
        {"p": project.pk}, tag="tests.window_figures").rows[0]
    assert (errors, recovered, error_spans) == (1, 1, 2)
    # compare (B: the window) and the series API
    compare = client.get("/compare.json", {"mode": "windows", "b_from": window["from"], "b_to": window["to"],
                                           "a_from": "2026-01-01T00:00:00Z", "a_to": "2026-01-01T01:00:00Z"}).json()
    assert compare["b"]["stats"]["error_rate"] == pytest.approx(1 / 3) and compare["b"]["stats"]["recovered"] == 1
    api = client.get("/api/v1/series/overview", window, HTTP_AUTHORIZATION=f"Bearer {statuses['key']}").json()
    assert (api["stats"]["errors"], api["stats"]["recovered"], api["stats"]["error_spans"]) == (1, 1, 2)
    assert api["stats"]["error_rate"] == pytest.approx(1 / 3)
    # the alerts' error figure (from the raw spans, per root service)
    (series,) = latency_fetch(project_id=project.pk, window_seconds=3600,
                              now=utc(statuses["t0"] + 5 * 60 * S))
    assert series.values["error_rate_percent"] == pytest.approx(100 / 3)
    # the explorer: its own filter value and badge; a trace without a root is an error when a span is
    rows = client.get("/traces/rows.json", {**window, "status": "recovered"}).json()["rows"]
    assert [(r["trace_id"], r["status"]) for r in rows] == [(ids["recovered"], "recovered")]
    errors = {r["trace_id"] for r in client.get("/traces/rows.json", {**window, "status": "error"}).json()["rows"]}
    assert errors == {ids["failed"], ids["rootless"]}
    listing = client.get("/traces/", {**window, "status": "recovered"}).content.decode()
    assert "status-recovered" in listing
    page = client.get(f"/traces/{ids['recovered']}/").content.decode()
    assert "status-recovered" in page and 'id="trace-recovered"' in page and "429 Too Many Requests" in page
    api_trace = client.get(f"/api/v1/traces/{ids['recovered']}").json()["summary"]
    assert (api_trace["status"], api_trace["error_spans"]) == ("recovered", 1)


def test_a_window_starting_on_a_half_minute_counts_exactly(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    t0 = minute_ago(40)
    starts = [t0 + k * 7 * S + 123 * MS for k in range(200)]  # one root every 7 s for 23 minutes
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=s) for s in starts])

    def exact(lo: int, hi: int) -> int:
        return sum(lo <= s < hi for s in starts)

    client.force_login(alice)
    lo, hi = t0 + 3 * 60 * S + 30 * S, t0 + 15 * 60 * S + 30 * S  # 12 minutes from hh:mm:30
    for window_lo, window_hi in ((lo, hi), (lo - (hi - lo), lo), (t0 + 10 * S, t0 + 50 * S)):
        body = client.get("/overview.json", {"from": iso(window_lo), "to": iso(window_hi)}).json()
        n = exact(window_lo, window_hi)
        assert body["stats"]["requests"] == n  # the tile …
        assert sum(b["requests"] for b in body["series"]["buckets"] if b) == n  # … the chart's buckets
        assert body["stats"]["output_tokens"] == 164 * n and body["stats"]["cost_usd"] == pytest.approx(0.00042 * n)
    # previous period + this one = the window covering both: the boundary minute is counted once
    stats = body = client.get("/overview.json", {"from": iso(lo), "to": iso(hi)}).json()
    assert stats["stats"]["requests"] + stats["previous"]["requests"] == exact(lo - (hi - lo), hi)
    # long windows (hours and days from the rollups) are exact at their edges too
    wide = rollups.window_stats(project_id=project.pk, start=utc(t0 - 3 * 86400 * S + 30 * S), end=utc(lo))
    assert wide.requests == exact(0, lo) and wide.e2e_ms[0.5] is not None
    series = rollups.window_series(project_id=project.pk, start=utc(lo), end=utc(hi), points=4)
    assert series.step_seconds >= 60 and sum(b.requests for b in series.buckets if b) == exact(lo, hi)


def test_projection_is_based_on_the_time_the_data_covers(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    now = time.time_ns()
    traces = [llm_trace(start_ns=now - (37 * 60 - 30 * i) * S) for i in range(10)]  # the first 37 minutes ago
    for t in traces:
        t[3]["cost_usd"] = 0.01
    seed_rolled_up(project_id=project.pk, traces=traces)
    client.force_login(alice)
    body = client.get("/costs.json?range=1h").json()
    covered = body["projection_covered_seconds"]
    assert 37 * 60 <= covered < 38 * 60
    assert body["projected_monthly_usd"] == pytest.approx(0.1 * 30 * 86400 / covered)  # not 0.1 × 30 / 7
    assert "based on 37 minutes of data" in body["projection"]
    assert "based on 37 minutes of data" in client.get("/costs/?range=1h").content.decode()


def test_current_rps_beside_the_window_average(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    now = time.time_ns()
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=now - 4 * 60 * S + i * 3 * S) for i in range(60)])
    client.force_login(alice)
    body = client.get("/overview.json?range=24h").json()
    kpis = {k["key"]: k for k in body["kpis"]}
    assert kpis["rps"]["label"] == "RPS (window average)" and kpis["rps"]["value"] == pytest.approx(60 / 86400)
    assert kpis["rps_current"]["label"] == "RPS (last 5 min)" and kpis["rps_current"]["value"] == pytest.approx(60 / 300)
    assert body["current"]["requests"] == 60
    html = client.get("/?range=24h").content.decode()
    assert "RPS (last 5 min)" in html and "RPS (window average)" in html


def test_a_two_model_trace_charges_each_model_its_own_call(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    now = time.time_ns()
    spans = llm_trace(model="small", start_ns=now - 10 * 60 * S)  # its inference call: 812 in, 164 out, 0.00042
    spans.append({"trace_id": spans[0]["trace_id"], "span_id": span_id(), "parent_span_id": spans[0]["span_id"],
                  "name": "rerank", "phase": "inference", "service": "chat-api", "model": "large",
                  "start_time": now - 10 * 60 * S + 1000 * MS, "duration_ms": 100, "input_tokens": 2000,
                  "output_tokens": 10, "cost_usd": 0.03})
    seed_rolled_up(project_id=project.pk, traces=[spans])
    client.force_login(alice)
    body = client.get("/costs.json?range=1h").json()
    by_model = {m["model"]: m for m in body["by_model"]}
    assert by_model["small"]["cost_usd"] == pytest.approx(0.00042) and by_model["large"]["cost_usd"] == pytest.approx(0.03)
    assert (by_model["small"]["input_tokens"], by_model["small"]["output_tokens"]) == (812, 164)
    assert (by_model["large"]["input_tokens"], by_model["large"]["output_tokens"]) == (2000, 10)
    spend = {t["name"]: sum(v for v in t["y"] if v) for t in body["figures"]["fig-spend"]["data"]}
    assert spend == {"small": pytest.approx(0.00042), "large": pytest.approx(0.03)}
    tokens = {t["name"]: dict(zip(t["x"], t["y"])) for t in body["figures"]["fig-model-tokens"]["data"]}
    assert tokens["input tokens"] == {"large": 2000, "small": 812}
    # longer windows read the hour rollups: the same split
    api = client.get("/api/v1/series/costs?range=7d").json()
    assert {m["model"]: m["cost_usd"] for m in api["by_model"]} == {"large": pytest.approx(0.03),
                                                                   "small": pytest.approx(0.00042)}
    spend = {m: sum(v for v in vs if v) for m, vs in api["spend_by_model"]["cost_usd"].items()}
    assert spend == {"large": pytest.approx(0.03), "small": pytest.approx(0.00042)}
    html = client.get("/costs/?range=1h").content.decode()
    assert 'id="model-totals"' in html and 'data-model="large"' in html
