"""The explorer's navigation in a real headless Chromium (issue 14, item 7): the total, Next then
Previous back to exactly the rows seen (rows with tied start times), error messages shown as text
(also in a row inserted live), and the short id the list shows, pasted into the trace-id field."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_browser import SEEN_URLS, PASSWORD, browser, log_in, page, post_spans  # noqa: F401  (fixtures)

from tests.explorer_seed import seed_traces, summary_insert  # noqa: E402
from tests.spans import llm_trace  # noqa: E402
from tests.test_explorer import make_trace  # noqa: E402

from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

NS, MS = 1_000_000_000, 1_000_000
HOSTILE = "<img src=x onerror=\"window.__xss=1\"> quota exceeded " + "z" * 120


@pytest.fixture(autouse=True)
def _own_urls_only():
    """As in test_explorer_browser: this module's URLs are not test_browser's to check."""
    mark = len(SEEN_URLS)
    yield
    del SEEN_URLS[mark:]


def shown_ids(page):
    return page.locator("table.explorer tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.traceId)")


def test_total_next_previous_error_messages_and_short_id(page, asgi_server, make_user, project_with_key):
    user = make_user("nora", password=PASSWORD)
    project, key = project_with_key("navigate", members=[user])
    now = time.time_ns()
    # 58 traces, three to a start time (ties across the page boundary), one failed with a hostile message.
    traces = [make_trace(start_ns=now - (1 + i // 3) * 60 * NS) for i in range(57)]
    failed = make_trace(start_ns=now - 30 * NS, error=True)
    failed[0]["status_message"] = HOSTILE
    ids = seed_traces(project_id=project.pk, traces=traces + [failed])
    log_in(page, asgi_server, "nora")
    page.goto(f"{asgi_server.url}/traces/?range=24h")
    rows = page.locator("table.explorer tbody tr")
    expect(rows).to_have_count(50)
    expect(page.locator("#explorer-total")).to_contain_text("58 traces match this query")
    first = shown_ids(page)

    message = page.locator(f'tr[data-trace-id="{ids[-1]}"] .error-message')
    expect(message).to_have_attribute("title", HOSTILE)
    assert message.inner_text().startswith('<img src=x onerror="window.__xss=1"> quota exceeded')
    assert message.inner_text().endswith("…") and len(message.inner_text()) <= 80
    assert page.locator("table.explorer img").count() == 0

    page.locator("#next-page").click()
    expect(page).to_have_url(re.compile(r"cursor="))
    expect(rows).to_have_count(8)
    second = shown_ids(page)
    assert sorted(first + second) == sorted(ids)
    page.locator("#prev-page").click()
    expect(rows).to_have_count(50)
    assert shown_ids(page) == first
    expect(page.locator("#prev-page")).to_have_count(0)  # the first page: nothing before it
    page.locator("#next-page").click()
    expect(rows).to_have_count(8)
    assert shown_ids(page) == second

    # The short id the list shows finds the trace, whatever the range.
    short = page.locator(f'tr[data-trace-id="{second[3]}"] .trace-link code').inner_text().rstrip("…")
    page.goto(f"{asgi_server.url}/traces/?range=15m")
    page.fill("input[name=trace_id]", short)
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"trace_id=" + short))
    expect(rows).to_have_count(1)
    assert shown_ids(page) == [second[3]]

    # A failed request arriving live shows its message too, as text.
    page.goto(f"{asgi_server.url}/traces/?range=1h")
    expect(rows).to_have_count(50)
    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/traces/') && s.readyState === WebSocket.OPEN)")
    spans = llm_trace(error=True, start_ns=time.time_ns() - NS)
    spans[0]["status_message"] = HOSTILE
    post_spans(asgi_server, key, spans)
    summary_insert(project_id=project.pk, spans=spans)
    live = page.locator(f'tr[data-trace-id="{spans[0]["trace_id"]}"] .error-message')
    expect(live).to_have_attribute("title", HOSTILE, timeout=60_000)
    assert live.inner_text().endswith("…") and page.locator("table.explorer img").count() == 0
    assert page.evaluate("window.__xss") is None
    assert page.watch.dialogs == [] and page.watch.page_errors == []
