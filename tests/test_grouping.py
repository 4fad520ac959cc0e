"""Group by an attribute: the overview, costs and series API split per value of a span or
resource attribute (top N by requests, other, (none)), exact on seeded data, project-scoped,
bad parameters answered 400 naming the parameter."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import pytest

from analytics import grouping, rollup_services, summarizer
from tests.rollup_support import insert_spans, random_trace

pytestmark = [pytest.mark.django_db]
NS = 1_000_000_000
TIERS = {"premium": 40, "standard": 25, "free": 15, "trial": 8, "beta": 6, "internal": 4, "legacy": 2}


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS, tz=timezone.utc).isoformat()


def _seed(project_id: int, rng: random.Random, start: int, end: int) -> dict:
    """Traces per tier (the tier on the inference span; 'free' on the resource), 10 without the
    key, and for premium traces a later span carrying another value (the earliest span's wins)."""
    spans, expected = [], {}
    for tier, count in TIERS.items():
        for i in range(count):
            trace = random_trace(rng, start_ns=rng.randrange(start, end), error=i % 5 == 0)
            target = trace[3]  # inference
            if tier == "free":
                target["resource_attributes"] = {"user.tier": tier}
            else:
                target["attributes"] = {"user.tier": tier}
            if tier == "premium":
                trace[4]["attributes"] = {"user.tier": "standard"}  # postprocess, later: ignored
            spans += trace
            expected.setdefault(tier, []).append(trace)
    for i in range(10):
        trace = random_trace(rng, start_ns=rng.randrange(start, end))
        if i < 3:  # an empty value does not carry the key
            trace[0]["attributes"] = {"user.tier": ""}
        spans += trace
        expected.setdefault("(none)", []).append(trace)
    insert_spans(project_id, spans)
    summarizer.traces_summarize(project_ids=[project_id])
    rollup_services.rollups_update(project_ids=[project_id])
    return expected


def _p95(traces) -> float:
    """P95 as the overview computes it (ClickHouse quantileExact: the value at 0-based index
    floor(0.95 n) of the sorted E2E)."""
    ordered = sorted(t[0]["duration_ms"] for t in traces)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


@pytest.fixture
def seeded(project_with_key, make_user):
    user = make_user()
    project, key = project_with_key(members=[user])
    other, _ = project_with_key(members=[user])
    rng = random.Random(5)
    end = (time.time_ns() - 30 * 60 * NS) // (60 * NS) * 60 * NS
    start = end - 3600 * NS
    expected = _seed(project.pk, rng, start, end)
    # The other project carries a tier of its own, which must never show here.
    insert_spans(other.pk, [dict(s, attributes={"user.tier": "elsewhere"}) for s in
                            random_trace(rng, start_ns=start + NS)])
    summarizer.traces_summarize(project_ids=[other.pk])
    return {"user": user, "project": project, "key": key, "start": start, "end": end, "expected": expected}


def _check_groups(body: dict, expected: dict, top: int) -> None:
    groups = body["groups"]
    ranked = sorted(TIERS, key=lambda t: -TIERS[t])
    shown = ranked[:top]
    assert [g["value"] for g in groups] == shown + (["other"] if top < len(TIERS) else []) + ["(none)"]
    assert [g["kind"] for g in groups] == ["value"] * len(shown) + (["other"] if top < len(TIERS) else []) + ["none"]
    by_value = {g["value"]: g for g in groups}
    for tier in shown + ["(none)"]:
        g, traces = by_value[tier], expected[tier]
        assert g["requests"] == len(traces), tier
        assert g["errors"] == sum(t[0]["status"] == "error" for t in traces), tier
        assert g["e2e_p95_ms"] == pytest.approx(_p95(traces), abs=0.002), tier
        assert sum(g["series"]["requests"]) == len(traces)
    if top < len(TIERS):
        rest = [t for tier in ranked[top:] for t in expected[tier]]
        assert by_value["other"]["requests"] == len(rest)
        assert by_value["other"]["e2e_p95_ms"] == pytest.approx(_p95(rest), abs=0.002)
    assert "elsewhere" not in by_value


@pytest.mark.clickhouse
def test_series_api_overview_grouped_top5_other_none(client, seeded):
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"]), "points": 6, "group_by": "user.tier"}
    response = client.get("/api/v1/series/overview", window, HTTP_AUTHORIZATION=f"Bearer {seeded['key']}")
    assert response.status_code == 200, response.content
    body = response.json()
    grouped = body["grouped"]
    assert grouped["key"] == "user.tier" and grouped["top"] == 5
    assert grouped["times"] == body["series"]["times"] and grouped["step_seconds"] == body["series"]["step_seconds"]
    _check_groups(grouped, seeded["expected"], 5)
    for g in grouped["groups"]:
        assert len(g["series"]["e2e_p95_ms"]) == len(grouped["times"])


@pytest.mark.clickhouse
def test_series_api_group_top_and_costs(client, seeded):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {seeded['key']}"}
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"]), "points": 4, "group_by": "user.tier"}
    body = client.get("/api/v1/series/overview", {**window, "group_top": 2}, **auth).json()
    _check_groups(body["grouped"], seeded["expected"], 2)
    body = client.get("/api/v1/series/overview", {**window, "group_top": 20}, **auth).json()
    _check_groups(body["grouped"], seeded["expected"], 20)
    latency = client.get("/api/v1/series/latency", {**window, "group_top": 1}, **auth).json()
    assert [g["value"] for g in latency["grouped"]["groups"]] == ["premium", "other", "(none)"]
    assert sum(latency["totals"]) == sum(g["requests"] for g in latency["grouped"]["groups"]) == 110
    costs = client.get("/api/v1/series/costs", window, **auth).json()
    by_value = {g["value"]: g for g in costs["grouped"]["groups"]}
    premium = sum(s.get("cost_usd", 0) for t in seeded["expected"]["premium"] for s in t)
    assert by_value["premium"]["cost_usd"] == pytest.approx(premium, rel=1e-9)
    assert sum(c or 0 for c in by_value["premium"]["series"]["cost_usd"]) == pytest.approx(premium, rel=1e-9)


@pytest.mark.clickhouse
def test_overview_and_costs_json_grouped(client, seeded):
    client.force_login(seeded["user"])
    client.get("/", {"project": seeded["project"].pk})  # the session's current project
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"]), "group_by": "user.tier",
              "project": seeded["project"].pk}
    response = client.get("/overview.json", window)
    assert response.status_code == 200, response.content
    _check_groups(response.json()["grouped"], seeded["expected"], 5)
    response = client.get("/costs.json", {**window, "group_top": 3})
    assert response.status_code == 200, response.content
    assert [g["value"] for g in response.json()["grouped"]["groups"]] == ["premium", "standard", "free", "other",
                                                                         "(none)"]
    assert "grouped" not in client.get("/overview.json", {k: v for k, v in window.items() if k != "group_by"}).json()


