"""HTTP read latency of a real `manage.py serve`, beside the selector time alone.

    .venv/bin/python bench/read.py [--spans 50000] [--days 1] [--runs 200] [--warmup 20] [--data-dir DIR] [--json PATH]

What is measured:

1. **Data.** ``--spans`` realistic LLM spans (``bench/load_spans.py``'s generator: ~8.5 spans a
   trace, ~10 % of model calls with a 2–8 KB prompt and a completion) spread over the last
   ``--days`` days are loaded into a fresh server data dir (embedded chdb, SQLite), for a project
   created the way users create one (``manage.py create_project``), with its summaries. Loading
   prints its progress (10,000,000 spans take several minutes). With ``--data-dir`` the data dir
   is kept and reused by the next run with the same ``--spans``/``--days``/``--seed``.
2. **Selector time** (no HTTP, server stopped, in a child process that opens the same data dir):
   the call the endpoint's view makes — ``trace_detail.trace_get`` for a trace by id,
   ``explorer.explorer_page`` for the list — ``--runs`` times after ``--warmup``.
3. **HTTP, end to end**: the server runs (``manage.py serve``, no in-process beat: nothing
   else competes for the cores; a production web process runs no beat either) and one keep-alive
   client asks, one request at a time, ``--runs`` times after ``--warmup``:

   - ``GET /api/v1/traces/<id>`` with the project's key (``Authorization: Bearer``), a different
     trace each time (ids sampled over the whole range);
   - ``GET /api/v1/traces/<id>?include=summary`` (the summary, phases and critical path without
     the spans' attributes; skipped when the server ignores ``include``);
   - ``GET /traces/rows.json?from=…&to=…`` the explorer's first page (50 traces) of the last hour
     of data, as a logged-in user (the endpoint reads the browser session).

   Latency is send to last byte of the answer, as a client sees it.

Arize Phoenix publishes 24 ms (median) for one trace by id and 25 ms to list the last hour's
traces; the target here is a median ≤ 25 ms at 50,000 spans on an idle machine.
"""

from __future__ import annotations

import argparse
import http.client
import http.cookies
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import Server, embedded_env, machine, percentile, table  # noqa: E402

USERNAME = "reader"
PROJECT = "read-bench"
MARKER = "read-bench.json"  # in the data dir: what was loaded there (for --data-dir reuse)
PHOENIX_MS = {"trace by id": 24, "traces, last hour": 25}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the child process: load, sample, time the selectors (it owns the embedded store) ----------
def child_main(spec: dict) -> dict:
    """Runs with the server's environment while no server runs: chdb opens one data path per process."""
    import logging

    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    from bench.load_spans import load
    from store import get_store

    store = get_store()
    project_id = spec["project_id"]
    if spec["load"]:
        log(f"loading {spec['spans']:,} spans over {spec['days']:g} days for project {project_id}…")
        stats = load(store=store, spans_wanted=spec["spans"], days=spec["days"], batch=min(200_000, spec["spans"]),
                     seed=spec["seed"], now_ns=time.time_ns(), project_id=project_id)
        log(f"  loaded {stats['spans']:,} spans in {stats['traces']:,} traces in {stats['seconds']:.1f} s")
    counts = store.query("SELECT count() AS n, toUnixTimestamp64Nano(max(start_time)) AS newest FROM traces FINAL"
                         " WHERE project_id = {p:UInt64}", {"p": project_id}, tag="bench.read.count").dicts()[0]
    spans = int(store.query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": project_id},
                            tag="bench.read.count").scalar())
    ids = [r[0] for r in store.query(
        "SELECT trace_id FROM traces WHERE project_id = {p:UInt64} ORDER BY cityHash64(trace_id) LIMIT {n:UInt32}",
        {"p": project_id, "n": 200}, tag="bench.read.sample").rows]
    newest = datetime.fromtimestamp(int(counts["newest"]) / 1e9, tz=timezone.utc)
    window = {"from": _iso(newest.timestamp() - 3600), "to": _iso(newest.timestamp() + 1)}
    timings = time_selectors(project_id, ids, window, runs=spec["runs"], warmup=spec["warmup"])
    return {"traces": int(counts["n"]), "spans": spans, "ids": ids, "window": window, "selectors": timings}


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def time_selectors(project_id: int, ids: list[str], window: dict, *, runs: int, warmup: int) -> dict:
    from dashboard import trace_detail
    from dashboard.explorer import explorer_page
    from dashboard.explorer_views import DEFAULT_RANGE, explorer_query_parse
    from dashboard.filters import filter_bar_from_query

    def trace(i: int) -> int:  # as GET /api/v1/traces/<id> reads it: spans and GenAI events
        detail = trace_detail.trace_get(project_id=project_id, trace_id=ids[i % len(ids)], with_genai_events=True)
        return len(detail.spans)

    def trace_spans_only(i: int) -> int:  # the same without the GenAI events (the compare page's read)
        detail = trace_detail.trace_get(project_id=project_id, trace_id=ids[i % len(ids)])
        return len(detail.spans)

    bar = filter_bar_from_query(window, default_range=DEFAULT_RANGE)
    query, errors = explorer_query_parse(window, bar=bar)
    if errors:
        raise RuntimeError(f"the list query is refused: {errors}")

    def listing(i: int) -> int:
        return len(explorer_page(project_id=project_id, query=query).rows)

    out = {}
    for name, call in (("trace by id", trace), ("trace by id, spans only", trace_spans_only),
                       ("traces, last hour", listing)):
        for i in range(warmup):
            call(i)
        times, rows = [], 0
        for i in range(runs):
            started = time.perf_counter()
            rows = call(warmup + i)
            times.append((time.perf_counter() - started) * 1000)
        out[name] = _stats(times) | {"rows_last": rows}
    return out


