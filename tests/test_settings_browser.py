"""The settings page in a real headless Chromium (issue 14, item 1): a member creates an ingest key,
sees it once with its snippets, copies it, sends a span exactly as the curl snippet says, revokes
the key and the next request with it is a 401. Served by uvicorn in this process (tests/live.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import urllib.error
import urllib.request

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-quic",
    "--no-first-run", "--disable-component-update", "--disable-sync",
]
PASSWORD = "correct-horse-battery-7"
XSS_NAME = "<img src=x onerror=\"window.__xss=1\">"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    with pytest.MonkeyPatch.context() as mp, sync_playwright() as p:
        # Playwright's sync API runs an asyncio loop in this thread; the fixtures' ORM calls are not async.
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, asgi_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=asgi_server.url)
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.on("console", lambda msg: page.errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    asgi_server.wait_idle()  # before the test database is flushed


def _send_as_curl(curl: str) -> tuple[int, dict]:
    """Do what the curl snippet says: its URL, its headers and its body, nothing else."""
    args = shlex.split(curl.replace("\\\n", " "))
    assert args[:3] == ["curl", "-X", "POST"], args
    url, headers, body = args[3], {}, None
    rest = args[4:]
    while rest:
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "-H":
            name, _, header_value = value.partition(": ")
            headers[name] = header_value
        elif flag == "-d":
            body = value.encode()
        else:
            raise AssertionError(f"unexpected curl argument {flag}")
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _settings_ready(page):
    page.wait_for_function("() => document.body.dataset.settingsReady === '1'", timeout=WAIT_MS)


def test_create_copy_use_and_revoke_a_key(page, asgi_server, make_user, project_with_key):
    alice = make_user("alice", password=PASSWORD)
    project, _ = project_with_key("shop", members=[alice])
    server = asgi_server.url

    page.goto(f"{server}/settings/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/settings/$"))
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{server}/settings/")
    _settings_ready(page)
    expect(page.locator("#api-keys tbody tr")).to_have_count(1)  # the project's first key

    page.get_by_label("Key name").fill(XSS_NAME)
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-secret")
    expect(secret).to_be_visible()
    _settings_ready(page)
    raw = secret.inner_text().strip()
    assert re.fullmatch(r"td_[0-9a-f]{12}_[A-Za-z0-9_-]+", raw), raw
    assert page.evaluate("() => window.__xss") is None  # the hostile name is text
    expect(page.locator("#new-key-title")).to_contain_text(XSS_NAME)

    # The snippets name this server and the new key.
    sdk = page.locator("#snippet-sdk").inner_text()
    assert f"export TRACEDASH_ENDPOINT={server}\nexport TRACEDASH_API_KEY={raw}" in sdk
    otlp = page.locator("#snippet-otlp").inner_text()
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT={server}" in otlp and f"Authorization=Bearer%20{raw}" in otlp
    curl = page.locator("#snippet-curl").inner_text()
    assert curl.startswith(f"curl -X POST {server}/api/v1/traces")

    page.locator('button[data-copy="new-key-secret"]').click()
    expect(page.locator("#copy-status")).to_have_text("Copied the key to the clipboard.")
    assert page.evaluate("() => navigator.clipboard.readText()") == raw

    # Shown once: the page afterwards lists the key by its prefix, never its secret.
    prefix = raw.split("_")[1]
    page.goto(f"{server}/settings/?project={project.pk}")
    _settings_ready(page)
    row = page.locator(f'tr[data-key-prefix="{prefix}"]')
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("never")
    assert raw not in page.content()

    status, body = _send_as_curl(curl)
    assert (status, body) == (200, {"accepted": 1, "rejected": []})
    page.reload()
    _settings_ready(page)
    expect(row.locator("td").nth(3)).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d$"))  # last used

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    expect(page.locator("p.banner")).to_contain_text(f"Revoked td_{prefix}_…")
    expect(page.locator(f'tr[data-key-prefix="{prefix}"]')).to_contain_text("revoked")
    status, body = _send_as_curl(curl)
    assert status == 401 and body["error"]["code"] == "invalid_key", (status, body)
    assert page.errors == [], page.errors


def test_dismissing_the_confirmation_keeps_the_key(page, asgi_server, make_user, project_with_key):
    from projects.services import api_key_authenticate

    bob = make_user("bob", password=PASSWORD)
    project, raw = project_with_key("kept", members=[bob])
    page.goto(f"{asgi_server.url}/login/?next=/settings/%3Fproject%3D{project.pk}")
    page.fill("#id_username", "bob")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    _settings_ready(page)
    dialogs = []

    def dismiss(dialog):
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.get_by_role("button", name="Revoke").click()
    page.wait_for_function("() => document.readyState === 'complete'")
    assert dialogs and "Revoke td_" in dialogs[0]
    assert api_key_authenticate(raw_key=raw) is not None
    expect(page.locator("#api-keys")).to_contain_text("active")


def test_index_and_stop_indexing_an_attribute_key(page, asgi_server, make_user, project_with_key):
    """The Indexed attribute keys section: a member indexes a key (listed as backfilling, escaped),
    sees it indexed once the backfill ran, and removes it after confirming."""
    from analytics import attribute_index

    alice = make_user("alice", password=PASSWORD)
    project, _ = project_with_key("shop", members=[alice])
    server = asgi_server.url
    page.goto(f"{server}/login/?next=/settings/%3Fproject%3D{project.pk}")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    _settings_ready(page)
    expect(page.locator("#index-keys-none")).to_be_visible()

    page.fill("#index_key", XSS_NAME)
    page.get_by_role("button", name="Index this key").click()
    _settings_ready(page)
    row = page.locator("#index-key-list tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("code")).to_have_text(XSS_NAME)  # shown as text, never run
    expect(row).to_contain_text("backfilling")
    attribute_index.index_backfill(project_ids=[project.pk], delay_seconds=0)
    page.reload()
    _settings_ready(page)
    expect(page.locator("#index-key-list tbody tr td").nth(1)).to_have_text("indexed")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#index-key-list").get_by_role("button", name="Remove").click()
    _settings_ready(page)
    expect(page.locator("#index-keys-none")).to_be_visible()
    assert attribute_index.indexed_keys(project_id=project.pk) == []
    assert page.evaluate("window.__xss") is None and not page.errors, page.errors
