"""Every empty panel page is one helpful card, not empty axes: overview, costs and compare without
requests say so, give the ingest command with this server's address, and draw no chart; money is
written in the one money format. /alerts/ with nothing firing and no history, and /loadtests/ with
no run, say what they will show and how to get there, above the forms they keep."""

from __future__ import annotations

import time

import pytest

from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
S = 10**9


@pytest.mark.parametrize("path", ["/", "/costs/", "/compare/"])
def test_no_requests_is_one_card_with_the_ingest_command_and_no_chart(client, make_user, project_with_key, path):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    html = client.get(path).content.decode()
    card = html[html.index('id="no-requests"'):]
    card = card[:card.index("</section>")]
    assert "curl -X POST http://testserver/api/v1/traces" in card and 'data-copy="ingest-command"' in card
    assert f"/settings/?project={project.pk}" in card
    assert 'data-figure="fig-' not in html and 'type="application/json"' not in html  # no figure, no empty axes


def test_a_filter_that_matches_nothing_says_so(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=time.time_ns() - 5 * 60 * S)])
    client.force_login(user)
    html = client.get("/?range=1h&service=nope").content.decode()
    assert "No request matches these filters" in html and "curl" not in html
    assert 'data-figure="fig-latency"' in client.get("/?range=1h").content.decode()  # with requests: the charts


def test_costs_page_writes_money_in_one_format(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=time.time_ns() - 5 * 60 * S)])  # $0.00042
    client.force_login(user)
    html = client.get("/costs/?range=1h").content.decode()
    tile = html[html.index('data-kpi="cost_per_request"'):]
    tile = tile[:tile.index("</div>", tile.index('class="value"'))]
    assert "$0.00042" in tile and "USD" not in tile
    overview = client.get("/?range=1h").content.decode()
    cost = overview[overview.index('data-kpi="cost"'):]
    assert '<span class="num">$0.00042</span>' in cost[:cost.index("</div>", cost.index('class="value"'))]


def test_alerts_without_alerts_is_one_card_naming_the_default_rules_and_the_channel_form(client, make_user, project_with_key):
    from django.utils import timezone

    from alerts.models import AlertEvent, AlertRule
    from alerts.services import DEFAULT_RULES

    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    html = client.get(f"/alerts/?project={project.pk}").content.decode()
    assert html.count("empty-state") == 1
    card = html[html.index('id="no-alerts"'):]
    card = card[:card.index("</section>")]
    on = [r for r in DEFAULT_RULES if r.get("enabled", True)]  # inference share is installed switched off
    assert f"The {len(on)} default rules are active" in card and "GPU memory ≥ 85 %" in card
    assert "Inference share" not in card
    assert f'href="?project={project.pk}&amp;channel=new#add-channel"' in card
    # the card hides nothing: rules, the channel and silence forms are all there
    for part in ('id="alert-rules"', 'id="add-channel"', f'action="/alerts/channels/new/?project={project.pk}"',
                 'id="alert-silences"', 'id="alert-history"'):
        assert part in html, part
    assert '<details class="card" id="add-channel">' in html  # closed, unless the card's link opens it:
    opened = client.get(f"/alerts/?project={project.pk}&channel=new").content.decode()
    assert '<details class="card" id="add-channel" open>' in opened

    # rule names are user-editable: shown escaped; a disabled default rule is not said to be active
    rule = AlertRule.objects.get(project=project, name="GPU memory ≥ 85 %")
    AlertRule.objects.filter(pk=rule.pk).update(name="<b>mine</b>")
    AlertRule.objects.filter(project=project, name="Host CPU > 70 % for 5 min").update(enabled=False)
    card = client.get(f"/alerts/?project={project.pk}").content.decode()
    card = card[card.index('id="no-alerts"'):card.index("</section>", card.index('id="no-alerts"'))]
    assert f"The {len(on) - 1} default rules are active" in card
    assert "&lt;b&gt;mine&lt;/b&gt;" in card and "<b>mine</b>" not in card and "Host CPU" not in card

    # any history (a resolved alert): the page is no longer empty
    AlertEvent.objects.create(project=project, rule=rule, series_key="", from_state="firing", to_state="resolved",
                              at=timezone.now())
    html = client.get(f"/alerts/?project={project.pk}").content.decode()
    assert 'id="no-alerts"' not in html and "firing → resolved" in html


def test_loadtests_without_runs_is_one_card_pointing_at_the_form_and_the_command(client, make_user, project_with_key):
    from loadtests.models import LoadTestRun

    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    html = client.get(f"/loadtests/?project={project.pk}").content.decode()
    assert html.count("empty-state") == 1
    card = html[html.index('id="no-loadtests"'):]
    card = card[:card.index("</section>")]
    assert '<a href="#loadtest-start">Start a load test</a>' in card and "python manage.py loadtest" in card
    assert "knee" in card  # what the page will show
    assert 'id="loadtest-start"' in html and 'name="qps"' in html  # the form stays
    LoadTestRun.objects.create(project=project, run_id="r-empty-state", test_type="step", target_url="x", config={})
    html = client.get(f"/loadtests/?project={project.pk}").content.decode()
    assert 'id="no-loadtests"' not in html and "r-empty-state" in html and 'id="loadtest-start"' in html
