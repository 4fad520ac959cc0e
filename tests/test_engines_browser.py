"""The Engines page in a real headless Chromium, served by the in-process uvicorn server: engine
samples go in through ``POST /api/v1/engine_samples`` (the ingest the agent uses), the checks read
the values plotly drew, and a sample posted while the page is open is drawn without a reload."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.test_browser import ARTIFACTS, PASSWORD, browser  # noqa: F401  (browser: the fixture)
from tests.test_panels_browser import chart_data, log_in, non_null, only_local, page  # noqa: F401

from playwright.sync_api import expect  # noqa: E402  (after test_browser's Chromium check)

from store import get_store  # noqa: E402
from tests.test_resources_page import trace_row  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
S = 10**9
TARGET = "http://gpu-1:8000/metrics"
LABEL = f"vllm · {TARGET} · llama"


def _sample(when_ns, metric, value, le=None):
    sample = {"time": when_ns, "host": "gpu-1", "engine": "vllm", "target": TARGET, "model": "llama",
              "metric": metric, "value": value}
    if le is not None:
        sample["le"] = le
    return sample


def _ttft(when_ns, cumulative, total):
    return [_sample(when_ns, "ttft_seconds", c, le) for le, c in zip((0.1, 0.5, 1.0, "+Inf"), cumulative)] + [
        _sample(when_ns, "ttft_seconds_sum", total)]


def test_engine_charts_draw_seeded_samples_and_redraw_live(page, asgi_server, make_user, project_with_key):  # noqa: F811
    make_user("erin", password=PASSWORD)
    from django.contrib.auth import get_user_model

    erin = get_user_model().objects.get(username="erin")
    project, key = project_with_key("engines", members=[erin])

    def post(samples):
        request = urllib.request.Request(
            f"{asgi_server.url}/api/v1/engine_samples", data=json.dumps({"samples": samples}).encode(), method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        assert body["accepted"] == len(samples) and body["rejected"] == [], body

    # Two 10-second points two minutes ago: in each, the engine's first tokens (10 in (0.1, 0.5] s:
    # P95 480 ms) and two of the app's requests (TTFT 700 and 900 ms: P95 900 ms); gauges in the first.
    bucket = (time.time_ns() - 120 * S) // (10 * S) * (10 * S)
    post([*_ttft(bucket - 3 * S, [0, 0, 0, 0], 0.0), *_ttft(bucket + 5 * S, [0, 10, 10, 10], 3.0),
          *_ttft(bucket + 15 * S, [0, 20, 20, 20], 6.0),
          _sample(bucket + 2 * S, "requests_running", 6), _sample(bucket + 2 * S, "requests_waiting", 2),
          _sample(bucket + 2 * S, "kv_cache_usage", 55.0)])
    traces = []
    for n, (offset, ttft_ms) in enumerate([(2, 700), (3, 900), (12, 700), (13, 900)]):
        row = trace_row(project.pk, f"{n + 1:032x}", bucket + offset * S, 1500, version=1)
        row.update(model="llama", models=["llama"], ttft_ns=ttft_ms * 10**6)
        traces.append(row)
    get_store().insert("traces", traces, tag="tests.engines_browser")

    log_in(page, asgi_server, "erin", "/engines/?range=15m")
    kv = chart_data(page, "fig-engine-kv")
    assert [t["name"] for t in kv] == [LABEL] and non_null(kv[0]["y"]) == [55.0]
    ttft = {t["name"]: non_null(t["y"]) for t in chart_data(page, "fig-engine-ttft")}
    assert ttft[f"engine TTFT P95 · {LABEL}"] == [pytest.approx(480.0)] * 2
    # the app's percentiles come from the summaries' histograms: within 0.5 %
    assert ttft["app TTFT P95 (traces of llama)"] == [pytest.approx(900.0, rel=0.005)] * 2
    # the band's upper edge: the app-side line
    assert ttft[f"outside the engine · {LABEL}"] == ttft["app TTFT P95 (traces of llama)"]
    assert page.evaluate("""Array.from(document.getElementById('chart-fig-engine-ttft').data)
        .find((t) => t.name.startsWith('outside the engine')).fill""") == "tonexty"
    # The band is drawn: plotly filled a path with area between the two lines (its outline goes
    # along one line and back along the other: four corners at least).
    fills = page.evaluate("""Array.from(document.querySelectorAll('#chart-fig-engine-ttft path.js-fill'),
        (p) => (p.getAttribute('d') || '').split(/[ML]/).filter(Boolean).length)""")
    assert max(fills) >= 4
    requests = {t["name"]: non_null(t["y"]) for t in chart_data(page, "fig-engine-requests")}
    assert requests == {f"{LABEL} · running": [6.0], f"{LABEL} · waiting": [2.0]}
    row = page.locator("#engines-table tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(0)).to_have_text(LABEL)
    expect(row.locator("td").nth(5)).to_have_text("55.0")
    expect(row.locator("td").nth(5)).not_to_have_class("num over")
    expect(page.locator("#caption-fig-engine-e2e")).to_contain_text("time outside the engine")

    # A sample that arrives while the page is open is drawn without a reload, the table with it.
    page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
    page.evaluate("window.__notReloaded = true")
    post([_sample(time.time_ns(), "kv_cache_usage", 95.0), _sample(time.time_ns(), "requests_waiting", 9)])
    page.wait_for_function("() => Number(document.body.dataset.enginesRefreshed || 0) >= 1")
    page.wait_for_function("""() => Array.from(document.getElementById('chart-fig-engine-kv').data[0].y).includes(95)""")
    expect(row.locator("td").nth(5)).to_have_text("95.0")
    expect(row.locator("td").nth(5)).to_have_class("num over")  # at or over 90 %: flagged, as on the page
    expect(row.locator("td").nth(4)).to_have_text("9")
    assert page.evaluate("window.__notReloaded") is True
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "engines.png"), full_page=True)
    only_local(page, asgi_server)
    assert page.errors == []
