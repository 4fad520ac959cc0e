"""The overview with ``group_by`` in a real headless Chromium: the grouped P95 chart draws one line
per value (top values, other, (none)) and the value's target as a dashed line, and the filter
bar's group-by field takes the attribute."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_browser import PASSWORD, browser, post_spans  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from tests.test_panels_browser import chart_data, log_in, non_null, page, shaped, summarised  # noqa: E402,F401

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
S = 10**9


def tiered(*, start_ns, e2e_ms, tier):
    spans = shaped(start_ns=start_ns, e2e_ms=e2e_ms, service="chat-api")
    attributes = spans[0]["attributes"]  # the root carries llm_trace's user.tier
    attributes.pop("user.tier")
    if tier is not None:
        attributes["user.tier"] = tier
    return spans


def test_overview_grouped_by_tier_draws_a_line_per_value(page, asgi_server, make_user, project_with_key):  # noqa: F811
    from analytics.group_targets import group_target_set

    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])
    now = time.time_ns()
    traces = []
    for i in range(12):
        traces.append(tiered(start_ns=now - (40 - i) * 60 * S, e2e_ms=2000, tier="premium"))
        if i < 8:
            traces.append(tiered(start_ns=now - (39 - i) * 60 * S, e2e_ms=600, tier="standard"))
        if i < 4:
            traces.append(tiered(start_ns=now - (38 - i) * 60 * S, e2e_ms=300, tier="free"))
    traces.append(tiered(start_ns=now - 20 * 60 * S, e2e_ms=900, tier=None))
    post_spans(asgi_server, key, [s for t in traces for s in t])
    summarised(project.pk, len(traces))
    group_target_set(project_id=project.pk, attribute_key="user.tier", value="premium", target="800")

    log_in(page, asgi_server, user.username, "/?range=1h")
    page.fill('.filter-bar input[name="group_by"]', "user.tier")
    page.fill('.filter-bar input[name="group_top"]', "2")
    page.locator(".filter-bar").get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"group_by=user.tier"))
    expect(page.locator("#grouped h2")).to_contain_text("user.tier")
    lines = {t["name"]: t for t in chart_data(page, "fig-group-p95")}
    assert set(lines) == {"premium", "standard", "other", "(none)", "premium target 800 ms"}
    assert set(non_null(lines["premium"]["y"])) == {2000.0}
    assert set(non_null(lines["standard"]["y"])) == {600.0}
    assert set(non_null(lines["other"]["y"])) == {300.0}  # free, pooled beyond the top 2
    assert set(non_null(lines["(none)"]["y"])) == {900.0}
    assert lines["premium target 800 ms"]["y"] == [800, 800]
    dash = page.evaluate("document.getElementById('chart-fig-group-p95').data"
                         ".find((t) => t.name === 'premium target 800 ms').line.dash")
    assert dash == "dash"
    rps = {t["name"] for t in chart_data(page, "fig-group-rps")}
    assert rps == {"premium", "standard", "other", "(none)"}
    # the drawn SVG has one path per line of the legend
    expect(page.locator("#chart-fig-group-p95 .legend .traces")).to_have_count(5)
    assert page.errors == []
