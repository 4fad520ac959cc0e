"""The trace explorer in a real headless Chromium, served by uvicorn in this process (see
tests/test_browser.py for why): filters, sorting, the next page, hostile names shown as text, and
a live row inserted at the top while the reader is scrolled down, without moving what they read."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_browser import SEEN_URLS, ARTIFACTS, PASSWORD, browser, log_in, page, post_spans  # noqa: F401  (fixtures)

from tests.explorer_seed import seed_traces, summary_insert  # noqa: E402
from tests.spans import llm_trace  # noqa: E402
from tests.test_explorer import make_trace  # noqa: E402

from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

NS, MS = 1_000_000_000, 1_000_000
XSS_NAME = "<script>window.__xss=1</script>"
XSS_MODEL = '"><img src=x onerror="window.__xss=2">'


@pytest.fixture(autouse=True)
def _own_urls_only():
    """The shared ``page`` fixture records every URL for test_browser's no-external-requests check,
    which expects its own server's origin only: take this module's URLs back out."""
    mark = len(SEEN_URLS)
    yield
    del SEEN_URLS[mark:]


def durations_in_page(page) -> list[float]:
    cells = page.locator("table.explorer tbody tr td:nth-child(6)").all_inner_texts()
    return [float(c.replace(" ms", "")) for c in cells]


def test_explorer_filters_sorts_pages_and_escapes(page, asgi_server, make_user, project_with_key):
    user = make_user("erin", password=PASSWORD)
    project, _ = project_with_key("explore", members=[user])
    now = time.time_ns()
    traces = [make_trace(start_ns=now - (i + 1) * 60 * NS, error=i % 7 == 0,
                         durations={"network": 10 + i, "preprocess": 20, "inference": 100 + 13 * i, "postprocess": 5})
              for i in range(57)]
    traces.append(make_trace(start_ns=now - 30 * NS, name=XSS_NAME, model=XSS_MODEL))
    ids = seed_traces(project_id=project.pk, traces=traces)
    log_in(page, asgi_server, "erin")

    rows = page.locator("table.explorer tbody tr")
    expect(rows).to_have_count(50)
    hostile = page.locator(f'tr[data-trace-id="{ids[-1]}"]')
    expect(hostile.locator("td").nth(1)).to_have_text(XSS_NAME)
    expect(hostile.locator("td").nth(3)).to_have_text(XSS_MODEL)
    assert hostile.locator("img, script").count() == 0
    expect(rows.first.locator(".phase-bar .seg")).to_have_count(5)
    inference = rows.first.locator('.phase-bar .seg[data-phase="inference"]')
    assert inference.evaluate("(e) => getComputedStyle(e).backgroundColor") == "rgb(225, 87, 89)"  # PHASE_COLORS

    # Filter: errors only, through the form; the URL holds the query.
    page.select_option("select[name=status]", "error")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"status=error"))
    expect(rows).to_have_count(len([i for i in range(57) if i % 7 == 0]))
    assert all(s == "error" for s in page.locator("table.explorer tbody .status").all_inner_texts())

    # Sort by duration, from the header; then the other direction.
    page.get_by_role("link", name="Reset").click()
    expect(rows).to_have_count(50)
    page.locator("th a[data-sort=duration]").click()
    expect(page).to_have_url(re.compile(r"sort=duration&dir=desc"))
    shown = durations_in_page(page)
    assert shown == sorted(shown, reverse=True) and len(shown) == 50
    page.locator("th a[data-sort=duration]").click()
    expect(page).to_have_url(re.compile(r"sort=duration&dir=asc"))
    first_page = durations_in_page(page)
    assert first_page == sorted(first_page)

    # Next page: the rest, still in order, no row twice.
    first_ids = page.locator("table.explorer tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.traceId)")
    page.locator("#next-page").click()
    expect(page).to_have_url(re.compile(r"cursor="))
    expect(rows).to_have_count(58 - 50)
    second = durations_in_page(page)
    assert second == sorted(second) and second[0] >= first_page[-1]
    second_ids = page.locator("table.explorer tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.traceId)")
    assert sorted(first_ids + second_ids) == sorted(ids)

    # A bad value is a form error, not a crash.
    page.goto(f"{asgi_server.url}/traces/?min_ms=soon")
    expect(page.locator(".form-errors-box")).to_contain_text("min_ms")
    assert page.evaluate("window.__xss") is None
    assert page.watch.dialogs == [] and page.watch.page_errors == []


def test_live_row_is_inserted_at_the_top_without_moving_what_the_reader_sees(page, asgi_server, make_user, project_with_key):
    user = make_user("frank", password=PASSWORD)
    project, key = project_with_key("live-scroll", members=[user])
    now = time.time_ns()
    ids = seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - (i + 1) * 60 * NS) for i in range(40)])
    page.set_viewport_size({"width": 1280, "height": 600})
    log_in(page, asgi_server, "frank")
    page.goto(f"{asgi_server.url}/traces/?range=1h")
    expect(page.locator("table.explorer tbody tr")).to_have_count(40)
    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/traces/') && s.readyState === WebSocket.OPEN)")

    # The reader scrolls down to the 20th row.
    anchor = page.locator(f'tr[data-trace-id="{ids[19]}"]')
    anchor.evaluate("(r) => window.scrollTo(0, r.getBoundingClientRect().top + window.scrollY - 100)")
    before_top = anchor.evaluate("(r) => r.getBoundingClientRect().top")
    before_scroll = page.evaluate("window.scrollY")
    assert before_scroll > 0

    spans = llm_trace(name=XSS_NAME, start_ns=time.time_ns() - NS)
    post_spans(asgi_server, key, spans)  # announces the trace id (traces.ingested)
    summary_insert(project_id=project.pk, spans=spans)  # what the summariser writes
    new_row = page.locator(f'tr[data-trace-id="{spans[0]["trace_id"]}"]')
    expect(new_row).to_have_count(1)
    expect(page.locator("table.explorer tbody tr")).to_have_count(41)
    assert page.locator("table.explorer tbody tr").first.get_attribute("data-trace-id") == spans[0]["trace_id"]
    expect(new_row.locator("td").nth(1)).to_have_text(XSS_NAME)  # built with textContent
    assert new_row.locator("script, img").count() == 0
    after_top = anchor.evaluate("(r) => r.getBoundingClientRect().top")
    assert abs(after_top - before_top) <= 1, (before_top, after_top)
    assert page.evaluate("window.scrollY") > before_scroll  # the page scrolled by the new row's height
    assert page.evaluate("window.__xss") is None
    ARTIFACTS.mkdir(exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "explorer.png"), full_page=False)
    assert page.watch.page_errors == []


def test_off_the_first_page_new_traces_are_counted_not_inserted(page, asgi_server, make_user, project_with_key):
    user = make_user("gina", password=PASSWORD)
    project, key = project_with_key("live-banner", members=[user])
    now = time.time_ns()
    seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - (i + 1) * 60 * NS) for i in range(3)])
    log_in(page, asgi_server, "gina")
    page.goto(f"{asgi_server.url}/traces/?range=1h&sort=duration&dir=desc")
    expect(page.locator("table.explorer tbody tr")).to_have_count(3)
    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/traces/') && s.readyState === WebSocket.OPEN)")
    spans = llm_trace(start_ns=time.time_ns() - NS)
    post_spans(asgi_server, key, spans)
    summary_insert(project_id=project.pk, spans=spans)
    expect(page.locator("#live-banner")).to_be_visible()
    expect(page.locator("#live-count")).to_have_text("1")
    expect(page.locator("table.explorer tbody tr")).to_have_count(3)
    page.locator("#live-show").click()
    expect(page.locator("table.explorer tbody tr")).to_have_count(4)
