"""The Variants page in a real headless Chromium: the side-by-side table with each difference's
verdict, and the E2E distribution and score charts drawn by plotly."""

from __future__ import annotations

import threading

import pytest

from tests.test_browser import PASSWORD, browser  # noqa: F401

from playwright.sync_api import expect  # noqa: E402  (after test_browser's Chromium check)

from tests.test_panels_browser import chart_data, log_in, page  # noqa: E402,F401
from tests.test_variants import t0, window  # noqa: E402
from tests.variants_seed import seed_variants  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def test_variants_page_draws_the_table_and_charts(page, asgi_server, make_user, project_with_key):  # noqa: F811
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    start = t0()
    worker = threading.Thread(target=lambda: seed_variants(project.pk, t0_ns=start))
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive()

    log_in(page, asgi_server, user.username, f"/variants/?{window(start)}")
    table = page.locator("#variants-table")
    expect(table.locator("thead th")).to_have_count(3)
    expect(table.locator("thead th").nth(2)).to_have_text("int8")
    p50 = table.locator('tr[data-metric="E2E P50"] td').nth(2)
    expect(p50).to_have_class("num better")
    expect(p50.locator(".verdict")).to_have_text("significant")
    expect(table.locator('tr[data-metric="Error rate"] td').nth(2).locator(".verdict")).to_have_text("not significant")
    expect(table.locator('tr[data-metric="quality mean"] td').nth(2)).to_have_class("num worse")
    boxes = chart_data(page, "fig-variants-e2e")
    assert [b["name"] for b in boxes] == ["fp16", "int8"]
    assert len(boxes[0]["y"]) == 120 and len(boxes[1]["y"]) == 120
    bars = chart_data(page, "fig-variants-scores")
    assert [b["name"] for b in bars] == ["fp16", "int8"] and bars[0]["x"] == ["helpful", "quality"]
    assert page.errors == []
