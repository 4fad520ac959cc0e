"""The default range fits the project's data: without a range in the URL a panel page shows the
smallest preset (15m, 1h, 6h, 24h) that covers when the project's requests start, and says so in
the filter bar; an explicit ``?range=`` (or from/to) is always honoured."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from dashboard.timewindow import fit_preset, window_from_query
from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
S = 10**9


@pytest.mark.parametrize("age, preset", [(timedelta(minutes=10), "15m"), (timedelta(minutes=15), "15m"),
                                         (timedelta(minutes=40), "1h"), (timedelta(hours=5), "6h"),
                                         (timedelta(hours=20), "24h"), (timedelta(seconds=-5), "15m")])
def test_smallest_preset_covering_the_data(age, preset):
    assert fit_preset(NOW - age, now=NOW, default="24h") == preset


def test_no_data_or_older_data_keeps_the_default():
    assert fit_preset(None, now=NOW, default="24h") is None
    assert fit_preset(NOW - timedelta(days=3), now=NOW, default="24h") is None
    assert fit_preset(NOW - timedelta(hours=3), now=NOW, default="1h") is None  # never wider than the default


def test_an_explicit_range_is_always_honoured():
    def fit(since):
        return NOW - timedelta(minutes=10)

    fitted = window_from_query({}, default="24h", now=NOW, fit=fit)
    assert fitted.preset == "15m" and fitted.fitted and fitted.start == NOW - timedelta(minutes=15)
    chosen = window_from_query({"range": "24h"}, default="24h", now=NOW, fit=fit)
    assert chosen.preset == "24h" and not chosen.fitted
    absolute = window_from_query({"from": "2026-12-01T10:00:00Z"}, default="24h", now=NOW, fit=fit)
    assert absolute.preset == "" and not absolute.fitted
    assert window_from_query({}, default="24h", now=NOW, fit=lambda since: None).preset == "24h"


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_a_ten_minute_old_project_opens_on_15_minutes_and_24h_is_still_honoured(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    now = time.time_ns()
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=now - (10 - i) * 60 * S) for i in range(4)])
    client.force_login(user)
    for path in ("/", "/costs/"):
        html = client.get(path).content.decode()
        assert 'aria-current="true" data-preset="15m"' in html, path
        assert 'id="range-fitted"' in html and "15m: fitted to this project" in html
    body = client.get("/overview.json").json()
    assert (datetime.fromisoformat(body["end"]) - datetime.fromisoformat(body["start"])) == timedelta(minutes=15)
    html = client.get("/?range=24h").content.decode()
    assert 'aria-current="true" data-preset="24h"' in html and 'id="range-fitted"' not in html
    body = client.get("/overview.json?range=24h").json()
    assert (datetime.fromisoformat(body["end"]) - datetime.fromisoformat(body["start"])) == timedelta(hours=24)


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_a_project_without_data_keeps_24_hours(client, make_user, project_with_key):
    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    html = client.get("/").content.decode()
    assert 'aria-current="true" data-preset="24h"' in html and 'id="range-fitted"' not in html


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_resources_fit_their_default_range_to_the_samples(client, make_user, project_with_key):
    from store import get_store
    from tests.test_resources_page import sample

    user = make_user()
    project, _ = project_with_key(members=[user])
    get_store().insert("resource_samples", [sample(project.pk, "box", t=time.time_ns() - 8 * 60 * S, cpu_percent=5.0)],
                       tag="tests.range_fit")
    client.force_login(user)
    html = client.get("/resources/").content.decode()
    assert '<option value="15m" selected>' in html and 'id="range-fitted"' in html
    body = client.get("/resources/series.json").json()
    assert datetime.fromisoformat(body["end"]) - datetime.fromisoformat(body["start"]) == timedelta(minutes=15)
    html = client.get("/resources/?range=1h").content.decode()
    assert '<option value="1h" selected>' in html and 'id="range-fitted"' not in html
