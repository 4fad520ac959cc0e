"""Every empty panel page is one helpful card, not empty axes: overview, costs and compare without
requests say so, give the ingest command with this server's address, and draw no chart; money is
written in the one money format."""

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
