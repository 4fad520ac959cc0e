"""Drill-downs that land (issue 14, item 6), in a real headless Chromium: the overview's charts use
a unified hover, so a click reports every series at that time; the click must follow the series
under the pointer. A P99 point opens the traces of its bucket at or above that P99, slowest first;
an error-rate point the error traces of its bucket; the KPI tiles the traces behind them."""

from __future__ import annotations

import re
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.test_browser import PASSWORD, browser, post_spans  # noqa: F401
from tests.test_panels_browser import chart_data, log_in, only_local, page, shaped, summarised  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
S = 10**9


def seeded_bucket(asgi_server, project, key):
    """50 traces in one minute: 48 between 100 and 570 ms, a 5 s and a 9 s one (the tail: P99 is
    9 s, far above P95 and P50 on the chart), two of the 48 failed."""
    minute = (time.time_ns() // (60 * S) - 20) * 60 * S
    traces = []
    for i in range(50):
        e2e = 100 + 10 * i if i < 48 else (5000 if i == 48 else 9000)
        spans = shaped(start_ns=minute + (1 + i % 50) * S // 2 + S, e2e_ms=e2e, service="chat-api")
        if i in (3, 7):
            spans[0].update(status="error", status_message="upstream <timeout>")
        traces.append(spans)
    post_spans(asgi_server, key, [s for t in traces for s in t])
    summarised(project.pk, 50)


def marker_centre(page, figure_id, name):
    """Where the (single) drawn marker of series ``name`` is on the screen."""
    chart_data(page, figure_id)  # drawn
    page.locator(f"#chart-{figure_id}").scroll_into_view_if_needed()
    return page.evaluate("""([id, name]) => {
        const gd = document.getElementById('chart-' + id);
        const i = gd.data.filter((t) => t.type === 'scatter').findIndex((t) => t.name === name);
        const r = gd.querySelectorAll('.scatterlayer .trace')[i].querySelector('.points path').getBoundingClientRect();
        return [r.x + r.width / 2, r.y + r.height / 2];
    }""", [figure_id, name])


def click_at(page, x, y):
    page.mouse.move(x, y - 2)
    page.mouse.move(x, y)  # plotly picks the hovered points, then the click reports them
    page.mouse.click(x, y)


def listed_durations(page):
    return [float(t.replace(" ms", "").replace(",", "")) for t in
            page.locator("tr[data-trace-id] td:nth-child(6)").all_inner_texts()]


def test_a_p99_point_opens_the_traces_at_or_above_it_slowest_first(page, asgi_server, make_user, project_with_key):
    from django.contrib.auth import get_user_model

    make_user("paula", password=PASSWORD)
    project, key = project_with_key("drill", members=[get_user_model().objects.get(username="paula")])
    seeded_bucket(asgi_server, project, key)
    log_in(page, asgi_server, "paula", "/?range=1h")
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("50")

    p99 = next(t for t in chart_data(page, "fig-latency") if t["name"] == "E2E P99")
    k = next(i for i, y in enumerate(p99["y"]) if y is not None)
    value, bucket_start = p99["y"][k], p99["x"][k]
    assert value == pytest.approx(9000.0, rel=0.005)  # the histogram bucket's value (docs/definitions.md)
    click_at(page, *marker_centre(page, "fig-latency", "E2E P99"))
    expect(page).to_have_url(re.compile(r"/traces/\?.*min_ms="), timeout=60_000)
    query = parse_qs(urlsplit(page.url).query)
    assert query["sort"] == ["duration"] and query["dir"] == ["desc"]
    # At or above the P99: from the bottom of the 0.5 % histogram bucket it was read from.
    assert value * 0.995 - 0.01 <= float(query["min_ms"][0]) <= value
    assert query["from"][0].replace("T", " ").rstrip("Z") == bucket_start
    expect(page.locator("#explorer-total")).to_contain_text("1 trace")
    assert listed_durations(page) == [9000.0]
    assert page.errors == []


def test_an_error_rate_point_opens_the_error_traces_not_the_bar_under_it(page, asgi_server, make_user, project_with_key):
    from django.contrib.auth import get_user_model

    make_user("erin", password=PASSWORD)
    project, key = project_with_key("drill-errors", members=[get_user_model().objects.get(username="erin")])
    seeded_bucket(asgi_server, project, key)
    log_in(page, asgi_server, "erin", "/?range=1h")
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("50")
    # The middle of the RPS bar opens all the traces of its bucket ...
    chart_data(page, "fig-traffic")
    page.locator("#chart-fig-traffic").scroll_into_view_if_needed()
    x, y = page.evaluate("""() => {
        const bars = Array.from(document.querySelectorAll('#chart-fig-traffic .barlayer .point path'))
            .map((p) => p.getBoundingClientRect()).filter((r) => r.height > 20);
        return [bars[0].x + bars[0].width / 2, bars[0].y + bars[0].height * 0.6];
    }""")
    click_at(page, x, y)
    expect(page).to_have_url(re.compile(r"/traces/\?from="), timeout=60_000)
    assert "status" not in parse_qs(urlsplit(page.url).query)
    expect(page.locator("#explorer-total")).to_contain_text("50 traces")
    page.go_back()
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("50")
    # ... and the error-rate marker, at the top of its own axis over the top of that bar, the
    # bucket's error traces.
    click_at(page, *marker_centre(page, "fig-traffic", "error rate %"))
    expect(page).to_have_url(re.compile(r"/traces/\?.*status=error"), timeout=60_000)
    expect(page.locator("tr[data-trace-id]")).to_have_count(2)
    expect(page.locator("tr.is-error")).to_have_count(2)
    expect(page.locator("tr[data-trace-id] .error-message").first).to_have_text("upstream <timeout>")

    # The tiles link to the traces behind them: the same range and filters, plus their own.
    page.goto(f"{asgi_server.url}/?range=1h&service=chat-api")
    tiles = {key: page.locator(f'[data-kpi="{key}"] a.kpi-traces').get_attribute("href")
             for key in ("requests", "error_rate", "e2e_p99", "ttft_p95", "cost")}
    for href in tiles.values():
        q = parse_qs(urlsplit(href).query)
        assert href.startswith("/traces/?") and q["range"] == ["1h"] and q["service"] == ["chat-api"]
    assert parse_qs(urlsplit(tiles["error_rate"]).query)["status"] == ["error"]
    assert parse_qs(urlsplit(tiles["cost"]).query)["sort"] == ["cost"]
    assert "ttft_ms" in parse_qs(urlsplit(tiles["ttft_p95"]).query)
    p99 = parse_qs(urlsplit(tiles["e2e_p99"]).query)
    shown = float(page.locator('[data-kpi="e2e_p99"] .value .num').inner_text().replace(",", ""))
    assert p99["sort"] == ["duration"] and p99["dir"] == ["desc"]
    assert shown * 0.995 - 0.1 <= float(p99["min_ms"][0]) <= min(shown, 9000)
    page.locator('[data-kpi="e2e_p99"] a.kpi-traces').click()
    expect(page.locator("#explorer-total")).to_contain_text("1 trace", timeout=60_000)
    assert listed_durations(page) == [9000.0]
    page.goto(f"{asgi_server.url}/?range=1h")
    page.locator('[data-kpi="error_rate"] a.kpi-traces').click()
    expect(page.locator("tr.is-error")).to_have_count(2, timeout=60_000)
    only_local(page, asgi_server)
    assert page.errors == []