@pytest.mark.clickhouse
@pytest.mark.parametrize("params,field", [
    ({"group_by": "k" * 257}, "group_by"),
    ({"group_by": "user.tier", "group_top": "x"}, "group_top"),
    ({"group_by": "user.tier", "group_top": "0"}, "group_top"),
    ({"group_by": "user.tier", "group_top": "21"}, "group_top"),
])
def test_bad_group_parameters(client, seeded, params, field):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {seeded['key']}"}
    for path in ("/api/v1/series/overview", "/api/v1/series/latency", "/api/v1/series/costs"):
        response = client.get(path, params, **auth)
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["details"][0]["field"] == field and error["message"].startswith(f"{field}: ")
    client.force_login(seeded["user"])
    response = client.get("/overview.json", params)
    assert response.status_code == 400 and field in response.json()["error"]["message"]


@pytest.mark.clickhouse
def test_targets_set_on_the_overview_drawn_as_dashed_lines(client, seeded, make_user):
    from django.test import Client

    from analytics.models import GroupTarget

    project = seeded["project"]
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"]), "group_by": "user.tier",
              "project": project.pk}
    client.force_login(seeded["user"])
    page = client.get("/", window)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="grouped"' in html and 'id="target-form"' in html and 'name="group_by"' in html
    assert 'value="user.tier"' in html  # the filter bar keeps the attribute
    assert '<option value="user.tier">' in html  # and suggests the keys seen
    # bad target: 400, clear message, nothing written
    bad = client.post("/?" + "&".join(f"{k}={v}" for k, v in window.items()),
                      {"action": "target_set", "attribute_key": "user.tier", "value": "premium", "target": "fast"})
    assert bad.status_code == 400 and "target: &#x27;fast&#x27; is not a number" in bad.content.decode()
    bad = client.post("/", {"action": "target_set", "attribute_key": "user.tier", "value": "", "target": "800"})
    assert bad.status_code == 400 and "value: required" in bad.content.decode()
    assert not GroupTarget.objects.exists()
    # without the CSRF token: refused
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(seeded["user"])
    assert strict.post("/", {"action": "target_set", "attribute_key": "user.tier", "value": "premium",
                             "target": "800"}).status_code == 403
    # a user of no project cannot set one
    outsider = Client()
    outsider.force_login(make_user())
    outsider.post("/", {"action": "target_set", "attribute_key": "user.tier", "value": "premium", "target": "800"})
    assert not GroupTarget.objects.exists()
    ok = client.post("/?group_by=user.tier", {"action": "target_set", "attribute_key": "user.tier", "value": "premium",
                                              "target": "800"})
    assert ok.status_code == 302 and ok["Location"].endswith("#group-targets")
    client.post("/", {"action": "target_set", "attribute_key": "user.tier", "value": "free", "target": "1200.5"})
    assert {(t.project_id, t.value, t.target) for t in GroupTarget.objects.all()} == {
        (project.pk, "premium", 800.0), (project.pk, "free", 1200.5)}
    body = client.get("/overview.json", window).json()
    groups = {g["value"]: g for g in body["grouped"]["groups"]}
    assert groups["premium"]["targets"] == {"e2e_p95_ms": 800.0} and groups["standard"]["targets"] == {}
    traces = body["group_figures"]["fig-group-p95"]["data"]
    lines = {t["name"]: t for t in traces}
    assert {"premium", "standard", "free", "trial", "beta", "other", "(none)"} <= set(lines)
    target = lines["premium target 800 ms"]
    assert target["line"]["dash"] == "dash" and target["y"] == [800.0, 800.0]
    assert target["line"]["color"] == lines["premium"]["line"]["color"] == groups["premium"]["color"]
    assert lines["free target 1200.5 ms"]["line"]["color"] == groups["free"]["color"]
    assert len({groups[v]["color"] for v in ("premium", "standard", "free", "trial", "beta")}) == 5
    # removing one
    client.post("/", {"action": "target_delete", "attribute_key": "user.tier", "value": "free"})
    assert [t.value for t in GroupTarget.objects.all()] == ["premium"]


