"""The pages in a real headless Chromium, served by a real ASGI server (uvicorn) in this process.

Why uvicorn and not pytest-django's ``live_server``: ``live_server`` is a WSGI server and does not
speak websockets, and the traces page's live banner needs ``/ws/projects/<id>/traces/``. The
server runs in a thread of the test process because the embedded ClickHouse (chdb) can be opened
by one process only, and this process already holds it. Spans are posted over HTTP to that same
server, so the ingest's ``group_send`` runs on the server's event loop: the in-memory channel
layer keeps one ``asyncio.Queue`` per channel, bound to the loop that reads it, so a
``group_send`` from the test thread's own loop is not a safe way to wake the consumer.

Chromium is Debian's (``/usr/bin/chromium``); ``playwright install`` cannot download here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from tests.conftest import BROWSER_TIMEOUT_MS  # noqa: E402
from tests.explorer_seed import summary_insert  # noqa: E402
from tests.spans import llm_trace  # noqa: E402  (asgi_server: tests/conftest.py)

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-quic",
    "--no-first-run", "--disable-component-update", "--disable-sync",
]
PASSWORD = "correct-horse-battery-7"
XSS_NAME = "<script>window.__xss=1</script>"
XSS_SERVICE = '"><img src=x onerror="window.__xss=2">'

# Every URL any page asked for (HTTP requests and websockets), across the module's tests.
SEEN_URLS: list[str] = []

# Records the page's websockets so a test can wait until the live socket is open (readyState 1:
# the server accepted it, which it does only after joining the project's group).
TRACK_SOCKETS = """
(() => {
  const Native = window.WebSocket;
  window.__sockets = [];
  window.WebSocket = class extends Native {
    constructor(...args) { super(...args); window.__sockets.push(this); }
  };
})();
"""


@pytest.fixture(scope="module")
def browser():
    with pytest.MonkeyPatch.context() as mp, sync_playwright() as p:
        # Playwright's sync API keeps an asyncio loop running (in a greenlet) in the test thread,
        # so Django sees "an async context" there and refuses the ORM calls of fixtures, tests and
        # the transactional flush (SynchronousOnlyOperation). Nothing here is async; allow them,
        # for this module's browser lifetime only.
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class PageWatch:
    def __init__(self):
        self.dialogs: list[str] = []
        self.page_errors: list[str] = []
        self.websockets: list[str] = []


@pytest.fixture
def page(browser, asgi_server):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(BROWSER_TIMEOUT_MS)
    context.add_init_script(TRACK_SOCKETS)
    watch = PageWatch()
    context.on("request", lambda request: SEEN_URLS.append(request.url))
    page = context.new_page()

    def on_dialog(dialog):
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_websocket(ws):
        SEEN_URLS.append(ws.url)
        watch.websockets.append(ws.url)

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda error: watch.page_errors.append(str(error)))
    page.on("websocket", on_websocket)
    page.watch = watch
    yield page
    context.close()
    asgi_server.wait_idle()  # before the test database is flushed


def post_spans(server, key, spans):
    """POST to the ingest API of the running server (so the ingest runs inside it)."""
    request = urllib.request.Request(
        f"{server.url}/api/v1/traces", data=json.dumps({"spans": spans}).encode(), method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        body = json.loads(response.read())
    assert body == {"accepted": len(spans), "rejected": []}, body
    settle_writer()
    return body


def settle_writer():
    """Wait until what the writer acknowledged is in ClickHouse. A lone request is (ingest.writer),
    but one that arrives while journaled rows wait, or while an earlier test's batch waits in the
    spool, is acknowledged before it is readable; the pages a test opens next must find it."""
    from ingest.writer import current_writer
    from tests.conftest import spool_drained

    writer = current_writer()
    if writer is None:
        return
    assert writer.flush(timeout=90), f"the journal was not inserted in 90 s; writer: {writer_state()}"
    if writer.spool.pending():
        spool_drained(writer, timeout=90, message=f"the spool to drain; writer: {writer_state()}")


def writer_state() -> str:
    """The ingest writer's state, for a failure message (a page that did not find what a test sent)."""
    from ingest.writer import current_writer

    writer = current_writer()
    if writer is None:
        return "no writer started"
    return (f"spool pending {writer.spool.pending()}, journaled rows {writer._journaled_rows}, "
            f"store ok {writer._store_ok}, stats {dict(writer.stats)}")


def open_page(page, url, ready: str):
    """Go to ``url`` and wait for ``ready`` (a JS expression) to be true. A page that answered with
    an error fails at once, saying what it showed and what the ingest writer held."""
    response = page.goto(url)
    if response is None or not response.ok:
        text = page.locator("body").inner_text()[:800]
        raise AssertionError(f"{url} answered {response and response.status}: {text!r}; writer: {writer_state()}")
    page.wait_for_function(f"() => {ready}")


