"""The load test report page in a real headless Chromium: the four plotly charts are drawn (by the
app's own plotly.js), the knee is marked, a hostile target name stays text. Screenshot in
test-artifacts/loadtest.png."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM}", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from demo.simulator import SimulatorConfig, serve  # noqa: E402
from loadtests.services import load_test_run_create, load_test_run_finish  # noqa: E402
from tests.conftest import BROWSER_TIMEOUT_MS  # noqa: E402
from tracedash_sdk.loadtest import LoadTest, RequestMix, StepPlan, Target  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu", "--no-first-run",
                 "--disable-component-update", "--disable-sync"]
PASSWORD = "correct-horse-battery-7"
XSS_TARGET = "http://x/<img src=x onerror=\"window.__xss=1\">"


def test_report_page_draws_the_charts_with_the_knee(asgi_server, make_user, project_with_key, monkeypatch):
    with serve(SimulatorConfig(queue_delay_ms=0.0, prefill_ms=52.5, prefill_ms_per_token=0.0, decode_ms_per_token=2.5,
                               capacity=4, load_slowdown=0.0, jitter=0.0)) as sim:
        report = LoadTest(target=Target(sim.base_url), plan=StepPlan(37.5, 1.5), drain_timeout=1.0,
                          mix=RequestMix.single(model="sim-gpt", max_tokens=20)).run()
    assert report["knee"] is not None
    user = make_user("lt-viewer", password=PASSWORD)
    project, _ = project_with_key(members=[user])
    run = load_test_run_create(project=project, run_id=report["run_id"], test_type="step", target_url=XSS_TARGET,
                               config={})
    load_test_run_finish(run=run, report=report)

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # playwright's sync API runs a loop in this thread
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(f"{asgi_server.url}/login/?next=/loadtests/{run.pk}/")
            page.fill("#id_username", "lt-viewer")
            page.fill("#id_password", PASSWORD)
            page.get_by_role("button", name="Log in").click()
            expect(page).to_have_url(f"{asgi_server.url}/loadtests/{run.pk}/")
            for fig in ("fig-throughput", "fig-latency", "fig-errors", "fig-timeline"):
                expect(page.locator(f'.chart[data-figure="{fig}"] .main-svg').first).to_be_visible()
            # the knee marker is drawn on the throughput chart, and named in the banner
            expect(page.locator('.chart[data-figure="fig-throughput"] .textpoint', has_text="knee")).to_have_count(1)
            expect(page.locator(".banner")).to_contain_text(f"Knee at {report['knee']['label']}")
            expect(page.locator("p.muted code").first).to_have_text(report["run_id"])
            expect(page.get_by_text(XSS_TARGET).first).to_be_visible()  # shown as text
            assert page.evaluate("window.__xss") is None
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "loadtest.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    outside = [u for u in requests if not re.match(rf"^{re.escape(asgi_server.url)}/", u) and not u.startswith("data:")]
    assert outside == []  # plotly.js and everything else from the server itself


def test_start_a_load_test_from_the_page_and_follow_it(asgi_server, make_user, project_with_key, monkeypatch,
                                                       settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the embedded path (a thread), also when the run has a broker
    """The form on /loadtests/ starts a run against the built-in simulator in the server's background;
    the run's page follows its progress and shows the report when it ends, with a link to its traces."""
    from loadtests.models import LoadTestRun
    from projects.models import ApiKey

    user = make_user("lt-starter", password=PASSWORD)
    project, _ = project_with_key(members=[user])
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(BROWSER_TIMEOUT_MS)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(f"{asgi_server.url}/login/?next=/loadtests/")
            page.fill("#id_username", "lt-starter")
            page.fill("#id_password", PASSWORD)
            page.get_by_role("button", name="Log in").click()
            expect(page).to_have_url(f"{asgi_server.url}/loadtests/")
            page.locator("#loadtest-start summary").click()
            # A bad value is refused with its reason, and starts nothing.
            page.select_option("#id_test_type", "concurrency")
            page.fill("#id_qps", "0")
            page.fill("#id_duration", "10")
            page.get_by_role("button", name="Start").click()
            expect(page.locator("#loadtest-start .errorlist")).to_contain_text("greater than or equal to 0.1")
            assert not LoadTestRun.objects.exists()
            page.fill("#id_qps", "3")
            page.check("#id_target_0")  # the built-in simulator
            page.get_by_role("button", name="Start").click()
            expect(page).to_have_url(re.compile(r"/loadtests/\d+/"))
            run = LoadTestRun.objects.get()
            assert run.config["source"] == "page" and run.target_url == "built-in simulator"
            # While it runs (10 s), the page polls its progress; when it ends, the page reloads itself
            # with the report (the only way a page rendered while it ran can show one).
            expect(page.locator(".kpis")).to_be_visible(timeout=180_000)
            paths = [urlsplit(u).path for u in requests]
            polls, loads = paths.count(f"/loadtests/{run.pk}/progress.json"), paths.count(f"/loadtests/{run.pk}/")
            # (a machine so slow that the page was first shown after the run ended shows the report at once)
            assert (polls >= 1 and loads >= 2) or loads == 1, (polls, loads)
            run.refresh_from_db()
            assert run.status == "completed" and run.report["totals"]["planned"] == 30
            expect(page.locator(".kpi .value").first).to_have_text(
                f"{run.report['totals']['ok']} / {run.report['totals']['errors']}")
            link = page.locator("#loadtest-traces")
            href = link.get_attribute("href")
            assert f"attr=loadtest.run_id%3D{run.run_id}" in href and f"project={project.pk}" in href
            assert ApiKey.objects.filter(project=project, name="load tests").count() == 1
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "loadtest-started.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
