"""The overview, costs, resources and compare pages in a real headless Chromium, served by the
in-process uvicorn server: data goes in through the ingest API, the summariser runs in the test,
and the checks read the values plotly drew (``document.getElementById(...).data``), change a
filter and see them change, and record every request so none leaves the test server."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from tests.test_browser import ARTIFACTS, CHROMIUM_ARGS, PASSWORD, TRACK_SOCKETS, browser, post_spans  # noqa: F401

from playwright.sync_api import expect  # noqa: E402  (after test_browser's Chromium check)

from analytics.rollup_services import rollups_update  # noqa: E402
from analytics.summarizer import traces_summarize  # noqa: E402
from store import get_store  # noqa: E402
from tests.conftest import BROWSER_TIMEOUT_MS, wait_until  # noqa: E402
from tests.spans import llm_trace  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
S = 10**9


@pytest.fixture
def page(browser, asgi_server):  # noqa: F811
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(BROWSER_TIMEOUT_MS)
    context.add_init_script(TRACK_SOCKETS)
    page = context.new_page()
    page.seen = []
    page.errors = []
    context.on("request", lambda request: page.seen.append(request.url))
    page.on("websocket", lambda ws: page.seen.append(ws.url))
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()
    asgi_server.wait_idle()  # before the test database is flushed


def only_local(page, server):
    foreign = sorted({u for u in page.seen if not u.startswith((server.url + "/", server.ws_url + "/"))})
    assert page.seen and foreign == [], f"pages reached outside {server.url}: {foreign}"
    assert any(u.startswith(server.url + "/static/vendor/plotly") for u in page.seen)


def log_in(page, server, username, path):
    page.goto(f"{server.url}{path}")
    expect(page).to_have_url(re.compile(r"/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{server.url}{path}")


def chart_data(page, figure_id):
    """The traces plotly drew in the chart of ``figure_id`` (name, x, y, customdata)."""
    page.wait_for_function(f"() => document.getElementById('chart-{figure_id}') && document.getElementById('chart-{figure_id}').data")
    return page.evaluate(f"""Array.from(document.getElementById('chart-{figure_id}').data, (t) =>
        ({{name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || []), customdata: Array.from(t.customdata || [])}}))""")


def shaped(*, start_ns, e2e_ms, service, model="gpt-4o-mini", cost=True):
    spans = llm_trace(service=service, model=model, start_ns=start_ns)
    spans[0]["duration_ms"] = e2e_ms
    if not cost:
        spans[3].pop("cost_usd")
    return spans


def summarised(project_id, count):
    """Wait until the writer stored the spans, then run the summariser and the rollups."""
    def ready():
        return get_store().query("SELECT uniqExact(trace_id) FROM spans WHERE project_id = {p:UInt64}",
                                 {"p": project_id}, tag="tests.panels_browser.count").scalar() >= count
    wait_until(ready, timeout=90, message="spans stored")
    # The two beat tasks, on a thread of their own as the beat runs them (this test thread has
    # playwright's event loop): summaries, then the rollups of the minutes they marked.
    def tasks():
        traces_summarize(project_ids=[project_id])
        rollups_update(project_ids=[project_id])

    worker = threading.Thread(target=tasks)
    worker.start()
    worker.join(timeout=60)


def non_null(values):
    return [v for v in values if v is not None]


def test_overview_draws_seeded_numbers_filters_and_links_to_traces(page, asgi_server, make_user, project_with_key):
    make_user("olivia", password=PASSWORD)
    from django.contrib.auth import get_user_model

    olivia = get_user_model().objects.get(username="olivia")
    project, key = project_with_key("overview", members=[olivia])
    now = time.time_ns()
    chat = [shaped(start_ns=now - (40 - i) * 60 * S, e2e_ms=1300 + 10 * i, service="chat-api") for i in range(20)]
    search = [shaped(start_ns=now - (15 - i) * 60 * S, e2e_ms=400, service="search") for i in range(5)]
    post_spans(asgi_server, key, [s for t in chat + search for s in t])
    summarised(project.pk, 25)

    log_in(page, asgi_server, "olivia", "/?range=1h")
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("25")

    # Traces summarised while the page is open redraw the tiles and charts without a reload.
    page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
    late = [shaped(start_ns=now - (10 - i) * 60 * S, e2e_ms=700, service="search") for i in range(3)]
    post_spans(asgi_server, key, [s for t in late for s in t])
    summarised(project.pk, 28)
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("28")
    assert sum(chart_data(page, "fig-histogram")[0]["y"]) == 28
    p50 = next(t for t in chart_data(page, "fig-latency") if t["name"] == "E2E P50")
    # a bucket's percentile is its histogram bucket's value: within 0.5 % of the exact one
    assert any(v == pytest.approx(400, rel=0.005) for v in non_null(p50["y"]))
    assert max(non_null(p50["y"])) == pytest.approx(1490, rel=0.005)
    breakdown = {t["name"]: t for t in chart_data(page, "fig-breakdown")}
    # chat: the model call's 900 ms; search: its 400 (700) ms root clips the call to 200 (500) ms
    assert set(non_null(breakdown["inference"]["y"])) == {900.0, 200.0, 500.0}
    hist = chart_data(page, "fig-histogram")[0]
    assert sum(hist["y"]) == 28
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "overview.png"), full_page=True)

    page.select_option('.filter-bar select[name="service"]', "search")
    page.locator(".filter-bar").get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"service=search"))
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("8")
    p50 = next(t for t in chart_data(page, "fig-latency") if t["name"] == "E2E P50")
    assert sorted(set(non_null(p50["y"]))) == [pytest.approx(400, rel=0.005), pytest.approx(700, rel=0.005)]

    # A point's customdata is the explorer URL of its bucket, with the page's filters.
    link = next(c for c, y in zip(p50["customdata"], p50["y"]) if y is not None)
    assert link.startswith("/traces/?") and "service=search" in link and "from=" in link and "to=" in link

    # Clicking a histogram bar opens the explorer on the traces of that latency band.
    hist = chart_data(page, "fig-histogram")[0]
    band = hist["x"].index("200–500 ms")
    assert hist["y"][band] == 5
    page.locator("#chart-fig-histogram").scroll_into_view_if_needed()
    box = page.evaluate(f"""(() => {{
        const bar = document.querySelectorAll('#chart-fig-histogram .bars .point')[{band}].getBoundingClientRect();
        return {{x: bar.x + bar.width / 2, y: bar.y + bar.height / 2}};
    }})()""")
    page.mouse.move(box["x"], box["y"])  # plotly picks the point under the pointer, then the click opens it
    page.mouse.click(box["x"], box["y"])
    expect(page).to_have_url(re.compile(r"/traces/\?.*min_ms=200&max_ms=500"))
    assert "service=search" in page.url
    expect(page.locator("tr[data-trace-id]")).to_have_count(5)
    only_local(page, asgi_server)
    assert page.errors == []


def test_overview_live_redraw_moves_the_tile_links_with_the_values(page, asgi_server, make_user, project_with_key):
    """After a live redraw the P99 tile's link asks the explorer for the traces at or above the new
    P99, not the page-load one (overview.json carries each tile's link; overview-live.js sets it)."""
    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])
    now = time.time_ns()
    post_spans(asgi_server, key, [s for i in range(5) for s in shaped(start_ns=now - (20 - i) * 60 * S, e2e_ms=400, service="chat-api")])
    summarised(project.pk, 5)
    log_in(page, asgi_server, user.username, "/?range=1h")
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("5")
    p99_link = page.locator('[data-kpi="e2e_p99"] a.kpi-traces')
    before = parse_qs(urlparse(p99_link.get_attribute("href")).query)
    assert float(before["min_ms"][0]) < 400 and before["range"] == ["1h"]

    page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
    post_spans(asgi_server, key, [s for i in range(3) for s in shaped(start_ns=now - (10 - i) * 60 * S, e2e_ms=3000, service="chat-api")])
    summarised(project.pk, 8)
    expect(page.locator('[data-kpi="requests"] .value')).to_have_text("8")
    # (the same redraw wrote the tile values and the links)
    after = parse_qs(urlparse(p99_link.get_attribute("href")).query)
    assert 2900 < float(after["min_ms"][0]) < 3000 and after["sort"] == ["duration"] and after["range"] == ["1h"]
    p99_link.click()
    expect(page).to_have_url(re.compile(r"/traces/\?.*min_ms="))
    expect(page.locator("tr[data-trace-id]")).to_have_count(3)  # the three slow ones, not all eight
    assert page.errors == []


