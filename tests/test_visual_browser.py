"""One visual language, checked in a real headless Chromium: at an 800 px wide window no page
scrolls sideways (the traces explorer, the alerts page with its wide tables, overview, resources, engines),
and the pages' own forms, tables and buttons get the shared styles of app.css."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_browser import ARTIFACTS, PASSWORD, browser, post_spans  # noqa: F401

from playwright.sync_api import expect  # noqa: E402  (after test_browser's Chromium check)

from tests.spans import llm_trace  # noqa: E402
from tests.test_panels_browser import summarised  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
S = 10**9


@pytest.fixture
def narrow_page(browser, asgi_server):  # noqa: F811
    context = browser.new_context(viewport={"width": 800, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()
    asgi_server.wait_idle()  # before the test database is flushed


def log_in(page, server, username, path):
    page.goto(f"{server.url}{path}")
    expect(page).to_have_url(re.compile(r"/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{server.url}{path}")


SIDEWAYS = """() => ({scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth,
  culprits: Array.from(document.querySelectorAll('body *')).filter((e) => e.getBoundingClientRect().right >
    document.documentElement.clientWidth + 1).slice(0, 8).map((e) => e.tagName + '.' + e.className + '#' + e.id)})"""


def test_no_page_scrolls_sideways_at_800px(narrow_page, asgi_server, make_user, project_with_key):
    page = narrow_page
    make_user("nora", password=PASSWORD)
    from django.contrib.auth import get_user_model

    nora = get_user_model().objects.get(username="nora")
    project, key = project_with_key("a-project-with-a-rather-long-name", members=[nora])
    now = time.time_ns()
    traces = [llm_trace(service="a-service-with-a-long-name", model="a-model-with-a-long-name-v2",
                        start_ns=now - (9 - i) * 60 * S) for i in range(3)]
    post_spans(asgi_server, key, [s for t in traces for s in t])
    summarised(project.pk, 3)

    log_in(page, asgi_server, "nora", "/traces/")
    expect(page.locator("tr[data-trace-id]")).to_have_count(3)
    sideways = []
    from store import get_store

    get_store().insert("engine_samples", [  # an engine instance with long labels, for /engines/
        {"project_id": project.pk, "time": now - 60 * S, "host": "a-gpu-host-with-a-long-name", "engine": "vllm",
         "target": "http://a-gpu-host-with-a-long-name.internal.example:8000/metrics",
         "model": "meta-llama/Llama-3.1-70B-Instruct-with-a-long-suffix", "metric": metric, "le": 0.0, "value": value}
        for metric, value in (("kv_cache_usage", 93.0), ("requests_running", 12), ("requests_waiting", 4))],
        tag="tests.visual_browser")
    for path in ["/traces/", "/alerts/", "/", "/resources/", "/engines/", "/costs/", "/compare/", "/loadtests/",
                 "/settings/", "/alerts/rules/new/"]:
        page.goto(f"{asgi_server.url}{path}")
        page.wait_for_load_state("load")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"narrow{path.replace('/', '_')}.png"), full_page=True)
        width = page.evaluate(SIDEWAYS)
        if width["scroll"] > width["client"]:
            sideways.append((path, width))
    assert sideways == []
    assert page.errors == []


def test_waterfall_ruler_never_covers_the_top_row_after_scrolling(browser, asgi_server, make_user,  # noqa: F811
                                                                   project_with_key):
    from tests.trace_seed import big_trace, seed

    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    tid = seed(big_trace(300), project_id=project.pk)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(60_000)
    page = context.new_page()
    try:
        log_in(page, asgi_server, user.username, f"/traces/{tid}/")
        page.wait_for_function("() => { const w = document.getElementById('waterfall'); return !!w && w.dataset.ready === '1'; }")
        page.locator("#wf-list").hover()
        for delta in (100, 137, 61):  # wheel steps that end between two rows
            page.mouse.wheel(0, delta)
            page.wait_for_function("""() => { const l = document.getElementById('wf-list');
                return l.scrollTop > 0 && Math.abs(l.scrollTop / 24 - Math.round(l.scrollTop / 24)) < 0.02; }""")
            page.wait_for_function("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))")
            boxes = page.evaluate("""() => {
                const ruler = document.getElementById('wf-ruler').getBoundingClientRect();
                const rows = [...document.querySelectorAll('.wf-row:not([hidden])')].map((r) => r.getBoundingClientRect())
                    .filter((b) => b.bottom > ruler.bottom + 0.5).sort((a, b) => a.top - b.top);
                return {rulerBottom: ruler.bottom, firstTop: rows[0].top};
            }""")
            assert boxes["firstTop"] >= boxes["rulerBottom"] - 0.5, (delta, boxes)
    finally:
        context.close()


def test_resources_latest_table_redraws_live_with_the_charts(browser, asgi_server, make_user,  # noqa: F811
                                                             project_with_key):
    import json
    import urllib.request

    from tests.test_browser import TRACK_SOCKETS

    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])

    def post_samples(samples):
        request = urllib.request.Request(
            f"{asgi_server.url}/api/v1/resources", data=json.dumps({"samples": samples}).encode(), method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["accepted"] == len(samples)

    post_samples([{"time": time.time_ns() - 30 * S, "host": "gpu-a", "gpu_index": 0, "gpu_utilization": 40.0,
                   "gpu_memory_used": 40 * 2**30, "gpu_memory_total": 80 * 2**30}])
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(60_000)
    context.add_init_script(TRACK_SOCKETS)
    page = context.new_page()
    try:
        log_in(page, asgi_server, user.username, "/resources/?range=15m")
        util = page.locator('#latest-table tr[data-host="gpu-a"][data-gpu="0"] td:nth-child(6)')
        expect(util).to_have_text("40.0")
        page.evaluate("() => { window.__sameDocument = true; }")
        page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
        post_samples([{"time": time.time_ns(), "host": "gpu-a", "gpu_index": 0, "gpu_utilization": 91.0,
                       "gpu_memory_used": 72 * 2**30, "gpu_memory_total": 80 * 2**30}])
        expect(util).to_have_text("91.0")  # the table, not only the chart
        mem = page.locator('#latest-table tr[data-host="gpu-a"][data-gpu="0"] td:nth-child(7)')
        expect(mem).to_have_text("90.0")
        expect(mem).to_have_class(re.compile(r"\bover\b"))  # at or over 85 %: flagged, as the server renders it
        page.wait_for_function("""() => Array.from(document.getElementById('chart-fig-gpu-util').data[0].y).includes(91)""")
        assert page.evaluate("() => window.__sameDocument === true")  # redrawn in place, no reload
    finally:
        context.close()