def _stats(times_ms: list[float]) -> dict:
    times_ms = sorted(times_ms)
    return {"median_ms": round(statistics.median(times_ms), 2), "p95_ms": round(percentile(times_ms, 95), 2),
            "n": len(times_ms)}


# --- the HTTP client -----------------------------------------------------------------------------
class Client:
    """One keep-alive connection with a cookie jar."""

    def __init__(self, port: int):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        headers = dict(headers or {})
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            self.conn.request(method, path, body, headers)
            response = self.conn.getresponse()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.conn.request(method, path, body, headers)
            response = self.conn.getresponse()
        data = response.read()
        for header in response.headers.get_all("Set-Cookie") or []:
            jar = http.cookies.SimpleCookie()
            jar.load(header)
            for name, morsel in jar.items():
                self.cookies[name] = morsel.value
        return response.status, data

    def login(self, username: str, password: str) -> None:
        status, page = self.request("GET", "/login/")
        match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or not match:
            raise RuntimeError(f"GET /login/ answered {status} without a CSRF token")
        form = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": match.group(1).decode()}).encode()
        status, _ = self.request("POST", "/login/", form, {"Content-Type": "application/x-www-form-urlencoded",
                                                           "Referer": f"http://127.0.0.1:{self.port}/login/"})
        if status != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(f"login failed: POST /login/ answered {status}")


def time_http(client: Client, paths, *, headers: dict, runs: int, warmup: int, check) -> dict:
    times, sizes = [], []
    for i in range(warmup + runs):
        path = paths(i)
        started = time.perf_counter()
        status, body = client.request("GET", path, headers=headers)
        elapsed = (time.perf_counter() - started) * 1000
        if status != 200:
            raise RuntimeError(f"GET {path} answered {status}: {body[:300]!r}")
        if i >= warmup:
            times.append(elapsed)
            sizes.append(len(body))
        if i == warmup:
            check(json.loads(body))
    return _stats(times) | {"bytes_median": int(statistics.median(sizes))}