def log_in(page, server, username, password=PASSWORD):
    page.goto(f"{server.url}/traces/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/traces/$"))
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{server.url}/traces/")


def test_login_then_traces_list_shows_hostile_names_as_text(page, asgi_server, make_user, project_with_key):
    alice = make_user("alice", password=PASSWORD)
    project, key = project_with_key("shop", members=[alice])
    spans = llm_trace(name=XSS_NAME, service=XSS_SERVICE)
    trace_id = spans[0]["trace_id"]
    post_spans(asgi_server, key, spans)
    summary_insert(project_id=project.pk, spans=spans)  # what the summariser writes seconds later

    page.goto(f"{asgi_server.url}/traces/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/traces/$"))
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    page.fill("#id_username", "alice")
    page.fill("#id_password", "wrong-password")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("p.error")).to_contain_text("didn't match")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{asgi_server.url}/traces/")

    row = page.locator(f'tr[data-trace-id="{trace_id}"]')
    expect(row).to_be_visible()
    expect(row.locator("td").nth(0).locator("a")).to_have_attribute("href", f"/traces/{trace_id}/")
    expect(row.locator("td").nth(0)).to_have_text(trace_id[:12] + "…")
    expect(row.locator("td").nth(1)).to_have_text(XSS_NAME)  # shown literally, i.e. escaped
    expect(row.locator("td").nth(2)).to_have_text(XSS_SERVICE)
    expect(row.locator("td").nth(10)).to_have_text("5")  # spans
    expect(page.locator("header .user")).to_have_text("alice")
    expect(page.locator(".project-switch select option:checked")).to_have_text("shop")
    assert row.locator("img, script").count() == 0
    assert page.evaluate("window.__xss") is None
    assert page.watch.dialogs == []
    assert page.watch.page_errors == []

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "traces.png"), full_page=True)
    assert (ARTIFACTS / "traces.png").stat().st_size > 0


def test_traces_summarised_while_the_page_is_open_appear_at_the_top(page, asgi_server, make_user, project_with_key):
    bob = make_user("bob", password=PASSWORD)
    project, key = project_with_key("live", members=[bob])
    first = llm_trace(name="first")
    post_spans(asgi_server, key, first)
    summary_insert(project_id=project.pk, spans=first)
    log_in(page, asgi_server, "bob")
    expect(page.locator("table.traces tbody tr")).to_have_count(1)

    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/traces/') && s.readyState === WebSocket.OPEN)")
    assert f"{asgi_server.ws_url}/ws/projects/{project.pk}/traces/" in page.watch.websockets

    # Ingested, then summarised: the page asks for the announced traces that match its query.
    second = llm_trace(name="second", start_ns=time.time_ns() - 1_000_000_000)
    post_spans(asgi_server, key, second)
    summary_insert(project_id=project.pk, spans=second)
    expect(page.locator("table.traces tbody tr")).to_have_count(2)
    expect(page.locator("table.traces tbody tr").first).to_have_attribute("data-trace-id", second[0]["trace_id"])
    expect(page.locator("table.traces tbody tr").first.locator("td").nth(1)).to_have_text("second")
    # Spans whose trace is never summarised add no row.
    post_spans(asgi_server, key, llm_trace(name="third")[:2])
    page.wait_for_timeout(4000)
    expect(page.locator("table.traces tbody tr")).to_have_count(2)
    expect(page.locator("#live-banner")).to_be_hidden()
    assert page.watch.dialogs == [] and page.watch.page_errors == []


def test_pages_make_no_external_requests(page, asgi_server, make_user, project_with_key):
    carol = make_user("carol", password=PASSWORD)
    _, key = project_with_key("own-origin", members=[carol])
    post_spans(asgi_server, key, llm_trace())
    log_in(page, asgi_server, "carol")
    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/traces/') && s.readyState === WebSocket.OPEN)")
    page.wait_for_load_state("networkidle")

    origins = (asgi_server.url + "/", asgi_server.ws_url + "/")
    assert SEEN_URLS, "no requests were recorded"
    assert any(url.startswith(asgi_server.ws_url + "/ws/") for url in SEEN_URLS)
    assert any(url.startswith(asgi_server.url + "/static/") for url in SEEN_URLS)
    foreign = sorted({url for url in SEEN_URLS if not url.startswith(origins)})
    assert foreign == [], f"pages reached outside {asgi_server.url}: {foreign}"
