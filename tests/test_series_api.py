"""The series JSON endpoints: key or session auth, project scope, the rollups' numbers, and bad
parameters answered 400 naming the parameter."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import pytest

from analytics import rollup_services, summarizer
from tests.rollup_support import exact_from_spans, exact_ms, insert_spans, random_trace

pytestmark = [pytest.mark.django_db]
NS = 1_000_000_000


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS, tz=timezone.utc).isoformat()


@pytest.fixture
def seeded(project_with_key, make_user):
    user = make_user()
    project, key = project_with_key(members=[user])
    rng = random.Random(11)
    end = (time.time_ns() - 30 * 60 * NS) // (60 * NS) * 60 * NS
    start = end - 2 * 3600 * NS
    spans = []
    for _ in range(300):
        spans += random_trace(rng, start_ns=rng.randrange(start, end), model=rng.choice(["m1", "m2"]),
                              error=rng.random() < 0.1)
    insert_spans(project.pk, spans)
    summarizer.traces_summarize(project_ids=[project.pk])
    rollup_services.rollups_update(project_ids=[project.pk])
    return {"user": user, "project": project, "key": key, "start": start, "end": end}


@pytest.mark.clickhouse
def test_overview_with_a_key(client, seeded):
    start, end = seeded["start"], seeded["end"]
    response = client.get("/api/v1/series/overview", {"from": iso(start), "to": iso(end), "points": 4},
                          HTTP_AUTHORIZATION=f"Bearer {seeded['key']}")
    assert response.status_code == 200, response.content
    body = response.json()
    exact = exact_from_spans(seeded["project"].pk, start_ns=start, end_ns=end)
    assert body["stats"]["requests"] == exact["requests"] == 300
    assert body["stats"]["errors"] == exact["errors"]
    assert body["stats"]["rps"] == pytest.approx(300 / 7200)
    p95 = exact_ms(exact["e2e"])[0.95]
    assert abs(body["stats"]["e2e_ms"]["p95"] - p95) / p95 <= 0.01
    assert body["previous"]["requests"] == 0
    assert body["series"]["step_seconds"] == 1800
    assert sum(b["requests"] for b in body["series"]["buckets"] if b) == 300


@pytest.mark.clickhouse
def test_session_latency_costs_and_compare(client, seeded):
    client.force_login(seeded["user"])
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"]), "project": seeded["project"].pk}
    latency = client.get("/api/v1/series/latency", window).json()
    assert sum(latency["totals"]) == 300 and len(latency["labels"]) == len(latency["edges_ms"]) + 1
    costs = client.get("/api/v1/series/costs", window).json()
    assert set(costs["spend_by_model"]["cost_usd"]) == {"m1", "m2"}
    projection = costs["projection"]  # over the time the data covers (its first request to the window's end)
    assert projection["covered_seconds"] == pytest.approx((seeded["end"] - seeded["start"]) / NS, abs=7200)
    assert projection["projected_monthly_usd"] == pytest.approx(
        projection["cost_covered"] * 30 * 86400 / projection["covered_seconds"])
    assert "based on" in projection["label"] and "of data" in projection["label"]
    mid = (seeded["start"] + seeded["end"]) // 2
    compare = client.get("/api/v1/series/compare", {"a_from": iso(seeded["start"]), "a_to": iso(mid),
                                                    "b_from": iso(mid), "b_to": iso(seeded["end"])}).json()
    rows = {r["name"]: r for r in compare["rows"]}
    assert rows["requests"]["a"] + rows["requests"]["b"] == 300
    models = client.get("/api/v1/series/compare", {**window, "mode": "models", "model_a": "m1", "model_b": "m2"}).json()
    assert models["a"]["requests"] + models["b"]["requests"] == 300
    release = client.get("/api/v1/series/compare", {**window, "mode": "attribute", "key": "nope", "value_a": "1",
                                                    "value_b": "2"}).json()
    assert release["a"]["requests"] == 0


@pytest.mark.clickhouse
def test_other_projects_are_not_visible(client, seeded, project_with_key, make_user):
    outsider = make_user()
    other, other_key = project_with_key(members=[outsider])
    window = {"from": iso(seeded["start"]), "to": iso(seeded["end"])}
    body = client.get("/api/v1/series/overview", window, HTTP_AUTHORIZATION=f"Bearer {other_key}").json()
    assert body["project_id"] == other.pk and body["stats"]["requests"] == 0
    client.force_login(outsider)
    response = client.get("/api/v1/series/overview", {**window, "project": seeded["project"].pk})
    assert response.status_code == 404 and response.json()["error"]["details"][0]["field"] == "project"


@pytest.mark.parametrize("params, field", [
    ({"range": "2y"}, "range"),
    ({"from": "yesterday"}, "from"),
    ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
    ({"to": "2026-01-01T00:00:00Z"}, "from"),
    ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "from"),
    ({"points": "many"}, "points"),
    ({"points": "0"}, "points"),
    ({"service": "s" * 300}, "service"),
])
def test_bad_parameters_are_named(client, make_user, project_with_key, params, field):
    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    response = client.get("/api/v1/series/overview", params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_parameter" and error["details"][0]["field"] == field


@pytest.mark.parametrize("params, field", [
    ({"mode": "sideways"}, "mode"),
    ({"mode": "models", "model_a": "x"}, "model_b"),
    ({"mode": "attribute", "key": "release"}, "value_a"),
    ({"a_range": "1h", "b_range": "nope"}, "b_range"),
])
def test_bad_compare_parameters_are_named(client, make_user, project_with_key, params, field):
    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    response = client.get("/api/v1/series/compare", params)
    assert response.status_code == 400 and response.json()["error"]["details"][0]["field"] == field


def test_without_auth_it_is_401(client, db):
    response = client.get("/api/v1/series/overview")
    assert response.status_code == 401 and response.json()["error"]["code"] == "missing_key"
    response = client.get("/api/v1/series/costs", HTTP_AUTHORIZATION="Bearer td_nope_nope")
    assert response.status_code == 401


def test_only_get(client, make_user, project_with_key):
    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    assert client.post("/api/v1/series/overview").status_code == 405