# --- the orchestration ----------------------------------------------------------------------------
def run_child(server: Server, spec: dict) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)], cwd=ROOT,
                          env=server.env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the loading/selector process failed ({done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=50_000, help="spans to load (default 50,000)")
    parser.add_argument("--days", type=float, default=1.0,
                        help="spread over the last N days (default 1: the last hour holds ~4 %% of the traces)")
    parser.add_argument("--runs", type=int, default=200, help="timed requests per endpoint (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests first (default 20)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--data-dir", type=Path,
                        help="server data dir, kept and reused by a later run with the same --spans/--days/--seed "
                             "(default: a fresh temporary one, deleted afterwards)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None and (args.spans < 1 or args.days <= 0 or args.runs < 1 or args.warmup < 0):
        parser.error("--spans, --days and --runs must be positive, --warmup at least 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child_main(json.loads(args.child))), flush=True)
        sys.stdout.flush()
        os._exit(0)  # chdb's background threads: no interpreter teardown under them

    keep = args.data_dir is not None
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="tracedash-bench-read-")) / "server"
    data_dir.mkdir(parents=True, exist_ok=True)
    wanted = {"spans": args.spans, "days": args.days, "seed": args.seed}
    marker = data_dir / MARKER
    state = json.loads(marker.read_text()) if marker.exists() else None
    if state is not None and state.get("loaded") != wanted:
        raise SystemExit(f"{data_dir} holds another load ({state.get('loaded')}); use another --data-dir")
    server = Server(data_dir, env={"TRACEDASH_EMBEDDED_BEAT": "0", "TRACEDASH_INGEST_RATE_LIMIT": "0"})
    password = secrets.token_urlsafe(12)
    try:
        if state is None:
            log(f"preparing {data_dir}: migrations, user {USERNAME!r}, project {PROJECT!r}…")
            server.manage("migrate", "--verbosity", "0")
            server.manage("migrate_clickhouse")
            server.manage("shell", "-c", f"from django.contrib.auth import get_user_model; "
                                         f"get_user_model().objects.create_user({USERNAME!r})")
            out = server.manage("create_project", PROJECT, "--member", USERNAME).strip().splitlines()
            project_id = int(re.search(r"\(id (\d+)\)", out[-2]).group(1))
            state = {"loaded": wanted, "project_id": project_id, "key": out[-1], "complete": False}
            marker.write_text(json.dumps(state))
        if not state["complete"]:
            spec = {**wanted, "project_id": state["project_id"], "load": True, "runs": args.runs, "warmup": args.warmup}
        else:
            spec = {**wanted, "project_id": state["project_id"], "load": False, "runs": args.runs, "warmup": args.warmup}
        log("selector times (in a child process, no HTTP)…")
        sample = run_child(server, spec)
        state["complete"] = True
        marker.write_text(json.dumps(state))
        server.manage("shell", "-c", f"from django.contrib.auth import get_user_model; "
                                     f"u = get_user_model().objects.get(username={USERNAME!r}); "
                                     f"u.set_password({password!r}); u.save()")

        log("starting `manage.py serve` (no in-process beat)…")
        server.start()
        client = Client(server.port)
        client.login(USERNAME, password)
        key_headers = {"Authorization": f"Bearer {state['key']}"}
        ids = sample["ids"]
        list_path = "/traces/rows.json?" + urllib.parse.urlencode(sample["window"])

        def check_trace(body):
            assert body["trace_id"] in ids and body["spans"], body

        def check_summary(body):
            assert body["trace_id"] in ids and "spans" not in body, sorted(body)

        def check_list(body):
            assert body["project_id"] == state["project_id"] and body["rows"], body

        http_results = {}
        log("HTTP: trace by id…")
        http_results["trace by id"] = time_http(client, lambda i: f"/api/v1/traces/{ids[i % len(ids)]}",
                                                headers=key_headers, runs=args.runs, warmup=args.warmup,
                                                check=check_trace)
        status, body = client.request("GET", f"/api/v1/traces/{ids[0]}?include=summary", headers=key_headers)
        if status == 200 and "spans" not in json.loads(body):
            log("HTTP: trace by id, ?include=summary…")
            http_results["trace by id, summary only"] = time_http(
                client, lambda i: f"/api/v1/traces/{ids[i % len(ids)]}?include=summary", headers=key_headers,
                runs=args.runs, warmup=args.warmup, check=check_summary)
        log("HTTP: traces of the last hour (explorer's first page)…")
        http_results["traces, last hour"] = time_http(client, lambda i: list_path, headers={}, runs=args.runs,
                                                      warmup=args.warmup, check=check_list)
    except BaseException:
        if server.proc is not None:
            log(f"\nserver log (last lines, {server.log_path}):\n{server.log_tail()}")
        raise
    finally:
        server.stop()
        if not keep:
            shutil.rmtree(data_dir.parent, ignore_errors=True)

    info = machine()
    rows = []
    for name, figures in http_results.items():
        selector = sample["selectors"].get(name) or sample["selectors"].get(name.split(",")[0])
        rows.append([name, f"{figures['median_ms']:.1f}", f"{figures['p95_ms']:.1f}",
                     f"{selector['median_ms']:.1f}" if selector else "—", f"{selector['p95_ms']:.1f}" if selector else "—",
                     f"{figures['bytes_median']:,}", str(PHOENIX_MS.get(name, "—"))])
    print()
    print(f"tracedash read benchmark — {sample['spans']:,} spans, {sample['traces']:,} traces over {args.days:g} days; "
          f"{args.runs} requests per endpoint after {args.warmup} warm-up, one keep-alive connection, "
          f"`manage.py serve` (embedded chdb + SQLite, no in-process beat)")
    print()
    print(table(["endpoint", "HTTP median ms", "HTTP p95 ms", "selector median ms", "selector p95 ms", "bytes",
                 "Phoenix median ms"], rows))
    print()
    with_events, spans_only = sample["selectors"]["trace by id"], sample["selectors"]["trace by id, spans only"]
    print(f"selector, trace by id: {with_events['median_ms']:.1f} ms median with its GenAI events (as the API reads it), "
          f"{spans_only['median_ms']:.1f} ms spans only (ratio {with_events['median_ms'] / spans_only['median_ms']:.2f})")
    print(f"list window: {sample['window']['from']} – {sample['window']['to']} "
          f"({sample['selectors']['traces, last hour']['rows_last']} rows on the first page)")
    print(f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}, "
          f"{info.get('memory_gib', '?')} GiB RAM; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"data_dir": str(data_dir), "json": None},
                                         "machine": info, "http": http_results, "selectors": sample["selectors"],
                                         "spans": sample["spans"], "traces": sample["traces"]}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
