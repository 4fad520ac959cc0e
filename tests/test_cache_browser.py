"""The cache figures on the overview and costs pages in a real headless Chromium (served by the
in-process uvicorn server): the seeded traffic of tests/cache_seed.py draws its exact numbers, a new
cache hit sent through the ingest API redraws the overview's cache tiles live, and the costs page
lists the endpoints (their user-sent names as text, never markup)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

from tests.test_browser import ARTIFACTS, PASSWORD, browser, post_spans  # noqa: F401

from playwright.sync_api import expect  # noqa: E402  (after test_browser's Chromium check)

from tests.cache_seed import S, request, seed_cache_traffic  # noqa: E402
from tests.test_panels_browser import chart_data, log_in, non_null, only_local, page, summarised  # noqa: E402,F401
from tests.test_visual_browser import SIDEWAYS  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def in_thread(fn):
    """Seeding summarises and sends live events: not on the test thread, which runs playwright's loop."""
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive()


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / S, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def test_overview_and_costs_draw_the_cache_figures_and_redraw_live(page, asgi_server, make_user,  # noqa: F811
                                                                   project_with_key):
    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])
    t0_ns = (time.time_ns() // S // 60 * 60 - 30 * 60) * S
    in_thread(lambda: seed_cache_traffic(project.pk, t0_ns))
    window = f"from={iso(t0_ns)}&to={iso(t0_ns + 600 * S)}"

    log_in(page, asgi_server, user.username, f"/?{window}")
    section = page.locator("#cache-savings")
    expect(section.locator('[data-kpi="cache_hit_rate"] .value')).to_have_text("50.0 %")
    expect(section.locator('[data-kpi="cache_latency_saved"] .value')).to_have_text("1443.3 ms")
    drawn = {t["name"]: t for t in chart_data(page, "fig-cache")}
    assert non_null(drawn["hit rate %"]["y"]) == [40.0, 60.0]
    assert non_null(drawn["latency saved (P50)"]["y"]) == [1470.0, 1370.0]
    ARTIFACTS.mkdir(exist_ok=True)
    section.screenshot(path=str(ARTIFACTS / "overview-cache.png"))

    page.goto(f"{asgi_server.url}/costs/?{window}")
    costs = page.locator("#cache-savings")
    expect(costs.locator('[data-kpi="cache_cost_saved"] .value')).to_have_text("$0.018")
    expect(costs.locator('[data-kpi="cache_tokens_saved"] .value')).to_have_text("6400")
    expect(costs.locator("#cache-unpriced")).to_contain_text("2 hits without a miss to price them")
    rows = costs.locator("#cache-endpoints tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0).locator("td").first).to_have_text("chat-api · POST /summarize")
    saved = {t["name"]: t for t in chart_data(page, "fig-cache-saved")}
    assert [round(v, 6) for v in non_null(saved["cost saved"]["y"])] == [0.014, 0.004]
    by_endpoint = chart_data(page, "fig-cache-endpoints")[0]
    assert by_endpoint["x"] == ["chat-api · POST /summarize", "chat-api · POST /chat", "search · GET /search"]
    costs.screenshot(path=str(ARTIFACTS / "costs-cache.png"))
    page.set_viewport_size({"width": 800, "height": 900})  # the endpoint table wraps: no sideways scroll
    page.reload()
    chart_data(page, "fig-cache-endpoints")  # drawn at the new width
    width = page.evaluate(SIDEWAYS)
    assert width["scroll"] <= width["client"], width
    page.set_viewport_size({"width": 1400, "height": 900})

    # A live overview (a preset range): a new hit, summarised while the page is open, moves the tiles.
    page.goto(f"{asgi_server.url}/?range=1h")
    tile = page.locator('#cache-savings [data-kpi="cache_hit_rate"] .value')
    expect(tile).to_have_text("50.0 %")
    page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
    refreshed = page.evaluate("() => Number(document.body.dataset.overviewRefreshed || 0)")
    hit = request(service="search", name="GET /search", start_ns=time.time_ns() - 60 * S, e2e_ms=7, cache=True)
    post_spans(asgi_server, key, hit)
    in_thread(lambda: summarised(project.pk, 12))
    page.wait_for_function(f"() => Number(document.body.dataset.overviewRefreshed || 0) > {refreshed}")
    expect(tile).to_have_text("54.5 %")  # 6 hits of 11 requests that consulted a cache
    only_local(page, asgi_server)
    assert page.errors == []


def test_a_project_without_cache_lookups_gets_one_quiet_line(page, asgi_server, make_user,  # noqa: F811
                                                             project_with_key):
    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])
    plain = request(service="chat-api", name="POST /chat", start_ns=time.time_ns() - 120 * S, e2e_ms=900, cost=0.001,
                    tokens=(10, 5))
    post_spans(asgi_server, key, plain)
    in_thread(lambda: summarised(project.pk, 1))
    for path in ("/?range=15m", "/costs/?range=15m"):
        if path == "/?range=15m":
            log_in(page, asgi_server, user.username, path)
        else:
            page.goto(f"{asgi_server.url}{path}")
        expect(page.locator("#cache-none")).to_contain_text("No span has consulted a cache yet")
        expect(page.locator("#cache-savings")).to_have_count(0)
        expect(page.locator('[data-figure^="fig-cache"]')).to_have_count(0)
    assert page.errors == []