def test_resources_charts_show_samples_and_redraw_live(page, asgi_server, make_user, project_with_key):
    make_user("rita", password=PASSWORD)
    from django.contrib.auth import get_user_model

    rita = get_user_model().objects.get(username="rita")
    project, key = project_with_key("resources", members=[rita])
    now = time.time_ns()

    def post_samples(samples):
        request = urllib.request.Request(
            f"{asgi_server.url}/api/v1/resources", data=json.dumps({"samples": samples}).encode(), method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["accepted"] == len(samples)

    post_samples([
        {"time": now - 120 * S, "host": "gpu-node-1", "gpu_index": -1, "cpu_percent": 42.0,
         "memory_used": 8 * 2**30, "memory_total": 16 * 2**30},
        {"time": now - 120 * S, "host": "gpu-node-1", "gpu_index": 0, "gpu_name": "H100", "gpu_utilization": 77.0,
         "gpu_memory_used": 60 * 2**30, "gpu_memory_total": 80 * 2**30, "gpu_temperature": 61.0,
         "gpu_power_watts": 350.0, "processes": [{"pid": 4242, "name": "vllm", "gpu_memory": 50 * 2**30}]},
        {"time": now - 120 * S, "host": "gpu-node-2", "gpu_index": -1, "cpu_percent": 12.0},
    ])
    log_in(page, asgi_server, "rita", "/resources/?range=15m")
    mem = chart_data(page, "fig-gpu-mem")
    assert [t["name"] for t in mem] == ["gpu-node-1 · GPU 0"] and non_null(mem[0]["y"]) == [75.0]
    assert page.evaluate("document.getElementById('chart-fig-gpu-mem').layout.shapes[0].y0") == 85
    cpu = {t["name"]: non_null(t["y"]) for t in chart_data(page, "fig-host-cpu")}
    assert cpu == {"gpu-node-1": [42.0], "gpu-node-2": [12.0]}
    procs = chart_data(page, "fig-gpu-proc")
    assert procs[0]["name"] == "gpu-node-1 · GPU 0 · vllm (4242)" and non_null(procs[0]["y"]) == [51200.0]

    # A sample that arrives while the page is open is drawn without a reload.
    page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
    post_samples([{"time": time.time_ns(), "host": "gpu-node-1", "gpu_index": 0, "gpu_utilization": 91.0,
                   "gpu_memory_used": 72 * 2**30, "gpu_memory_total": 80 * 2**30}])
    page.wait_for_function("""() => Array.from(document.getElementById('chart-fig-gpu-mem').data[0].y).includes(90)""")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "resources.png"), full_page=True)

    page.select_option("#host-select", "gpu-node-2")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"host=gpu-node-2"))
    cpu = {t["name"]: non_null(t["y"]) for t in chart_data(page, "fig-host-cpu")}
    assert cpu == {"gpu-node-2": [12.0]}
    # A host without a GPU: one card with the agent command instead of empty GPU charts.
    expect(page.locator("#no-gpu")).to_contain_text("No GPU of gpu-node-2 has reported")
    assert page.locator("#chart-fig-gpu-mem").count() == 0
    only_local(page, asgi_server)
    assert page.errors == []


