"""The trace page in a real headless Chromium (served by uvicorn in this process, see
tests/test_browser.py): waterfall, collapse/expand, selection, deep links, find, keyboard,
minimap zoom, hostile span data and GenAI events (``/v1/logs``) shown as text, and a 10,000-span
trace (time to interactive, virtualised rows, scrolling without blank areas). Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
from playwright.sync_api import expect

from tests.spans import llm_trace, span_id, trace_id
from tests.test_browser import ARTIFACTS, PASSWORD, browser, page  # noqa: F401  (fixtures)
from tests.trace_seed import big_trace, seed

pytestmark = [pytest.mark.browser, pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]
MS = 1_000_000


def log_in(page, server, username):
    page.goto(f"{server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/login/" not in url)


def open_trace(page, server, tid, query=""):
    page.goto(f"{server.url}/traces/{tid}/{query}")
    page.wait_for_function("() => document.getElementById('waterfall').dataset.ready === '1'")


def visible_names(page):
    return page.eval_on_selector_all(
        ".wf-row:not([hidden])",
        "rows => rows.map(r => [parseFloat(r.style.transform.slice(11)), r.querySelector('.wf-name').textContent])"
        ".sort((a, b) => a[0] - b[0]).map(x => x[1])")


def agent_trace():
    """root → plan (preprocess) → [tool call (network) → search (network)], llm (inference), answer."""
    tid, ids = trace_id(), {k: span_id() for k in ("root", "plan", "tool", "search", "llm", "answer")}
    start = time.time_ns() - 30_000_000_000

    def sp(key, parent, name, phase, at, dur, **extra):
        return {"trace_id": tid, "span_id": ids[key], "parent_span_id": ids[parent] if parent else None, "name": name,
                "phase": phase, "service": "agent", "start_time": start + at * MS, "duration_ms": dur, **extra}

    return ids, [
        sp("root", None, "agent.run", "other", 0, 1000),
        sp("plan", "root", "plan", "preprocess", 0, 300),
        sp("tool", "plan", "tool call", "network", 50, 200),
        sp("search", "tool", "search backend", "network", 60, 150, attributes={"db.statement": "select 1"}),
        sp("llm", "root", "llm.chat", "inference", 300, 600, model="gpt-4o", ttft_ms=120, input_tokens=50,
           output_tokens=40, cost_usd=0.00042, attributes={"gen_ai.prompt.0.content": "What is 2+2?",
                                         "gen_ai.completion.0.content": "4", "temperature": "0.2"},
           events=[{"name": "first_token", "time": start + 420 * MS}]),
        sp("answer", "root", "answer", "postprocess", 900, 100, status="error", status_message="formatter crashed"),
    ]


def test_waterfall_collapse_select_deep_link_and_zoom(page, asgi_server, make_user, project_with_key):
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    ids, spans = agent_trace()
    tid = seed(spans, project_id=project.pk)
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, tid)

    expect(page.locator("#fig-e2e")).to_have_text("1000.0 ms")
    expect(page.locator("#fig-ttft")).to_have_text("120.0 ms")
    expect(page.locator("#fig-tokens")).to_have_text("50 / 40")
    expect(page.locator("#fig-cost")).to_have_text("$0.00042")  # the one money format (panel_tags money)
    expect(page.locator("#phase-numbers li[data-phase=inference]")).to_contain_text("600.0 ms")
    expect(page.locator("#phase-numbers li[data-phase=inference]")).to_contain_text("60.0 %")
    # the root succeeded although its "answer" span failed: a recovered request, not an error one
    expect(page.locator("#trace-recovered")).to_contain_text("formatter crashed")
    expect(page.locator("#trace-error")).to_have_count(0)
    assert visible_names(page) == ["agent.run", "plan", "tool call", "search backend", "llm.chat", "answer"]
    # errors, critical path and TTFT are drawn
    assert "is-error" in page.get_attribute(f'.wf-row[data-span-id="{ids["answer"]}"]', "class")
    assert "is-critical" in page.get_attribute(f'.wf-row[data-span-id="{ids["llm"]}"]', "class")
    assert page.locator(f'.wf-row[data-span-id="{ids["llm"]}"] .wf-ttft').is_visible()
    expect(page.locator(f'.wf-row[data-span-id="{ids["plan"]}"] .wf-dur')).to_have_text("300.0 ms · self 100.0 ms")

    # collapse / expand one span, then all
    page.click(f'.wf-row[data-span-id="{ids["plan"]}"] .wf-toggle')
    assert visible_names(page) == ["agent.run", "plan", "llm.chat", "answer"]
    expect(page.locator(f'.wf-row[data-span-id="{ids["plan"]}"] .hidden-count')).to_have_text("+2")
    page.click(f'.wf-row[data-span-id="{ids["plan"]}"] .wf-toggle')
    assert len(visible_names(page)) == 6
    page.click("#wf-collapse-all")
    assert visible_names(page) == ["agent.run", "plan", "llm.chat", "answer"]
    page.click("#wf-expand-all")
    assert len(visible_names(page)) == 6

    # select a span: the detail pane shows it, prompts included, and the URL links to it
    page.click(f'.wf-row[data-span-id="{ids["llm"]}"]')
    detail = page.locator("#wf-detail-body")
    expect(detail.locator(".wf-detail-name")).to_have_text("llm.chat")
    expect(detail.locator("table.facts")).to_contain_text("$0.00042")  # format.js money, as the page header
    expect(detail.locator(".wf-prompt-text").first).to_have_text("4")  # completion sorts before prompt
    expect(detail.locator(".wf-prompt-text").nth(1)).to_have_text("What is 2+2?")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=asgi_server.url)
    copy = detail.locator(".wf-prompt").nth(1).locator("button.wf-copy")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "What is 2+2?"
    detail.locator(".wf-prompt").nth(1).locator("summary").click(position={"x": 5, "y": 5})  # collapsible
    expect(detail.locator(".wf-prompt-text").nth(1)).to_be_hidden()
    expect(detail.locator("table.attributes")).to_contain_text("temperature")
    expect(detail.locator(".wf-events")).to_contain_text("first_token")
    expect(detail.locator(".wf-events")).to_contain_text("+120.0 ms into the span")
    link = page.input_value("#wf-span-link")
    assert link.endswith(f"span={ids['llm']}") and f"project={project.pk}" in link
    assert page.url == link
    page.click("#wf-copy-link")
    assert page.evaluate("navigator.clipboard.readText()") == link
    page.click(f'.wf-row[data-span-id="{ids["answer"]}"]')
    expect(detail.locator(".wf-status-message")).to_have_text("Status message: formatter crashed")

    # drag on the minimap zooms into a time range; reset returns to the whole trace
    # (in view first: the scores section below the waterfall makes the page long enough to have
    # scrolled the minimap out of it while rows were clicked)
    page.locator("#wf-minimap").scroll_into_view_if_needed()
    box = page.locator("#wf-minimap").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 10)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 20, steps=5)
    page.mouse.up()
    expect(page.locator("#wf-reset-zoom")).to_be_enabled()
    waterfall = page.locator("#waterfall")
    expect(waterfall).to_have_attribute("data-view-start-ms", re.compile(r"^(29[5-9]|30[0-5])\."))  # 30 % … 60 % of 1 s
    expect(waterfall).to_have_attribute("data-view-end-ms", re.compile(r"^(59[5-9]|60[0-5])\."))
    expect(page.locator(".wf-tick").first).to_have_text(re.compile(r"^(300|325|350|400) ms$"))
    # a bar that starts before the window is cut at the window's edge, never drawn over the labels
    root_bar = page.locator(f'.wf-row[data-span-id="{ids["root"]}"] .wf-bar').bounding_box()
    track = page.locator(f'.wf-row[data-span-id="{ids["root"]}"] .wf-track').bounding_box()
    dur = page.locator(f'.wf-row[data-span-id="{ids["root"]}"] .wf-dur').bounding_box()
    assert page.evaluate("""([x, y]) => document.elementFromPoint(x, y).classList.contains('wf-dur')""",
                         [dur["x"] + dur["width"] / 2, dur["y"] + dur["height"] / 2])
    assert root_bar["x"] < track["x"]  # starts left of the window …
    answer_bar = page.locator(f'.wf-row[data-span-id="{ids["answer"]}"] .wf-bar')
    expect(answer_bar).to_be_hidden()  # 900 … 1000 ms lies outside the window
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "trace-zoomed.png"), full_page=True)
    page.click("#wf-reset-zoom")
    expect(waterfall).to_have_attribute("data-view-start-ms", "0.000")
    expect(page.locator(".wf-tick").first).to_have_text("0 ms")
    expect(answer_bar).to_be_visible()
    page.dblclick(f'.wf-row[data-span-id="{ids["llm"]}"] .wf-track')  # zoom to a span: 300 … 900 ms, padded 5 %
    expect(waterfall).to_have_attribute("data-view-start-ms", "270.000")
    expect(waterfall).to_have_attribute("data-view-end-ms", "930.000")
    page.click("#wf-reset-zoom")

    # the deep link opens with the span selected and scrolled to, parents expanded
    open_trace(page, asgi_server, tid, f"?span={ids['search']}&project={project.pk}")
    expect(page.locator(".wf-row.selected")).to_have_attribute("data-span-id", ids["search"])
    expect(detail.locator(".wf-detail-name")).to_have_text("search backend")
    expect(detail.locator("table.attributes")).to_contain_text("select 1")
    expect(detail.locator("table.facts")).to_contain_text("150.0 ms of its own time")
    page.screenshot(path=str(ARTIFACTS / "trace-page.png"), full_page=True)
    page.click("#wf-collapse-all")  # the selection moves to the outermost folded ancestor
    expect(page.locator(".wf-row.selected")).to_have_attribute("data-span-id", ids["plan"])
    expect(detail.locator(".wf-detail-name")).to_have_text("plan")
    assert page.watch.page_errors == [] and page.watch.dialogs == []


def test_find_next_previous_and_keyboard_navigation(page, asgi_server, make_user, project_with_key):
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    ids, spans = agent_trace()
    tid = seed(spans, project_id=project.pk)
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, tid)
    name = page.locator("#wf-detail-body .wf-detail-name")
    page.keyboard.press("ArrowDown")  # nothing focused yet: the arrows still drive the waterfall
    expect(name).to_have_text("agent.run")
    expect(page.locator("#wf-list")).to_be_focused()

    page.click("#wf-collapse-all")  # find opens collapsed parents
    page.keyboard.press("/")
    expect(page.locator("#wf-find")).to_be_focused()
    page.keyboard.type("search")
    page.keyboard.press("Enter")
    expect(name).to_have_text("search backend")
    expect(page.locator("#wf-find-count")).to_have_text("1 / 1")

    page.fill("#wf-find", "a")  # agent.run, plan, tool call, search backend, llm.chat, answer … all have an "a"
    page.click("#wf-find-next")
    expect(name).to_have_text("agent.run")
    page.click("#wf-find-next")
    expect(name).to_have_text("plan")
    page.click("#wf-find-prev")
    expect(name).to_have_text("agent.run")
    page.click("#wf-find-prev")  # wraps around to the last match
    expect(name).to_have_text("answer")
    page.fill("#wf-find", "gpt-4o")  # the model
    page.keyboard.press("Enter")
    expect(name).to_have_text("llm.chat")
    assert page.locator(".wf-row.match").count() == 1

    # keyboard: arrows move, left collapses then goes to the parent, right expands, Enter toggles
    page.click(f'.wf-row[data-span-id="{ids["root"]}"]')
    expect(page.locator("#wf-list")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(name).to_have_text("plan")
    page.keyboard.press("ArrowRight")  # expanded already → first child
    expect(name).to_have_text("tool call")
    page.keyboard.press("ArrowLeft")  # tool call has a child and is open → collapses
    assert "search backend" not in visible_names(page)
    page.keyboard.press("ArrowLeft")  # collapsed → its parent
    expect(name).to_have_text("plan")
    page.keyboard.press("Enter")  # collapse plan
    assert visible_names(page) == ["agent.run", "plan", "llm.chat", "answer"]
    page.keyboard.press("ArrowDown")
    expect(name).to_have_text("llm.chat")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowRight")  # expand plan again
    assert "tool call" in visible_names(page)
    page.keyboard.press("End")
    expect(name).to_have_text("answer")
    assert page.watch.page_errors == []


HOSTILE = [
    "<script>window.__xss=1</script>",
    '"><img src=x onerror="window.__xss=2">',
    "<svg onload=window.__xss=3>",
    "javascript:window.__xss=4",
    "</script><script>window.__xss=5</script>",
]


def test_hostile_span_data_is_shown_as_text_and_never_runs(page, asgi_server, make_user, project_with_key):
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    tid, root = trace_id(), span_id()
    start = time.time_ns() - 30_000_000_000
    spans = [{"trace_id": tid, "span_id": root, "parent_span_id": None, "name": HOSTILE[0], "phase": "other",
              "service": HOSTILE[1], "start_time": start, "duration_ms": 100, "status": "error",
              "status_message": HOSTILE[4], "attributes": {HOSTILE[2]: HOSTILE[1]}}]
    for k, text in enumerate(HOSTILE):
        spans.append({"trace_id": tid, "span_id": span_id(), "parent_span_id": root, "name": text, "phase": "inference",
                      "service": HOSTILE[(k + 1) % 5], "model": HOSTILE[(k + 2) % 5], "start_time": start + k * MS,
                      "duration_ms": 10, "status": "error", "status_message": text,
                      "attributes": {"gen_ai.prompt": text, "gen_ai.completion": HOSTILE[(k + 3) % 5], text: text},
                      "resource_attributes": {"host.name": text},
                      "events": [{"name": text, "time": start + k * MS, "attributes": {text: text}}]})
    seed(spans, project_id=project.pk)
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, tid)

    expect(page.locator("h1 .root-name")).to_have_text(HOSTILE[0])
    expect(page.locator("#fig-service")).to_have_text(HOSTILE[1])
    assert page.inner_text("#trace-error") in {"Error: " + text for text in HOSTILE}  # the first error's message
    for k, text in enumerate(HOSTILE):
        row = page.locator(f'.wf-row[data-span-id="{spans[k + 1]["span_id"]}"] .wf-name')
        expect(row).to_have_text(text)
        row.click()
        detail = page.locator("#wf-detail-body")
        expect(detail.locator(".wf-detail-name")).to_have_text(text)
        expect(detail.locator(".wf-status-message")).to_have_text("Status message: " + text)
        expect(detail.locator(".wf-prompt-text").nth(1)).to_have_text(text)  # gen_ai.prompt
        expect(detail.locator(".wf-events li strong")).to_have_text(text)
    page.fill("#wf-find", "onerror")
    page.keyboard.press("Enter")
    page.wait_for_timeout(200)
    assert page.evaluate("window.__xss") is None
    assert page.locator("#waterfall img, #waterfall svg, #waterfall script, .trace-head img, .trace-head script").count() == 0
    assert page.watch.dialogs == [] and page.watch.page_errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "trace-hostile.png"), full_page=True)


def test_genai_events_from_otlp_logs_are_shown_on_their_span_as_text(page, asgi_server, make_user, project_with_key):
    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])
    spans = llm_trace()
    tid = seed(spans, project_id=project.pk)
    inference = next(s for s in spans if s["name"] == "inference")

    def record(at, span, name, body):
        return {"timeUnixNano": str(at), "traceId": tid, "spanId": span, "eventName": name,
                "attributes": [{"key": "gen_ai.system", "value": {"stringValue": HOSTILE[2]}}],
                "body": {"kvlistValue": {"values": [{"key": "content", "value": {"stringValue": body}}]}}}

    records = [record(inference["start_time"] + 7 * MS, inference["span_id"], "gen_ai.user.message", HOSTILE[0]),
               record(inference["start_time"] + 9 * MS, "00000000000000ff", "gen_ai.choice", HOSTILE[1])]
    request = urllib.request.Request(f"{asgi_server.url}/v1/logs", method="POST", data=json.dumps(
        {"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status == 200 and json.loads(answer.read()) == {}
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, tid)

    page.locator(f'.wf-row[data-span-id="{inference["span_id"]}"] .wf-name').click()
    events = page.locator("#wf-detail-body .wf-genai-events li")
    expect(events).to_have_count(1)
    expect(events.locator("strong")).to_have_text("gen_ai.user.message")
    expect(events.locator(".muted")).to_have_text(" +7.0 ms into the span")
    assert json.loads(events.locator("pre").inner_text()) == {"content": HOSTILE[0]}
    expect(events.locator("td")).to_have_text(HOSTILE[2])
    # The event whose span has not arrived is listed for the trace, as text.
    trace_level = page.locator("#trace-genai-events li")
    expect(trace_level).to_have_count(1)
    assert json.loads(trace_level.locator("pre").inner_text()) == {"content": HOSTILE[1]}
    assert page.evaluate("window.__xss") is None
    assert page.locator("#wf-detail-body img, #wf-detail-body svg, #wf-detail-body script, #trace-genai-events img").count() == 0
    assert page.watch.dialogs == [] and page.watch.page_errors == []


def test_ten_thousand_span_trace_is_interactive_fast_and_scrolls_without_blanks(page, asgi_server, make_user, project_with_key):
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    spans = big_trace(10_000)
    tid = seed(spans, project_id=project.pk)
    log_in(page, asgi_server, user.username)

    started = time.perf_counter()
    open_trace(page, asgi_server, tid)
    wall_ms = (time.perf_counter() - started) * 1000
    ready_ms = page.evaluate("window.__waterfallReady")  # ms since navigation start, in the page's clock
    timing = page.evaluate("(() => { const t = performance.getEntriesByType('navigation')[0];"
                           " return {ttfb: t.responseStart, loaded: t.responseEnd, dom: t.domContentLoadedEventEnd}; })()")
    print(f"\n10,000-span trace page: interactive {ready_ms:.0f} ms after navigation start "
          f"(server answered in {timing['ttfb']:.0f} ms, HTML received {timing['loaded']:.0f} ms, "
          f"DOMContentLoaded {timing['dom']:.0f} ms; wall clock from goto {wall_ms:.0f} ms)")
    assert ready_ms < 8000, f"time to interactive {ready_ms:.0f} ms"  # generous: shared 2-core machine; target < 2 s

    rows = page.locator(".wf-row")
    assert rows.count() < 200, rows.count()  # virtualised: a pool of rows, not 10,000
    expect(page.locator("#fig-spans")).to_have_text("10000")

    def check_rows_fill_the_view():
        page.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")  # redrawn
        state = page.evaluate("""(() => {
            const list = document.getElementById('wf-list');
            const ruler = document.getElementById('wf-ruler').offsetHeight;
            const tops = [...document.querySelectorAll('.wf-row:not([hidden])')]
                .map(r => parseFloat(r.style.transform.slice(11))).sort((a, b) => a - b);
            return {top: list.scrollTop, height: list.clientHeight - ruler, tops,
                    total: document.getElementById('wf-canvas').offsetHeight};
        })()""")
        top, bottom = state["top"], min(state["top"] + state["height"], state["total"])
        covered = [t for t in state["tops"] if t + 24 > top and t < bottom]
        assert covered, state
        assert covered[0] <= top and covered[-1] + 24 >= bottom, (top, bottom, covered[:3], covered[-3:])
        gaps = [b - a for a, b in zip(covered, covered[1:])]
        assert all(g == 24 for g in gaps), "a blank row in view"

    check_rows_fill_the_view()
    page.evaluate("document.getElementById('wf-list').scrollTop = document.getElementById('wf-canvas').offsetHeight / 2")
    check_rows_fill_the_view()
    page.screenshot(path=str(ARTIFACTS / "trace-10k-middle.png"))
    page.evaluate("document.getElementById('wf-list').scrollTop = 1e9")
    check_rows_fill_the_view()
    expect(page.locator(f'.wf-row[data-span-id="{spans[-1]["span_id"]}"]')).to_be_visible()
    # a fast fling through the list: rows are re-filled at each stop
    for fraction in (0.1, 0.9, 0.33, 0.66):
        page.evaluate(f"document.getElementById('wf-list').scrollTop = document.getElementById('wf-canvas').offsetHeight * {fraction}")
        check_rows_fill_the_view()
    assert page.locator(".wf-row").count() < 200
    page.keyboard.press("/")
    page.keyboard.type("step 5001")
    page.keyboard.press("Enter")
    expect(page.locator("#wf-detail-body .wf-detail-name")).to_have_text("step 5001")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "trace-10k.png"))
    assert page.watch.page_errors == []


def test_compare_with_another_trace_and_with_the_endpoint_p50(page, asgi_server, make_user, project_with_key):
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    fast, slow = llm_trace(name="chat"), llm_trace(name="chat")
    slow[0]["duration_ms"], slow[3]["duration_ms"] = 2100, 1800  # inference 900 → 1800 ms
    slow[3]["cost_usd"] = 0.00054  # $0.00042 → $0.00054
    a, b = seed(fast, project_id=project.pk), seed(slow, project_id=project.pk)
    seed(llm_trace(name="chat"), project_id=project.pk)
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, b)

    page.click("#compare-p50")
    table = page.locator("#compare-table")
    expect(page.locator("#col-a")).to_contain_text("P50 of chat-api · chat (last 24 h, 3 traces)")
    expect(page.locator("#col-b")).to_contain_text(f"Trace {b}")
    expect(table.locator("tr[data-figure=inference_ns] td.a")).to_have_text("900.0 ms")
    expect(table.locator("tr[data-figure=inference_ns] td.b")).to_have_text("1800.0 ms")
    expect(table.locator("tr[data-figure=inference_ns] td.pct")).to_have_text("+100.0 %")
    page.screenshot(path=str(ARTIFACTS / "trace-compare-p50.png"), full_page=True)

    open_trace(page, asgi_server, a)
    recent = page.locator("#compare-recent")
    recent.locator("summary").click()
    expect(recent.locator("tr")).to_have_count(2)  # the endpoint's other traces, not this one
    expect(recent.locator(f'tr[data-trace-id="{b}"]')).to_contain_text("2100.0 ms")
    page.fill(".compare-with input[name=b]", b)
    page.get_by_role("button", name="Compare").click()
    expect(table.locator("tr[data-figure=e2e_ns] td.diff")).to_have_text("+900.0 ms")
    expect(table.locator("tr[data-figure=inference_ns] td.pct")).to_have_text("+100.0 %")
    expect(table.locator("tr[data-figure=network_ns] td.diff")).to_have_text("0.0 ms")
    expect(table.locator("tr[data-figure=cost_usd] td.a")).to_have_text("$0.00042")  # the one money format
    expect(table.locator("tr[data-figure=cost_usd] td.diff")).to_have_text("+$0.00012")
    page.locator("#col-b a").click()  # back to trace B's page
    page.wait_for_function("() => document.getElementById('waterfall').dataset.ready === '1'")
    expect(page.locator("#trace-id")).to_have_text(b)
    page.screenshot(path=str(ARTIFACTS / "trace-compare.png"), full_page=True)
    assert page.watch.page_errors == []


def test_spans_arriving_for_the_open_trace_are_announced(page, asgi_server, make_user, project_with_key):
    from tests.test_browser import post_spans

    user = make_user(password=PASSWORD)
    project, key = project_with_key(members=[user])
    spans = llm_trace()
    post_spans(asgi_server, key, spans[:3])  # the rest of the request is still running
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, spans[0]["trace_id"], f"?span={spans[1]['span_id']}")
    assert len(visible_names(page)) == 3
    page.wait_for_function("() => window.__sockets.some((s) => s.readyState === WebSocket.OPEN)")
    page.evaluate("""window.__sockets.forEach((s) => s.addEventListener('message', (m) => {
        if (JSON.parse(m.data).type === 'traces.ingested') window.__ingested = (window.__ingested || 0) + 1; }))""")
    post_spans(asgi_server, key, llm_trace())  # another trace: no announcement
    page.wait_for_function("() => window.__ingested >= 1")
    expect(page.locator("#trace-live")).to_be_hidden()
    post_spans(asgi_server, key, spans[3:])
    expect(page.locator("#trace-live")).to_be_visible()
    page.click("#trace-live-reload")
    page.wait_for_function("() => document.getElementById('waterfall').dataset.ready === '1'")
    assert len(visible_names(page)) == 5
    expect(page.locator(".wf-row.selected")).to_have_attribute("data-span-id", spans[1]["span_id"])
    expect(page.locator("#trace-live")).to_be_hidden()


def test_a_span_without_a_phase_beneath_a_model_call_shows_as_inference(page, asgi_server, make_user,
                                                                         project_with_key):
    """The HTTP request beneath a model call (sent without a phase, as auto-instrumentation does) is
    drawn and counted as the call's inference time, and its detail says what it was sent as; a model
    call that reports no first-token time shows TTFT as unknown, not blank."""
    user = make_user(password=PASSWORD)
    project, _ = project_with_key(members=[user])
    tid, ids = trace_id(), {k: span_id() for k in ("root", "llm", "http")}
    start = time.time_ns() - 30_000_000_000
    spans = [
        {"trace_id": tid, "span_id": ids["root"], "name": "POST /chat", "phase": "other", "service": "api",
         "start_time": start, "duration_ms": 400},
        {"trace_id": tid, "span_id": ids["llm"], "parent_span_id": ids["root"], "name": "llm.chat",
         "phase": "inference", "model": "gpt-4o", "service": "api", "start_time": start + 50 * MS, "duration_ms": 300},
        {"trace_id": tid, "span_id": ids["http"], "parent_span_id": ids["llm"], "name": "POST /v1/chat/completions",
         "service": "api", "start_time": start + 60 * MS, "duration_ms": 250},
    ]
    seed(spans, project_id=project.pk)
    log_in(page, asgi_server, user.username)
    open_trace(page, asgi_server, tid)
    expect(page.locator("#phase-numbers li[data-phase=inference]")).to_contain_text("300.0 ms")
    expect(page.locator("#fig-ttft")).to_have_text("unknown")
    page.locator(f'.wf-row[data-span-id="{ids["http"]}"] .wf-name').click()
    facts = page.locator("#wf-detail-body table.facts")
    expect(facts).to_contain_text("inference (part of the model call above it; sent as other)")
    page.locator(f'.wf-row[data-span-id="{ids["llm"]}"] .wf-name').click()
    expect(page.locator("#wf-detail-body table.facts")).to_contain_text("unknown (the instrumentation sent no first-token time)")