@pytest.mark.clickhouse
def test_pages_say_a_bad_group_parameter_and_stay_ungrouped(client, seeded):
    client.force_login(seeded["user"])
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"]), "project": seeded["project"].pk}
    for path in ("/", "/costs/"):
        page = client.get(path, {**window, "group_by": "user.tier", "group_top": "99"})
        html = page.content.decode()
        assert page.status_code == 200 and 'id="group-error"' in html and "group_top: must be from 1 to 20" in html
        assert 'id="grouped"' not in html
    costs = client.get("/costs/", {**window, "group_by": "user.tier"}).content.decode()
    assert 'id="chart-fig-group-cost"' in costs and "user.tier" in costs


@pytest.mark.clickhouse
def test_a_summary_whose_start_moved_counts_once_under_its_latest_start(project_with_key):
    """``traces_by_start`` keeps a summary under each start it had (a longer root arrived later):
    a grouped read counts the trace once, in the window of its latest summary's start only."""
    from store import get_store
    from tests.explorer_seed import span_rows, summary_moved

    project, _ = project_with_key()
    start = (time.time_ns() - 3 * 3600 * NS) // (60 * NS) * 60 * NS
    spans = random_trace(random.Random(3), start_ns=start + 40 * 60 * NS)
    spans[0]["attributes"] = {"user.tier": "pro"}
    rows = span_rows(project_id=project.pk, spans=spans)
    get_store().insert("spans", rows, tag="tests.grouping.moved")
    # as the summariser writes a summary that moved: the new row, and the old start (10 min past `start`) retired
    summary_moved(project_id=project.pk, rows=rows, earlier_ns=30 * 60 * NS, tag="tests.grouping.moved")

    def requests(lo_min: int, hi_min: int) -> dict:
        series = grouping.grouped_series(project_id=project.pk, start=datetime.fromtimestamp((start + lo_min * 60 * NS) / NS, tz=timezone.utc),
                                         end=datetime.fromtimestamp((start + hi_min * 60 * NS) / NS, tz=timezone.utc), key="user.tier")
        return {g.value: g.requests for g in series.groups}

    assert requests(0, 60) == {"pro": 1}  # both starts inside: once
    assert requests(0, 30) == {}  # only the stale start inside: not counted
    assert requests(30, 60) == {"pro": 1}


@pytest.mark.clickhouse
def test_key_suggestions_are_the_keys_that_can_group(project_with_key):
    """The filter bar's and the Variants view's key hints: span and resource keys with a short
    value (``spans.dims``), never a key whose value is too long to group (a prompt), never another
    project's keys."""
    from analytics import variants
    from store.schema import DIM_VALUE_MAX

    project, _ = project_with_key()
    other, _ = project_with_key()
    rng = random.Random(7)
    now = time.time_ns()
    trace = random_trace(rng, start_ns=now - 600 * NS)
    trace[0]["attributes"] = {"user.tier": "pro", "gen_ai.prompt": "p" * (DIM_VALUE_MAX + 1)}
    trace[3]["resource_attributes"] = {"service.version": "1.2.0"}
    foreign = random_trace(rng, start_ns=now - 600 * NS)
    foreign[0]["attributes"] = {"tenant.secret": "x"}
    insert_spans(project.pk, trace)
    insert_spans(other.pk, foreign)
    window = {"start": datetime.fromtimestamp(now / NS - 3600, tz=timezone.utc),
              "end": datetime.fromtimestamp(now / NS + 60, tz=timezone.utc)}
    for keys in (grouping.attribute_keys(project_id=project.pk, **window),
                 variants.key_suggestions(project_id=project.pk, **window)):
        assert {"user.tier", "service.version"} <= set(keys), keys
        assert "gen_ai.prompt" not in keys and "tenant.secret" not in keys, keys
