"""/compare/: two windows, two models or two releases side by side with B's difference in %."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / S, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def trace(start_ns, *, inference_ms, model="gpt-4o-mini", release="1.0"):
    spans = llm_trace(model=model, start_ns=start_ns)
    spans[0]["duration_ms"] = 300 + inference_ms
    spans[3]["duration_ms"] = inference_ms
    spans[4]["start_time"] = spans[3]["start_time"] + int(inference_ms * 1e6)
    spans[3]["attributes"] = {"release": release}
    return spans


@pytest.fixture
def seeded(make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    now = time.time_ns()
    a_start, b_start = now - 3 * 3600 * S, now - 3600 * S
    before = [trace(a_start + i * 60 * S, inference_ms=1000, release="1.0") for i in range(20)]
    after = [trace(b_start + i * 60 * S, inference_ms=700, release="1.1", model="gpt-4o") for i in range(20)]
    seed_rolled_up(project_id=project.pk, traces=before + after)
    return {"user": alice, "a": (a_start - S, a_start + 1800 * S), "b": (b_start - S, b_start + 1800 * S)}


def rows_by_metric(body):
    return {r["metric"]: r for r in body["rows"]}


def test_two_windows_show_the_optimisation_in_percent(client, seeded):
    client.force_login(seeded["user"])
    a, b = seeded["a"], seeded["b"]
    query = f"mode=windows&a_from={iso(a[0])}&a_to={iso(a[1])}&b_from={iso(b[0])}&b_to={iso(b[1])}"
    body = client.get(f"/compare.json?{query}").json()
    rows = rows_by_metric(body)
    assert rows["Requests"]["a"] == 20 and rows["Requests"]["b"] == 20
    # From the rollups' histograms: each value within 0.5 % of the exact one.
    assert rows["inference P95"]["a"] == pytest.approx(1000, rel=0.005)
    assert rows["inference P95"]["b"] == pytest.approx(700, rel=0.005)
    assert rows["inference P95"]["change_percent"] == pytest.approx(-30.0, abs=0.5)
    assert rows["inference P95"]["verdict"] == "better"
    assert rows["E2E P50"]["change_percent"] == pytest.approx(100 * (1000 - 1300) / 1300, abs=0.5)
    assert rows["network P99"]["change_percent"] == 0 and rows["network P99"]["verdict"] == "flat"
    bars = {t["name"][:1]: t for t in body["figures"]["fig-compare"]["data"]}
    x = bars["A"]["x"]
    assert bars["A"]["y"][x.index("inference P95")] == rows["inference P95"]["a"]
    assert bars["B"]["y"][x.index("inference P95")] == rows["inference P95"]["b"]
    html = client.get(f"/compare/?{query}").content.decode()
    row = html[html.index('data-metric="inference P95"'):]
    change = rows["inference P95"]["change_percent"]
    assert f'<td class="num better">{change:.1f} %</td>' in row[:row.index("</tr>")]


def test_two_models_and_two_releases_and_bad_input(client, seeded):
    client.force_login(seeded["user"])
    models = rows_by_metric(client.get("/compare.json?mode=models&range=6h&a_model=gpt-4o-mini&b_model=gpt-4o").json())
    assert models["Requests"]["a"] == 20 and models["inference P50"]["b"] == pytest.approx(700, rel=0.005)
    releases = client.get("/compare.json?mode=attribute&range=6h&attr=release&a_value=1.0&b_value=1.1").json()
    rows = rows_by_metric(releases)
    assert rows["inference P99"]["a"] == 1000 and rows["inference P99"]["b"] == 700
    assert releases["a"]["label"] == "A: release = 1.0"
    assert '<option value="1.1">' in client.get("/compare/?mode=attribute&range=6h").content.decode()  # a choice
    bad = client.get("/compare.json?mode=windows&a_from=monday&a_to=tuesday")
    assert bad.status_code == 400 and "a_from and a_to must be ISO 8601" in bad.json()["error"]["message"]
    assert client.get("/compare.json?mode=sideways").status_code == 400
    assert client.get("/compare/?mode=sideways").status_code == 200  # the page says what was wrong


def test_releases_from_a_resource_attribute(client, make_user, project_with_key):
    """OpenTelemetry SDKs put the release in the resource (``service.version``)."""
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    now = time.time_ns()
    traces = []
    for version, inference_ms in (("2.3.0", 1200), ("2.4.0", 600)):
        for i in range(4):
            spans = trace(now - (60 - i) * 60 * S, inference_ms=inference_ms)
            for span in spans:
                span.pop("attributes", None)
                span["resource_attributes"] = {"service.version": version}
            traces.append(spans)
    seed_rolled_up(project_id=project.pk, traces=traces)
    client.force_login(alice)
    body = client.get("/compare.json?mode=attribute&range=6h&attr=service.version&a_value=2.3.0&b_value=2.4.0").json()
    rows = rows_by_metric(body)
    assert rows["Requests"]["a"] == 4 and rows["Requests"]["b"] == 4
    assert rows["inference P50"]["a"] == 1200 and rows["inference P50"]["b"] == 600
    assert rows["inference P50"]["change_percent"] == pytest.approx(-50.0)
    html = client.get("/compare/?mode=attribute&range=6h&attr=service.version").content.decode()
    assert '<option value="2.3.0">' in html and '<option value="2.4.0">' in html
