"""Every page passes the Content-Security-Policy in a real browser (issue 9, point 3): headless
Chromium loads each page of the app (the page rows of the security matrix, the login page and the
admin) as a member with data in the project, and no ``securitypolicyviolation`` event fires and no
console message reports a blocked resource. A control shows the detector works: an inline script
injected into a loaded page is blocked and reported."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

from django.test import Client  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from tests.alerts_support import insert_samples, sample  # noqa: E402
from tests.conftest import BROWSER_TIMEOUT_MS  # noqa: E402
from tests.test_browser import CHROMIUM_ARGS  # noqa: E402
from tests.test_security_matrix import MATRIX, world  # noqa: E402,F401  (world: the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
});
"""
def _page_names() -> list[str]:
    """Matrix rows that render HTML (not JSON endpoints)."""
    names = []
    for name, row in MATRIX.items():
        if row.kind == "page" and "json" not in name:
            names.append(name)
    return sorted(names)


@pytest.fixture(scope="module")
def browser():
    with pytest.MonkeyPatch.context() as mp, sync_playwright() as p:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # see tests/test_browser.py
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _session_cookie(user, server) -> dict:
    client = Client()
    client.force_login(user)
    return {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": server.url}


def _open(browser, server, user=None):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(BROWSER_TIMEOUT_MS)
    context.add_init_script(WATCH)
    if user is not None:
        context.add_cookies([_session_cookie(user, server)])
    page = context.new_page()
    page.console_problems = []
    page.on("console", lambda m: page.console_problems.append(m.text)
            if "Content Security Policy" in m.text or "Refused to" in m.text else None)
    return context, page


def _violations(page) -> list[str]:
    page.wait_for_timeout(300)  # violation events are dispatched asynchronously
    return page.evaluate("window.__csp") + page.console_problems


def test_every_page_passes_the_policy(browser, asgi_server, world, django_user_model):
    now = time.time()
    from datetime import datetime, timezone

    when = datetime.fromtimestamp(now - 60, tz=timezone.utc)
    insert_samples([sample(world.a.pk, when, mem_pct=50, util=60, temp=55, cpu=30),
                    sample(world.a.pk, when, gpu_index=-1, cpu=30)])
    context, page = _open(browser, asgi_server, world.alice)
    problems, pages = {}, _page_names()
    assert "dashboard:home" in pages and "dashboard:trace" in pages and len(pages) >= 12
    for name in pages:
        url = asgi_server.url + MATRIX[name].path(world)
        response = page.goto(url, wait_until="networkidle")
        assert response.status == MATRIX[name].member_status, (name, response.status)
        assert response.headers.get("content-security-policy", "").startswith("default-src 'self'"), name
        found = _violations(page)
        if found:
            problems[name] = found
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(asgi_server.url + MATRIX["dashboard:resources"].path(world), wait_until="networkidle")
    page.screenshot(path=str(ARTIFACTS / "csp-resources.png"))
    context.close()

    staff = django_user_model.objects.create_superuser("csp-root", "root@example.com", "pw-for-tests-1")
    context, page = _open(browser, asgi_server, staff)
    for path in ("/admin/", "/admin/projects/project/", f"/admin/projects/project/{world.a.pk}/change/"):
        assert page.goto(asgi_server.url + path, wait_until="networkidle").status == 200, path
        found = _violations(page)
        if found:
            problems[path] = found
    context.close()

    context, page = _open(browser, asgi_server)
    page.goto(asgi_server.url + "/login/", wait_until="networkidle")
    if _violations(page):
        problems["login"] = _violations(page)
    # The control: inline script injected into the page is blocked and reported.
    page.evaluate("""() => { const s = document.createElement("script");
                             s.textContent = "window.__ran = 1"; document.body.appendChild(s); }""")
    assert page.evaluate("window.__ran") is None
    assert any("script-src" in v for v in _violations(page))
    context.close()
    assert not problems, problems