def test_costs_spend_per_model_and_price_editor(page, asgi_server, make_user, project_with_key):
    make_user("carl", password=PASSWORD)
    from django.contrib.auth import get_user_model

    carl = get_user_model().objects.get(username="carl")
    project, key = project_with_key("costs", members=[carl])
    now = time.time_ns()
    priced = [shaped(start_ns=now - (30 - i) * 60 * S, e2e_ms=1200, service="chat", model="gpt-4o-mini")
              for i in range(4)]
    post_spans(asgi_server, key, [s for t in priced for s in t])
    summarised(project.pk, 4)

    log_in(page, asgi_server, "carl", "/costs/?range=1h")
    spend = {t["name"]: sum(non_null(t["y"])) for t in chart_data(page, "fig-spend")}
    assert spend == {"gpt-4o-mini": pytest.approx(4 * 0.00042)}
    expect(page.locator('[data-kpi="cost_per_request"] .value')).to_have_text("$0.00042")  # one money format

    # The price editor: an invalid price is refused with the field named; a valid one is saved.
    page.fill('#price-form input[name="model"]', "llama-3-70b")
    page.fill('#price-form input[name="input_usd_per_million"]', "-3")
    page.fill('#price-form input[name="output_usd_per_million"]', "4")
    page.get_by_role("button", name="Save price").click()
    expect(page.locator("#price-errors")).to_contain_text("input_usd_per_million")
    page.fill('#price-form input[name="input_usd_per_million"]', "3")
    page.get_by_role("button", name="Save price").click()
    expect(page.locator('tr[data-model="llama-3-70b"]')).to_be_visible()

    # Spans with tokens and no cost are now priced from the table (estimated) and drawn per model.
    unpriced = [shaped(start_ns=now - (20 - i) * 60 * S, e2e_ms=900, service="chat", model="llama-3-70b", cost=False)
                for i in range(2)]
    post_spans(asgi_server, key, [s for t in unpriced for s in t])
    summarised(project.pk, 6)
    page.goto(f"{asgi_server.url}/costs/?range=1h")
    spend = {t["name"]: sum(non_null(t["y"])) for t in chart_data(page, "fig-spend")}
    estimated = 2 * (812 * 3 + 164 * 4) / 1e6
    assert spend == {"gpt-4o-mini": pytest.approx(4 * 0.00042), "llama-3-70b": pytest.approx(estimated)}
    expect(page.locator("#estimated-note")).to_contain_text("2 of 6 requests")

    page.select_option('.filter-bar select[name="model"]', "llama-3-70b")
    page.locator(".filter-bar").get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"model=llama-3-70b"))
    spend = {t["name"]: sum(non_null(t["y"])) for t in chart_data(page, "fig-spend")}
    assert spend == {"llama-3-70b": pytest.approx(estimated)}
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "costs.png"), full_page=True)
    only_local(page, asgi_server)
    assert page.errors == []


