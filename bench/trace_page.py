"""Trace page speed in a real headless Chromium against a real `manage.py serve`.

    .venv/bin/python bench/trace_page.py [--sizes 100,1000,10000] [--loads 5] [--data-dir DIR] [--json PATH]

For each trace size: the spans are posted over HTTP to a fresh embedded server (one request, so
the ingest path is the real one), the summariser is given the time to write the trace's summary,
then Chromium (Debian's, headless) logs in and opens ``/traces/<id>/`` ``--loads`` times. Per load
it records, in the page's own clock (ms since navigation start):

- ``server``: time to the first byte of the HTML (the trace read, tree, figures and the embedded
  JSON, rendered by the server);
- ``html``: the whole HTML received (the spans are embedded column-wise in it);
- ``interactive``: the waterfall drawn and answering input (``window.__waterfallReady``, set by
  ``static/tracedash/waterfall.js`` once the first rows are in the DOM and the handlers bound);

then, once per size, scrolls the span list to 10 %, 50 %, 90 % and the end, each time checking
that rows fill the view (no blank area) and timing the redraw (scroll to next animation frame with
rows in place), and counts the row elements in the DOM (virtualised: a small pool, not one per
span). Medians are printed; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import Server, machine, table  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
MS = 1_000_000
PASSWORD = "bench-password-" + secrets.token_hex(4)


def log(message: str) -> None:
    print(message, flush=True)


def agent_trace(count: int, rng: random.Random) -> list[dict]:
    """A ``count``-span agent run: a root, then steps of network → preprocess → inference (with
    TTFT, tokens and a prompt) → postprocess, some steps nesting a tool call one level deeper."""
    tid = secrets.token_hex(16)
    start = time.time_ns() - 600 * 1_000_000_000
    root = secrets.token_hex(8)
    spans = [{"trace_id": tid, "span_id": root, "parent_span_id": None, "name": "agent.run", "phase": "other",
              "service": "agent", "start_time": start, "duration_ms": 0.0}]
    cursor = start
    while len(spans) < count:
        step = {"trace_id": tid, "span_id": secrets.token_hex(8), "parent_span_id": root, "name": f"step {len(spans)}",
                "phase": "other", "service": "agent", "start_time": cursor, "duration_ms": 0.0}
        spans.append(step)
        t = cursor
        for phase in ("network", "preprocess", "inference", "postprocess"):
            if len(spans) >= count:
                break
            dur = rng.randint(1, 40) * MS
            span = {"trace_id": tid, "span_id": secrets.token_hex(8), "parent_span_id": step["span_id"],
                    "name": f"{phase} call", "phase": phase, "service": "agent", "start_time": t,
                    "duration_ms": dur / MS, "attributes": {"step": step["name"]}}
            if phase == "inference":
                span.update(model="gpt-4o-mini", ttft_ms=dur / MS / 3, input_tokens=100, output_tokens=20,
                            attributes={"step": step["name"], "gen_ai.prompt.0.content": "Plan the next action. " * 8})
            spans.append(span)
            t += dur
        step["duration_ms"] = (t - cursor) / MS
        cursor = t
    spans[0]["duration_ms"] = (cursor - start) / MS
    return spans[:count]


def post(server: Server, key: str, spans: list[dict]) -> None:
    body = json.dumps({"spans": spans}).encode()
    request = urllib.request.Request(f"{server.base}/api/v1/traces", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    if answer.get("accepted") != len(spans):
        raise RuntimeError(f"ingest answered {answer}")


SCROLL_CHECK = """async (fraction) => {
  const list = document.getElementById('wf-list');
  const canvas = document.getElementById('wf-canvas');
  const t = performance.now();
  list.scrollTop = fraction >= 1 ? 1e9 : canvas.offsetHeight * fraction;
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const ms = performance.now() - t;
  const ruler = document.getElementById('wf-ruler').offsetHeight;
  const top = list.scrollTop, bottom = Math.min(top + list.clientHeight - ruler, canvas.offsetHeight);
  const tops = [...document.querySelectorAll('.wf-row:not([hidden])')]
    .map((r) => parseFloat(r.style.transform.slice(11))).filter((y) => y + 24 > top && y < bottom).sort((a, b) => a - b);
  let blank = !tops.length || tops[0] > top || tops[tops.length - 1] + 24 < bottom;
  for (let i = 1; i < tops.length; i++) if (tops[i] - tops[i - 1] !== 24) blank = true;
  return {ms, blank, rows: document.querySelectorAll('.wf-row').length};
}"""


def measure(page, url: str, loads: int) -> dict:
    runs = []
    for _ in range(loads):
        page.goto(url)
        page.wait_for_function("document.getElementById('waterfall').dataset.ready === '1'", timeout=60_000)
        runs.append(page.evaluate("""(() => {
            const t = performance.getEntriesByType('navigation')[0];
            return {server: t.responseStart, html: t.responseEnd, interactive: window.__waterfallReady,
                    bytes: t.transferSize};
        })()"""))
    scrolls = [page.evaluate(SCROLL_CHECK, f) for f in (0.1, 0.5, 0.9, 1.0)]
    spans = int(page.inner_text("#fig-spans"))
    return {"runs": runs, "scrolls": scrolls, "spans": spans}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not os.path.exists(CHROMIUM):
        log(f"needs Debian's Chromium at {CHROMIUM}")
        return 2
    from playwright.sync_api import sync_playwright

    workdir = Path(tempfile.mkdtemp(prefix="tracedash-bench-trace-page-"))
    data_dir = args.data_dir or workdir / "data"
    server = Server(data_dir)
    results = {"machine": machine(), "sizes": {}}
    try:
        log(f"starting manage.py serve on {data_dir} …")
        server.start()
        env_password = {"DJANGO_SUPERUSER_PASSWORD": PASSWORD}
        server.env.update(env_password)
        server.manage("createsuperuser", "--noinput", "--username", "bench", "--email", "bench@example.invalid")
        key = server.manage("create_project", "bench-trace-page", "--member", "bench").strip().splitlines()[-1]
        rng = random.Random(5)
        trace_ids = {}
        for size in sizes:
            spans = agent_trace(size, rng)
            started = time.perf_counter()
            for i in range(0, len(spans), 10_000):
                post(server, key, spans[i:i + 10_000])
            trace_ids[size] = spans[0]["trace_id"]
            log(f"  posted a {size:,}-span trace in {time.perf_counter() - started:.2f} s")
        time.sleep(8)  # the summariser (embedded beat) writes the traces' summaries
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{server.base}/login/")
            page.fill("#id_username", "bench")
            page.fill("#id_password", PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(lambda url: "/login/" not in url)
            for size in sizes:
                log(f"  opening the {size:,}-span trace {args.loads} times …")
                results["sizes"][size] = measure(page, f"{server.base}/traces/{trace_ids[size]}/", args.loads)
            browser.close()
    finally:
        code = server.stop()
        if code not in (0, None):
            log(server.log_tail())
        shutil.rmtree(workdir, ignore_errors=True)

    rows = []
    for size, r in results["sizes"].items():
        med = {k: statistics.median(run[k] for run in r["runs"]) for k in ("server", "html", "interactive")}
        worst = max(run["interactive"] for run in r["runs"])
        scroll_ms = max(s["ms"] for s in r["scrolls"])
        rows.append([f"{size:,}", f"{r['spans']:,}", f"{med['server']:.0f}", f"{med['html']:.0f}",
                     f"{med['interactive']:.0f}", f"{worst:.0f}", f"{scroll_ms:.0f}",
                     "yes" if any(s["blank"] for s in r["scrolls"]) else "no", str(max(s["rows"] for s in r["scrolls"]))])
    m = results["machine"]
    log(f"\nmachine: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}; medians of {args.loads} loads, ms since navigation start")
    log(table(["trace spans", "shown", "server (TTFB)", "HTML received", "interactive", "worst interactive",
               "scroll redraw (max)", "blank rows", "row elements"], rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
