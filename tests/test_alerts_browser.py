"""The live firing banner in a real headless Chromium: a page left open shows an alert that fires
after it loaded, pushed over ws/projects/<id>/alerts/ from another thread (as the embedded beat
does), with hostile names rendered as text, and hides it again when the alert resolves."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM}", allow_module_level=True)

from django.utils import timezone  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

from alerts.models import AlertRule  # noqa: E402
from alerts.services import alerts_evaluate_round, rule_create  # noqa: E402
from tests.alerts_support import insert_samples, sample  # noqa: E402
from tests.conftest import BROWSER_TIMEOUT_MS  # noqa: E402
from tests.test_browser import TRACK_SOCKETS  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu", "--no-first-run"]
PASSWORD = "correct-horse-battery-7"
XSS = "<img src=x onerror=\"window.__xss=1\">"


@pytest.fixture
def page(asgi_server, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # playwright's sync API runs a loop in this thread
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.set_default_timeout(BROWSER_TIMEOUT_MS)
        page.add_init_script(TRACK_SOCKETS)
        yield page
        browser.close()
    asgi_server.wait_idle()  # before the test database is flushed


def test_banner_appears_live_and_clears_on_resolve(page, asgi_server, make_user, project_with_key):
    user = make_user("banner-user", password=PASSWORD)
    project, _ = project_with_key(members=[user])
    AlertRule.objects.filter(project=project).delete()
    rule_create(project=project, name=f"hot {XSS}", metric="gpu_memory_percent", aggregation="last",
                window_seconds=60, comparator="gte", threshold=85)
    page.goto(f"{asgi_server.url}/traces/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/traces/$"))
    banner = page.locator("#alerts-banner")
    expect(banner).to_be_hidden()
    # the banner's socket is open: its consumer joined the project's group before accepting it
    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/alerts/') && s.readyState === WebSocket.OPEN)")

    now = timezone.now()
    insert_samples([sample(project.pk, now - timedelta(seconds=1), mem_pct=93)])
    alerts_evaluate_round(deliver="none")  # this thread, not the server's loop: like the embedded beat
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("1 alert firing")
    expect(banner).to_contain_text(f"hot {XSS}")  # as text
    assert page.evaluate("window.__xss") is None
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "alerts-banner.png"))

    insert_samples([sample(project.pk, timezone.now(), mem_pct=40)])
    alerts_evaluate_round(deliver="none")
    expect(banner).to_be_hidden()
    page.goto(f"{asgi_server.url}/alerts/")
    expect(page.locator("#alert-history")).to_contain_text("firing → resolved")
    page.screenshot(path=str(ARTIFACTS / "alerts-page.png"), full_page=True)
    rule = AlertRule.objects.get(project=project)
    page.goto(f"{asgi_server.url}/alerts/rules/{rule.pk}/")
    expect(page.locator("#rule-preview .main-svg").first).to_be_visible()  # plotly drew it
    expect(page.locator("#rule-preview")).to_contain_text("threshold ≥ 85")
    page.screenshot(path=str(ARTIFACTS / "alerts-rule-editor.png"), full_page=True)


def test_rule_preview_is_posted_and_no_url_carries_the_csrf_token(page, asgi_server, make_user, project_with_key):
    user = make_user("preview-user", password=PASSWORD)
    project, _ = project_with_key(members=[user])
    insert_samples([sample(project.pk, timezone.now() - timedelta(minutes=m), host="box", gpu_index=-1, cpu=40 + m)
                    for m in range(0, 20, 2)])
    requests = []
    page.on("request", lambda r: requests.append((r.method, r.url)))
    page.goto(f"{asgi_server.url}/alerts/rules/new/?project={project.pk}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/alerts/rules/new/"))
    label = page.locator("label[for='id_threshold']")
    page.select_option("#id_metric", "e2e_p95_ms")
    expect(label).to_have_text("Threshold (ms):")  # the unit follows the metric (alerts-rule-form.js)
    page.select_option("#id_metric", "host_cpu_percent")
    expect(label).to_have_text("Threshold (%):")
    page.fill("#id_name", "busy box")
    page.select_option("#id_aggregation", "avg")
    page.fill("#id_window_seconds", "60")
    page.fill("#id_threshold", "50")
    page.click("#rule-preview-button")
    page.wait_for_selector("#rule-preview .main-svg", state="attached")
    assert "csrfmiddlewaretoken" not in page.url and "preview" not in page.url
    assert not [u for _, u in requests if "csrfmiddlewaretoken" in u]
    assert ("POST", f"{asgi_server.url}/alerts/rules/new/?project={project.pk}") in requests
    assert not AlertRule.objects.filter(project=project, name="busy box").exists()  # a preview saves nothing
    expect(page.locator("#id_name")).to_have_value("busy box")  # the form is kept as it was


def test_live_banner_leaves_out_info_rules(page, asgi_server, make_user, project_with_key):
    user = make_user("info-user", password=PASSWORD)
    project, _ = project_with_key(members=[user])
    AlertRule.objects.filter(project=project).delete()
    for name, severity in (("just so you know", "info"), ("page me", "warning")):
        rule_create(project=project, name=name, metric="gpu_memory_percent", aggregation="last", window_seconds=60,
                    comparator="gte", threshold=85, severity=severity, host="h-" + severity)
    page.goto(f"{asgi_server.url}/traces/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/traces/$"))
    page.wait_for_function("() => window.__sockets.some((s) => s.url.endsWith('/alerts/') && s.readyState === WebSocket.OPEN)")
    banner = page.locator("#alerts-banner")
    insert_samples([sample(project.pk, timezone.now() - timedelta(seconds=1), host="h-info", mem_pct=93)])
    alerts_evaluate_round(deliver="none")
    insert_samples([sample(project.pk, timezone.now() - timedelta(seconds=1), host="h-warning", mem_pct=93)])
    alerts_evaluate_round(deliver="none")  # this push lists both firing alerts
    expect(banner).to_contain_text("1 alert firing")
    expect(banner).to_contain_text("page me")
    expect(banner).not_to_contain_text("just so you know")
