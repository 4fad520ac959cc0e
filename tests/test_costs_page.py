"""/costs/: token and spend figures, the labelled projection, and the per-model price editor
(CSRF-protected, validation errors shown, scoped to the user's project)."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from analytics.models import ModelPrice
from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9


@pytest.fixture
def seeded(make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    now = time.time_ns()
    traces = [llm_trace(model="gpt-4o-mini", start_ns=now - (40 - i) * 60 * S) for i in range(10)]  # 0.00042 each
    big = llm_trace(model="gpt-4o", start_ns=now - 20 * 60 * S)
    big[3]["cost_usd"] = 0.01
    old = llm_trace(model="gpt-4o", start_ns=now - 3 * 86400 * S)  # in the last 7 days, not in the hour
    old[3]["cost_usd"] = 0.7
    seed_rolled_up(project_id=project.pk, traces=traces + [big, old])
    return {"user": alice, "project": project}


def test_costs_numbers_projection_and_spend_per_model(client, seeded):
    client.force_login(seeded["user"])
    body = client.get("/costs.json?range=1h").json()
    stats = body["stats"]
    assert stats["requests"] == 11
    assert stats["cost_usd"] == pytest.approx(10 * 0.00042 + 0.01)
    assert stats["cost_per_request"] == pytest.approx((10 * 0.00042 + 0.01) / 11)
    assert stats["cost_per_1k_tokens"] == pytest.approx((10 * 0.00042 + 0.01) / (11 * (812 + 164) / 1000))
    # Projected from the time the last 7 days' data covers (its first request, 3 days ago), not 7 days.
    assert body["projected_monthly_usd"] == pytest.approx((10 * 0.00042 + 0.01 + 0.7) * 30 / 3, rel=1e-3)
    spend = {t["name"]: sum(v for v in t["y"] if v) for t in body["figures"]["fig-spend"]["data"]}
    assert spend == {"gpt-4o": pytest.approx(0.01), "gpt-4o-mini": pytest.approx(0.0042)}
    tokens = body["figures"]["fig-tokens"]["data"]
    assert sum(v for v in tokens[0]["y"] if v) == 11 * 812 and sum(v for v in tokens[1]["y"] if v) == 11 * 164
    html = client.get("/costs/?range=1h").content.decode()
    assert "Projected monthly spend (projection)" in html
    assert "gpt-4o" in client.get("/costs.json?range=1h&model=gpt-4o").content.decode()
    assert client.get("/costs.json?range=1h&model=gpt-4o").json()["stats"]["requests"] == 1


def test_price_editor_saves_validates_deletes_and_needs_csrf(seeded, make_user, project_with_key):
    project = seeded["project"]
    client = Client(enforce_csrf_checks=True)
    client.force_login(seeded["user"])
    assert client.post("/costs/", {"model": "m", "input_usd_per_million": "1",
                                   "output_usd_per_million": "2"}).status_code == 403  # no CSRF token
    page = client.get("/costs/")
    token = page.cookies["csrftoken"].value
    bad = client.post("/costs/", {"csrfmiddlewaretoken": token, "model": "gpt-4o", "input_usd_per_million": "-1",
                                  "output_usd_per_million": "ten"})
    assert bad.status_code == 400
    html = bad.content.decode()
    assert 'data-field="input_usd_per_million"' in html and "must be a non-negative number" in html
    assert 'value="ten"' in html  # the form keeps what was typed
    bad = client.post("/costs/", {"csrfmiddlewaretoken": token, "model": "gpt-4o", "input_usd_per_million": "1",
                                  "output_usd_per_million": "ten"})
    assert bad.status_code == 400
    assert 'data-field="output_usd_per_million"' in bad.content.decode() and "is not a number" in bad.content.decode()
    assert not ModelPrice.objects.filter(project=project).exists()
    ok = client.post("/costs/?range=1h", {"csrfmiddlewaretoken": token, "model": "gpt-4o",
                                          "input_usd_per_million": "2.5", "output_usd_per_million": "10"})
    assert ok.status_code == 302 and ok["Location"].endswith("#prices")
    price = ModelPrice.objects.get(project=project, model="gpt-4o")
    assert float(price.input_usd_per_million) == 2.5 and float(price.output_usd_per_million) == 10.0
    assert 'data-model="gpt-4o"' in client.get("/costs/").content.decode()
    # Another project's member never sees or edits this table.
    bob = make_user()
    theirs, _ = project_with_key(members=[bob])
    other = Client()
    other.force_login(bob)
    assert 'data-model="gpt-4o"' not in other.get("/costs/").content.decode()
    other.post("/costs/", {"action": "delete", "model": "gpt-4o"})
    assert ModelPrice.objects.filter(project=project, model="gpt-4o").exists()
    assert other.post(f"/costs/?project={project.pk}", {"action": "delete", "model": "gpt-4o"}).status_code == 404
    client.post("/costs/", {"csrfmiddlewaretoken": token, "action": "delete", "model": "gpt-4o"})
    assert not ModelPrice.objects.filter(project=project).exists()
