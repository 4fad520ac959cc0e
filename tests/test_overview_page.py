"""Overview `/`: KPIs against the previous period, series, phase breakdown and latency
distribution from the per-trace summaries, scoped to the user's project and filters."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlparse

import pytest

from analytics.panel_selectors import window_stats
from dashboard.panels import _at_least
from dashboard.timewindow import window_from_query
from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9


def shaped_trace(*, start_ns, e2e_ms, service="chat-api", model="gpt-4o-mini", error=False, inference_ms=None):
    """``llm_trace`` with the root stretched to ``e2e_ms`` (the phases keep their 1160 ms unless
    ``inference_ms`` changes the model call)."""
    spans = llm_trace(service=service, model=model, start_ns=start_ns, error=error)
    spans[0]["duration_ms"] = e2e_ms
    if inference_ms is not None:
        spans[3]["duration_ms"] = inference_ms
        spans[4]["start_time"] = spans[3]["start_time"] + int(inference_ms * 1e6)
    return spans


def exact_quantile(values, q):
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@pytest.fixture
def seeded(make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    other, _ = project_with_key()
    now = time.time_ns()
    current = [1300 + 10 * i for i in range(40)]  # 1300 … 1690 ms, in the last hour
    traces = [shaped_trace(start_ns=now - (50 - i) * 60 * S, e2e_ms=ms, error=i % 10 == 0)
              for i, ms in enumerate(current)]
    traces += [shaped_trace(start_ns=now - 30 * 60 * S, e2e_ms=5000, service="search", model="llama-3")]
    previous = [shaped_trace(start_ns=now - 90 * 60 * S + i * S, e2e_ms=1250) for i in range(20)]  # hour before
    seed_rolled_up(project_id=project.pk, traces=traces + previous)
    seed_rolled_up(project_id=other.pk, traces=[shaped_trace(start_ns=now - 60 * S, e2e_ms=99_000)])
    return {"user": alice, "project": project, "current": current}


def test_window_stats_are_exact_and_scoped(seeded):
    window = window_from_query({"range": "1h"})
    stats = window_stats(project_id=seeded["project"].pk, start=window.start, end=window.end, service="chat-api")
    assert stats.requests == 40 and stats.errors == 4
    assert stats.error_rate == 0.1 and stats.availability == 0.9
    for q in (0.5, 0.95, 0.99):
        assert stats.e2e_ms[q] == pytest.approx(exact_quantile(seeded["current"], q), rel=0.01)
    assert stats.ttft_ms[0.95] == pytest.approx(210.5)
    assert stats.input_tokens == 40 * 812 and stats.output_tokens == 40 * 164
    assert stats.cost_usd == pytest.approx(40 * 0.00042)
    assert stats.cost_per_request == pytest.approx(0.00042)
    assert stats.cost_per_1k_tokens == pytest.approx(0.00042 / ((812 + 164) / 1000))
    assert stats.phase_mean_ms["inference"] == pytest.approx(900)
    assert stats.inference_share == pytest.approx(900 / (sum(seeded["current"]) / 40))
    everything = window_stats(project_id=seeded["project"].pk, start=window.start, end=window.end)
    assert everything.requests == 41  # + the search trace; never the other project's
    llama = window_stats(project_id=seeded["project"].pk, start=window.start, end=window.end, model="llama-3")
    assert llama.requests == 1 and llama.e2e_ms[0.5] == 5000


def test_overview_page_shows_kpis_with_change_and_linked_charts(client, seeded):
    client.force_login(seeded["user"])
    response = client.get("/?range=1h&service=chat-api")
    assert response.status_code == 200
    html = response.content.decode()
    requests_tile = html[html.index('data-kpi="requests"'):]
    requests_tile = requests_tile[:requests_tile.index('data-kpi="rps"')]
    assert '<div class="value"><span class="num">40</span></div>' in requests_tile
    assert "+100.0 % vs previous" in requests_tile  # 40 now, 20 in the hour before
    p95_tile = html[html.index('data-kpi="e2e_p95"'):html.index('data-kpi="e2e_p99"')]
    assert 'class="delta worse"' in p95_tile  # P95 rose from 1250 ms
    for chart in ("fig-traffic", "fig-latency", "fig-breakdown", "fig-throughput", "fig-heatmap", "fig-histogram"):
        assert f'data-figure="{chart}"' in html

    body = client.get("/overview.json?range=1h&service=chat-api").json()
    assert body["stats"]["requests"] == 40 and body["previous"]["requests"] == 20
    breakdown = body["figures"]["fig-breakdown"]
    names = [t["name"] for t in breakdown["data"]]
    assert names[:5] == ["network", "preprocess", "inference", "postprocess", "other"]
    inference = breakdown["data"][2]
    assert {v for v in inference["y"] if v is not None} == {900.0}
    shapes = breakdown["layout"]["shapes"]
    assert {s.get("y0") for s in shapes} >= {1500.0, 200.0, 60.0}  # P95, network and inference-share lines
    latency = body["figures"]["fig-latency"]
    p95 = next(t for t in latency["data"] if t["name"] == "E2E P95")
    i = next(i for i, v in enumerate(p95["y"]) if v is not None)
    link = urlparse(p95["customdata"][i])
    assert link.path == "/traces/"
    query = parse_qs(link.query)
    assert query["service"] == ["chat-api"] and query["from"][0] == body["series"]["times"][i].replace("+00:00", "Z")
    heat = body["figures"]["fig-heatmap"]["data"][0]
    row = heat["y"].index("1500–2000 ms")
    cell = next(i for i, z in enumerate(heat["z"][row]) if z)
    band_link = parse_qs(urlparse(heat["customdata"][row][cell]).query)
    assert band_link["min_ms"] == ["1500"] and band_link["max_ms"] == ["2000"] and band_link["service"] == ["chat-api"]
    errors = next(t for t in body["figures"]["fig-traffic"]["data"] if t["name"] == "error rate %")
    assert all("status=error" in link for link in errors["customdata"])
    hist = body["figures"]["fig-histogram"]
    assert sum(hist["data"][0]["y"]) == 40
    assert hist["data"][0]["y"][hist["data"][0]["x"].index("1500–2000 ms")] == 20  # 1500 … 1690 ms


def test_overview_json_carries_each_tiles_link_as_the_page_renders_it(client, seeded):
    """The live page puts ``traces_url`` of overview.json in each tile's link: it must be the link
    the page itself renders for the same query (one builder, explorer_tags.kpi_traces_link)."""
    import html as html_lib
    import re

    client.force_login(seeded["user"])
    query = f"range=1h&service=chat-api&project={seeded['project'].pk}"
    page = client.get(f"/?{query}").content.decode()
    rendered = {key: html_lib.unescape(href) for key, href in re.findall(
        r'<div class="kpi" data-kpi="([^"]+)">\s*<div class="label"><a class="kpi-traces" href="([^"]*)"', page)}
    body = client.get(f"/overview.json?{query}").json()
    from_json = {k["key"]: k["traces_url"] for k in body["kpis"]}
    assert rendered and from_json == rendered
    p99 = parse_qs(urlparse(from_json["e2e_p99"]).query)
    assert p99["sort"] == ["duration"] and p99["dir"] == ["desc"] and p99["service"] == ["chat-api"]
    p99_value = next(k["value"] for k in body["kpis"] if k["key"] == "e2e_p99")
    assert p99["min_ms"] == [_at_least(p99_value)] and p99_value * 0.99 < float(p99["min_ms"][0]) < p99_value


def test_overview_filters_change_the_numbers_and_bad_input_is_a_clear_error(client, seeded, make_user):
    client.force_login(seeded["user"])
    search = client.get("/overview.json?range=1h&service=search").json()
    assert search["stats"]["requests"] == 1 and search["stats"]["e2e_ms"]["p50"] == pytest.approx(5000, rel=0.005)
    bad = client.get("/overview.json?range=forever")
    assert bad.status_code == 400 and "range must be one of" in bad.json()["error"]["message"]
    page = client.get("/?from=yesterday")
    assert page.status_code == 200 and "from/to must be ISO 8601" in page.content.decode()
    client.logout()
    anonymous = client.get("/overview.json?range=1h")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "not_authenticated"
    assert client.get("/?range=1h").status_code == 302  # the page itself goes to the login form
    stranger = make_user()
    client.force_login(stranger)
    assert client.get(f"/?project={seeded['project'].pk}").status_code == 404


def test_store_down_is_a_503_page_and_json_error(client, seeded, monkeypatch):
    from analytics import rollups
    from store import StoreError

    def down(**kwargs):
        raise StoreError("connection refused", tag="tests")

    monkeypatch.setattr(rollups, "window_series", down)
    client.force_login(seeded["user"])
    page = client.get("/?range=1h")
    assert page.status_code == 503 and "trace store is unavailable" in page.content.decode()
    body = client.get("/overview.json?range=1h")
    assert body.status_code == 503 and body.json()["error"]["code"] == "store_unavailable"
    assert client.get("/costs/?range=1h").status_code == 503
