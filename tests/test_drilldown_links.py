"""Each chart series links to the traces behind its own points (issue 14, item 6): a latency
percentile to its bucket's traces at or above it, slowest first; TTFT to TTFT at or above; a phase
bar to the traces whose slowest phase it is; error rate to the error traces; cost to the dearest
first; the resources' load and device charts to their bucket's traces. And following a P99 link
lists the trace at that P99."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest

from dashboard.panels import _at_least
from tests.panel_seed import seed_rolled_up
from tests.test_overview_page import shaped_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9


def first_link(trace):
    return next((c, y) for c, y in zip(trace["customdata"], trace["y"]) if y is not None)


def q(link):
    assert link.startswith("/traces/?from=") and "&to=" in link
    return {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}


@pytest.fixture
def member(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    minute = (time.time_ns() // (60 * S) - 20) * 60 * S
    durations = [100 + 10 * i for i in range(48)] + [5000, 9000]
    seed_rolled_up(project_id=project.pk, traces=[
        shaped_trace(start_ns=minute + S + i * S // 4, e2e_ms=ms, error=i in (3, 7), inference_ms=2000 if ms == 9000 else None)
        for i, ms in enumerate(durations)])
    return client, project


def test_at_least_is_the_bottom_of_the_percentiles_histogram_bucket():
    assert float(_at_least(9000.0)) == pytest.approx(9000 * 1.01 ** -1 * (1.01 + 1) / 2, abs=0.002)
    assert float(_at_least(9000.0)) < 9000.0 and float(_at_least(0.0)) == 0.0


def test_each_overview_series_links_to_its_own_traces(member):
    client, _ = member
    figs = client.get("/overview.json", {"range": "1h", "service": "chat-api"}).json()["figures"]
    latency = {t["name"]: t for t in figs["fig-latency"]["data"]}
    for name in ("E2E P50", "E2E P95", "E2E P99"):
        link, value = first_link(latency[name])
        params = q(link)
        assert params["sort"] == "duration" and params["dir"] == "desc" and params["service"] == "chat-api"
        assert value * 0.995 - 0.01 <= float(params["min_ms"]) <= value
    link, value = first_link(latency["TTFT P95"])
    assert q(link)["sort"] == "ttft" and value * 0.995 - 0.01 <= float(q(link)["ttft_ms"]) <= value
    traffic = {t["name"]: t for t in figs["fig-traffic"]["data"]}
    assert q(first_link(traffic["error rate %"])[0])["status"] == "error"
    assert "status" not in q(first_link(traffic["RPS"])[0])
    breakdown = {t["name"]: t for t in figs["fig-breakdown"]["data"]}
    for phase in ("network", "preprocess", "inference", "postprocess"):
        assert q(first_link(breakdown[phase])[0])["phase"] == phase
    assert q(first_link(breakdown["inference share %"])[0])["phase"] == "inference"

    # Following the P99 link lists the slowest request, and only requests at or above the P99.
    link, value = first_link(latency["E2E P99"])
    page = client.get(link)
    assert page.status_code == 200
    durations = [r.duration_ms for r in page.context["rows"]]
    assert durations and all(d >= value * 0.995 for d in durations) and 9000.0 in durations
    assert durations == sorted(durations, reverse=True)
    errors = client.get(first_link(traffic["error rate %"])[0])
    assert [r.status for r in errors.context["rows"]] == ["error", "error"]


def test_costs_and_resources_charts_link_to_their_buckets_traces(member):
    client, _ = member
    costs = client.get("/costs.json", {"range": "1h"}).json()["figures"]
    unit = {t["name"]: t for t in costs["fig-unit-cost"]["data"]}
    assert q(first_link(unit["cost per request"])[0])["sort"] == "cost"
    spend = costs["fig-spend"]["data"][0]
    assert q(first_link(spend)[0])["model"] == spend["name"] and q(first_link(spend)[0])["sort"] == "cost"
    resources = client.get("/resources/series.json", {"range": "1h"}).json()["figures"]
    rps = resources["fig-rps"]["data"][0]
    link, _ = next((c, y) for c, y in zip(rps["customdata"], rps["y"]) if y)
    assert q(link)
    p95 = resources["fig-p95"]["data"][0]
    link, value = first_link(p95)
    assert q(link)["sort"] == "duration" and value * 0.995 - 0.01 <= float(q(link)["min_ms"]) <= value