def test_compare_two_models_side_by_side(page, asgi_server, make_user, project_with_key):
    make_user("cora", password=PASSWORD)
    from django.contrib.auth import get_user_model

    cora = get_user_model().objects.get(username="cora")
    project, key = project_with_key("compare", members=[cora])
    now = time.time_ns()
    big = '<img src=x onerror="window.__xss=1">big'  # a hostile model name is shown as text everywhere
    slow = [shaped(start_ns=now - (30 - i) * 60 * S, e2e_ms=2000, service="chat", model=big) for i in range(5)]
    fast = [shaped(start_ns=now - (30 - i) * 60 * S, e2e_ms=1500, service="chat", model="small") for i in range(5)]
    post_spans(asgi_server, key, [s for t in slow + fast for s in t])
    summarised(project.pk, 10)

    log_in(page, asgi_server, "cora", "/compare/?" + urlencode({"mode": "models", "range": "6h", "a_model": big,
                                                                 "b_model": "small"}))
    expect(page.locator("#compare-table thead th").nth(1)).to_have_text(f"A: model {big}")
    # Served from the rollups: each percentile within 0.5 % of the exact one (2000 and 1500 ms).
    row = page.locator('tr[data-metric="E2E P95"]')
    expect(row.locator("td").nth(3)).to_have_class(re.compile("better"))
    change = float(row.locator("td").nth(3).inner_text().replace("%", "").strip())
    assert change == pytest.approx(-25.0, abs=0.5)
    bars = {t["name"][:1]: t for t in chart_data(page, "fig-compare")}
    i = bars["A"]["x"].index("E2E P95")
    assert bars["A"]["y"][i] == pytest.approx(2000, rel=0.005) and bars["B"]["y"][i] == pytest.approx(1500, rel=0.005)

    page.select_option("#b-model", big)
    page.get_by_role("button", name="Compare").click()
    expect(row.locator("td").nth(3)).to_have_text("0.0 %")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    assert page.evaluate("window.__xss") is None
    assert page.locator("#compare-table img, #chart-fig-compare img").count() == 0
    only_local(page, asgi_server)
    assert page.errors == []
