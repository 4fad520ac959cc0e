"""Soak: ten minutes of mixed load on one `manage.py serve`, the way an operator would try it
before trusting it with production traffic (issue 9, point 1).

    .venv/bin/python bench/soak.py [--minutes 10] [--rate 10000] [--page-clients 4] [--gpus 8]
                                   [--data-dir DIR] [--json PATH] [--markdown PATH]

One server process on the embedded defaults (chdb, SQLite, the in-process beat running the trace
summariser, the rollups, the host sampler and alert evaluation every 5 s) on a fresh data dir gets,
all at once, for ``--minutes``:

- **Ingestion at a steady open-loop rate**: ``--rate`` spans/s (default 10,000: half the json-1000
  maximum in docs/BENCHMARKS.md) as 1,000-span native JSON batches of realistic LLM traces (built by
  bench/ingest.py's ``TraceFactory``; every request gets its own id prefix, so all ids are unique,
  and its own times: its traces started 20-30 s before it is sent).
  Request *i* is due at ``start + i × batch / rate`` whether or not earlier ones have been answered
  (up to ``--senders`` in flight); a late request is sent as soon as a sender is free, and its delay
  is reported. A span counts as acknowledged on a 200 whose ``accepted`` is the whole batch.
- **Dashboard pages and JSON endpoints** polled by ``--page-clients`` logged-in users (the login
  form, CSRF cookie and token, as a browser does), each cycling through the overview, traces
  explorer and its rows JSON, one trace's page and API, costs, compare, resources and its series
  JSON, alerts and its firing JSON and the series API, pausing ``--page-pause`` s between requests
  (every URL is fetched several times a minute). Every request's latency (send to last byte) and
  status is kept; anything but a 2xx is an error and a 5xx fails the soak.
- **Fake GPUs**: two agents (hosts) post ``/api/v1/resources`` every second for ``--gpus`` GPUs and
  their host. One GPU's memory climbs across 85 % and back down, so the default rule "GPU memory ≥
  85 %" (``for`` 60 s, ``keep_firing_for`` 60 s) goes pending → firing → resolved on a run of 5
  minutes or more (it can only fire on a short one); its state history is printed at the end.

Every 5 s the script reads the server's RSS (/proc) and /healthz (the writer's counters, the spool,
the spans table's active parts); once a minute it prints a row: spans acknowledged (that minute,
total), spans the writer has taken (``rows_stored + rows_spooled`` less the resource samples, which
go through the same writer) and rows still queued, page p50/p99, errors, server and client RSS,
active parts, spool bytes, alerts firing.

Pass/fail at the end (exit 1 on any FAIL):

(a) **nothing lost**: the server drains (no queued rows, empty spool) and stops; a separate process
    counts ``spans FINAL`` and ``uniqExact(trace_id, span_id)``: both equal the spans acknowledged.
(b) **memory flat**: the least-squares slope of the server's RSS, read from /proc every second, over
    the last 5 minutes is below ``--max-rss-slope`` MiB/min (default 5). Why 5: the RSS swings by
    ±50 MiB within seconds (insert buffers, Arrow batches, query results come and go), which leaves
    a 5-minute slope a standard error of about 2.5 MiB/min (printed; widened for the samples'
    autocorrelation), so a bar of 5 MiB/min is about two of those: a flat server passes (it fails
    on noise alone a few times in a hundred), while a steady leak of 5 MiB/min (25 MiB in the
    window) fails as often as not and a faster one almost always. 5 MiB/min is a leak of 9 bytes
    per span at 10,000 spans/s, of 30 KiB per page request (~170 a minute) or of 9 KiB per resource
    row (600 a minute). It cannot see a slower leak (5 MiB/min is still 7 GiB a day); a longer soak
    can, with the same figure. Printed beside it, not judged: the slope of the *floor* (each 30 s's lowest RSS),
    the memory held between bursts of work. Merges of ever larger parts and page queries over a
    window that fills all run long raise the peaks (and so the slope) without anything being
    kept; a leak raises the floor as well.
(c) **latency steady**: page p99 over the last 5 minutes ≤ ``--max-p99-factor`` (default 1.5) × page
    p99 over the first 5 minutes after a 1-minute warm-up (on a 10-minute run the two windows share
    minute 6). The spans table grows by millions of rows in between, so a page whose cost grows
    with the data fails this.
(d) **no server errors**: zero 5xx answers and zero dropped connections on any request.
(e) **ingestion kept its rate**: spans acknowledged by the run's end (plus ``ON_TIME_GRACE_SECONDS``,
    15 s, for the last requests' answers) ≥ 98 % of those planned. A server that falls behind and
    catches up after the end did not keep the rate, though every span is acknowledged in the end.

On runs shorter than 10 minutes the windows of (b) and (c) shrink to (minutes − 1) / 2 each.
The client (this process) shares the machine's cores with the server, so it is kept cheap: bodies
are encoded up front and only their 8-character id prefix is replaced per request.
"""

from __future__ import annotations

import argparse
import http.client
import http.cookies
import itertools
import json
import math
import random
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ is sys.path[0] and bench/ingest.py would shadow the app's `ingest` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import Server, machine, percentile, rss_bytes, rss_parts, table  # noqa: E402
from bench.ingest import (JSON_MARKER, TraceFactory, encode_native, native_template_ok, patch_json,  # noqa: E402
                          stored_count, wait_drained)

BATCH = 1000
TEMPLATES = 6
RSS_SECONDS = 1.0  # server RSS (from /proc: costs nothing) this often
FLOOR_SLICE_SECONDS = 30.0  # (b) also reports the slope of each such slice's lowest RSS
SAMPLE_SECONDS = 5.0  # /healthz this often
WARMUP_MINUTES = 1.0
ON_TIME_GRACE_SECONDS = 15.0  # (e): a span counts as on time when acknowledged by the end plus this
MiB = 2**20
GiB = 2**30
GPU_MEMORY_TOTAL = 80 * GiB
HOSTS = ("gpu-host-a", "gpu-host-b")
PROJECT = "soak"
USERNAME = "soak"
GPU_RULE = "GPU memory ≥ 85 %"  # the default rule's name (alerts.services.DEFAULT_RULES)
GPU_SERIES = f"host={HOSTS[0]},gpu=0"  # its series for the climbing GPU

ALERTS_SCRIPT = """
import json
from alerts.models import AlertEvent, AlertSeries
from projects.models import Project
project = Project.objects.get(name=%r)
events = [{"rule": e.rule.name, "series": e.series_key, "from": e.from_state, "to": e.to_state, "value": e.value,
           "at": e.at.timestamp(), "reason": e.reason}
          for e in AlertEvent.objects.filter(project=project).select_related("rule").order_by("at", "pk")]
series = [{"rule": s.rule.name, "series": s.key, "state": s.state, "value": s.value, "no_data": s.no_data}
          for s in AlertSeries.objects.filter(project=project).exclude(state="inactive").select_related("rule")]
print(json.dumps({"events": events, "series": series}))
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- recorders (appends from worker threads; list.append is atomic under the GIL) -------------------
@dataclass
class Record:
    ingest: list = field(default_factory=list)  # (t done, spans acknowledged, latency s, lateness s)
    pages: list = field(default_factory=list)  # (t done, url name, status, latency s)
    resources: list = field(default_factory=list)  # (t done, status, rows accepted)
    errors: list = field(default_factory=list)  # (t, kind, what, status or exception name)
    samples: list = field(default_factory=list)  # (t, server rss, client rss, ingest check, parts, firing, memory)
    rss: list = field(default_factory=list)  # (t, server rss, client rss) every RSS_SECONDS
    rss_parts: list = field(default_factory=list)  # (t, server anon rss, server file rss) every RSS_SECONDS
    firing: list = field(default_factory=list)  # the last firing.json answer: [rule names]


class Session:
    """One keep-alive connection with its cookies (enough of a browser for Django's forms).

    The server closes a connection idle for 5 s (uvicorn's keep-alive timeout); a request sent on it
    as it closes fails with a broken pipe or a reset that says nothing about the server. So, as a
    browser's connection pool does, a connection idle for ``IDLE_SECONDS`` is not reused."""

    IDLE_SECONDS = 3.0

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.last_used = time.monotonic()

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        headers = dict(headers or {})
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if time.monotonic() - self.last_used > self.IDLE_SECONDS:
            self.conn.close()  # reconnects on the request below
        try:
            self.conn.request(method, path, body, headers)
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            raise
        finally:
            self.last_used = time.monotonic()
        for header in response.headers.get_all("Set-Cookie") or []:
            jar = http.cookies.SimpleCookie()
            jar.load(header)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0" or not morsel.value:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return response.status, response, data

    def login(self, username: str, password: str) -> None:
        status, _, page = self.request("GET", "/login/")
        match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or not match:
            raise RuntimeError(f"GET /login/ answered {status} without a CSRF token")
        form = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": match.group(1).decode()}).encode()
        status, _, _ = self.request("POST", "/login/", form, {"Content-Type": "application/x-www-form-urlencoded",
                                                              "Referer": f"http://127.0.0.1:{self.port}/login/"})
        if status != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(f"login failed: POST /login/ answered {status}")

    def close(self) -> None:
        self.conn.close()


# --- the three loads -----------------------------------------------------------------------------
class Ingest:
    """Open-loop senders: request i is due at start + i × interval; ``senders`` connections."""

    def __init__(self, port: int, key: str, templates: list[bytes], *, rate: float, start: float, end: float,
                 senders: int, record: Record):
        self.port, self.key, self.templates, self.record = port, key, templates, record
        self.interval = BATCH / rate
        self.start, self.end = start, end
        self.planned = math.ceil((end - start) / self.interval)
        self.numbers = itertools.count(0)
        self.first_acked = threading.Event()
        self.threads = [threading.Thread(target=self._sender, name=f"soak-ingest-{n}", daemon=True) for n in range(senders)]

    def start_threads(self) -> None:
        for thread in self.threads:
            thread.start()

    def _sender(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        session = Session(self.port)
        clock = time.monotonic
        while True:
            i = next(self.numbers)
            if i >= self.planned:
                break
            due = self.start + i * self.interval
            wait = due - clock()
            if wait > 0:
                time.sleep(wait)
            body = patch_json(self.templates[i % len(self.templates)], i + 1)  # request number i + 1: the id prefix
            sent = clock()
            try:
                status, _, answer = session.request("POST", "/api/v1/traces", body, headers)
            except (OSError, http.client.HTTPException) as exc:
                self.record.errors.append((clock(), "ingest", "/api/v1/traces", type(exc).__name__))
                continue
            done = clock()
            if status != 200:
                self.record.errors.append((done, "ingest", "/api/v1/traces", status))
                continue
            payload = json.loads(answer)
            if payload.get("accepted") != BATCH or payload.get("rejected"):
                self.record.errors.append((done, "ingest", "/api/v1/traces", "200 with rejected spans"))
                continue
            self.record.ingest.append((done, BATCH, done - sent, max(0.0, sent - due)))
            if i == 0:
                self.first_acked.set()
        session.close()

    def join(self) -> None:
        for thread in self.threads:
            thread.join()


def page_urls(trace_id: str) -> list[tuple[str, str]]:
    """(name, path) of what the page clients poll: every page of the navigation and the JSON behind it."""
    return [
        ("overview", "/"),
        ("series overview", "/api/v1/series/overview"),
        ("traces", "/traces/"),
        ("traces rows.json", "/traces/rows.json"),
        ("trace page", f"/traces/{trace_id}/"),
        ("trace api", f"/api/v1/traces/{trace_id}"),
        ("costs", "/costs/"),
        ("series costs", "/api/v1/series/costs"),
        ("series latency", "/api/v1/series/latency"),
        ("compare", "/compare/"),
        ("resources", "/resources/"),
        ("resources series.json", "/resources/series.json"),
        ("alerts", "/alerts/"),
        ("alerts firing.json", "/alerts/firing.json"),
    ]


def page_client(n: int, port: int, password: str, urls: list, *, end: float, pause: float, trace_ready: threading.Event,
                record: Record) -> None:
    session = Session(port)
    try:
        session.login(USERNAME, password)
    except (RuntimeError, OSError, http.client.HTTPException) as exc:
        record.errors.append((time.monotonic(), "page", "login", type(exc).__name__))
        log(f"page client {n}: {exc}")
        return
    rng = random.Random(n)
    clock = time.monotonic
    i = n * len(urls) // 4  # clients start at different places in the cycle
    while clock() < end:
        name, path = urls[i % len(urls)]
        i += 1
        if name.startswith("trace ") and not trace_ready.is_set():
            continue
        started = clock()
        try:
            status, _, body = session.request("GET", path, headers={"Accept": "text/html,application/json"})
        except (OSError, http.client.HTTPException) as exc:
            record.errors.append((clock(), "page", name, type(exc).__name__))
            time.sleep(pause)
            continue
        done = clock()
        record.pages.append((done, name, status, done - started))
        if not 200 <= status < 300:
            record.errors.append((done, "page", name, status))
        elif name == "alerts firing.json":
            record.firing[:] = [f"{a['rule']} {a['series']}" for a in json.loads(body).get("firing", [])]
        time.sleep(pause * rng.uniform(0.5, 1.5))
    session.close()


class Gpus:
    """Two agents posting a host sample and their GPUs every second; GPU 0 of the first host climbs
    across 85 % memory between ``up`` and ``down`` seconds into the run."""

    def __init__(self, port: int, key: str, gpus: int, *, start: float, end: float, up: float, down: float, record: Record):
        self.port, self.key, self.gpus, self.record = port, key, gpus, record
        self.start, self.end, self.up, self.down = start, end, up, down
        self.rows_acknowledged = 0
        self.thread = threading.Thread(target=self._run, name="soak-gpus", daemon=True)

    def memory_percent(self, t: float) -> float:
        """The climbing GPU: 70 % → 85 % over the 30 s before ``up``, 93 % held, back below 85 % at ``down``."""
        if t < self.up:
            return max(70.0, 85.0 - 15.0 * (self.up - t) / 30.0)
        if t < self.down - 30:
            return min(93.0, 85.0 + 8.0 * (t - self.up) / 30.0)
        return max(70.0, 85.0 - 15.0 * (t - self.down) / 30.0) if t >= self.down else 85.0 + 8.0 * (self.down - t) / 30.0

    def samples(self, host_no: int, t: float, now_ns: int, rng: random.Random) -> list[dict]:
        host = HOSTS[host_no]
        out = [{"host": host, "time": now_ns, "cpu_percent": round(rng.uniform(20, 40), 1),
                "memory_used": int(rng.uniform(0.30, 0.35) * 512 * GiB), "memory_total": 512 * GiB}]
        mine = [g for g in range(self.gpus) if g % len(HOSTS) == host_no]
        for local, g in enumerate(mine):
            percent = self.memory_percent(t) if g == 0 else 45.0 + 3.0 * g + rng.uniform(-1, 1)
            out.append({"host": host, "time": now_ns, "gpu_index": local, "gpu_uuid": f"GPU-soak-{host}-{local}",
                        "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_utilization": round(rng.uniform(70, 95), 1),
                        "gpu_memory_used": int(GPU_MEMORY_TOTAL * percent / 100), "gpu_memory_total": GPU_MEMORY_TOTAL,
                        "gpu_temperature": round(rng.uniform(55, 75), 1), "gpu_power_watts": round(rng.uniform(300, 600), 1)})
        return out

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        sessions = [Session(self.port) for _ in HOSTS]
        rng = random.Random(3)
        clock = time.monotonic
        tick = 0
        while True:
            due = self.start + tick
            if due >= self.end:
                break
            if due > clock():
                time.sleep(due - clock())
            tick += 1
            for host_no, session in enumerate(sessions):
                body = json.dumps({"samples": self.samples(host_no, due - self.start, time.time_ns(), rng)}).encode()
                try:
                    status, _, answer = session.request("POST", "/api/v1/resources", body, headers)
                except (OSError, http.client.HTTPException) as exc:
                    self.record.errors.append((clock(), "resources", "/api/v1/resources", type(exc).__name__))
                    continue
                if status != 200:
                    self.record.errors.append((clock(), "resources", "/api/v1/resources", status))
                    continue
                accepted = json.loads(answer).get("accepted", 0)
                self.rows_acknowledged += accepted
                self.record.resources.append((clock(), status, accepted))
        for session in sessions:
            session.close()


# --- figures ------------------------------------------------------------------------------------
def slope_per_minute(points: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """Least-squares slope of (seconds, value) in value per minute, and its standard error. The
    samples a second apart are not independent (a buffer lives a few seconds), so the error is
    widened by the residuals' lag-1 autocorrelation r (AR(1): × sqrt((1 + r) / (1 − r)))."""
    n = len(points)
    if n < 3:
        return None, None
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    sxx = sum((t - mean_t) ** 2 for t, _ in points)
    if sxx == 0:
        return None, None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / sxx
    residuals = [v - mean_v - slope * (t - mean_t) for t, v in points]
    squares = sum(e * e for e in residuals)
    r = sum(a * b for a, b in zip(residuals, residuals[1:])) / squares if squares else 0.0
    r = min(max(r, 0.0), 0.95)
    error = math.sqrt(squares / (n - 2) / sxx) * math.sqrt((1 + r) / (1 - r))
    return slope * 60, error * 60


def floor_points(points: list[tuple[float, float]], slice_s: float = FLOOR_SLICE_SECONDS) -> list[tuple[float, float]]:
    """The lowest (seconds, value) of each ``slice_s`` slice of the points: the memory the server
    holds between bursts of work (merges, summaries, page queries), where a leak shows."""
    slices: dict[int, tuple[float, float]] = {}
    counts: dict[int, int] = {}
    for t, v in points:
        k = int(t // slice_s)
        counts[k] = counts.get(k, 0) + 1
        if k not in slices or v < slices[k][1]:
            slices[k] = (t, v)
    # Only slices sampled for at least half their length (not the few samples after the run).
    return [slices[k] for k in sorted(slices) if counts[k] >= slice_s / RSS_SECONDS / 2]


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def _plain(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def minute_rows(record: Record, start: float, minutes: int, resource_rows_by: callable, *, open_end: bool = False) -> list[dict]:
    """One dict per minute of the run; with ``open_end`` the last minute also takes what finished after it."""
    rows, cumulative = [], 0
    samples = record.samples
    for m in range(minutes):
        lo, hi = start + 60 * m, start + 60 * (m + 1)
        last = open_end and m == minutes - 1
        inside = (lambda t: lo <= t < hi) if not last else (lambda t: lo <= t)
        acked = sum(s for t, s, _, _ in record.ingest if inside(t))
        cumulative += acked
        latencies = sorted(x for t, _, _, x in record.pages if inside(t))
        errors = Counter(str(what) for t, _, _, what in record.errors if inside(t))
        # The sample taken at (or just before) the minute's end.
        at = [s for s in samples if s[0] <= hi + 3.0] or samples[:1]
        sample = at[-1] if at else None
        row = {"minute": m + 1, "acknowledged": acked, "acknowledged_total": cumulative, "page_requests": len(latencies),
               "page_p50_ms": None if not latencies else round(percentile(latencies, 50) * 1000, 1),
               "page_p99_ms": None if not latencies else round(percentile(latencies, 99) * 1000, 1),
               "errors": sum(errors.values()), "errors_by_status": dict(errors)}
        if sample is not None:
            t, server_rss, client_rss, ingest, parts, firing, memory = sample
            resource_rows = resource_rows_by(t)
            row.update(writer_spans=ingest["rows_stored"] + ingest["rows_spooled"] - resource_rows,
                       queued_rows=ingest["queued_rows"], spool_bytes=ingest["spool_bytes"],
                       server_rss_mib=round(server_rss / MiB, 1), client_rss_mib=round(client_rss / MiB, 1),
                       active_parts=parts, alerts_firing=firing, **memory)
        rows.append(row)
    return rows


LIVE_HEADERS = ["min", "ack'd", "ack'd total", "writer spans†", "queued", "page req", "p50 ms", "p99 ms", "errors",
                "server RSS MiB", "anon MiB", "ClickHouse MiB‡", "marks MiB", "malloc used/free MiB", "Arrow MiB",
                "Python blocks k", "client RSS MiB", "parts", "spool KiB",
                "alerts firing"]


def _cells(r: dict) -> list[str]:
    """A minute's row as text (the order of LIVE_HEADERS)."""
    return [str(r["minute"]), f"{r['acknowledged']:,}", f"{r['acknowledged_total']:,}",
            f"{r.get('writer_spans', 0):,}", f"{r.get('queued_rows', 0):,}", str(r["page_requests"]),
            "-" if r["page_p50_ms"] is None else f"{r['page_p50_ms']:,.0f}",
            "-" if r["page_p99_ms"] is None else f"{r['page_p99_ms']:,.0f}", str(r["errors"]),
            f"{r.get('server_rss_mib', 0):,.0f}", _mib(r.get("rss_anon_bytes")), _mib(r.get("clickhouse_tracked_bytes")),
            _mib(r.get("clickhouse_mark_cache_bytes")),
            f"{_mib(r.get('heap_in_use_bytes'))}/{_mib(r.get('heap_free_bytes'))}", _mib(r.get("arrow_allocated_bytes")),
            "-" if r.get("python_allocated_blocks") is None else f"{r['python_allocated_blocks'] / 1000:,.0f}",
            f"{r.get('client_rss_mib', 0):,.0f}", str(r.get("active_parts", "-")),
            f"{r.get('spool_bytes', 0) / 1024:,.0f}",
            "-" if "alerts_firing" not in r else
            f"{len(r['alerts_firing'])}{'*' if any(a.startswith(GPU_RULE) for a in r['alerts_firing']) else ''}"]


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:,.0f}"


def _memory_figures(health: dict) -> dict:
    """/healthz's memory figures kept per sample: ClickHouse's tracked memory and mark cache (in the
    server's RSS on the embedded store) and Python's allocated blocks."""
    clickhouse = health["checks"]["clickhouse"].get("memory") or {}
    web = health["checks"]["web"].get("memory") or {}
    return {"clickhouse_tracked_bytes": clickhouse.get("tracked_bytes"),
            "clickhouse_mark_cache_bytes": clickhouse.get("mark_cache_bytes"),
            "python_allocated_blocks": web.get("python_allocated_blocks"),
            **{key: web.get(key) for key in ("rss_anon_bytes", "heap_in_use_bytes", "heap_free_bytes",
                                             "arrow_allocated_bytes")}}


def render_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    return LIVE_HEADERS, [_cells(r) for r in rows]


FOOTNOTE = ("† writer spans: the server's ingest writer counters at the minute's end (/healthz `rows_stored` + "
            "`rows_spooled`, less the resource samples acknowledged, which go through the same writer); `queued`: "
            "rows accepted by the writer but not yet inserted (not yet acknowledged either). parts: active parts of "
            "the spans table. Errors: answers other than 2xx and dropped connections, all requests. alerts firing: "
            "series firing at the minute's end (/alerts/firing.json), * when the climbing GPU's memory alert is one. "
            "‡ ClickHouse MiB: the memory chdb's own accounting holds (system.metrics MemoryTracking, part of the server's "
            "RSS); marks: its mark cache; anon: the server's anonymous memory (RssAnon: heaps, not mapped files); malloc "
            "used/free: what glibc's malloc holds allocated and keeps freed (mallinfo2); Arrow: Arrow's allocator; "
            "Python blocks: sys.getallocatedblocks() (/healthz, checks.*.memory).")


def live_line(cells: list[str]) -> str:
    """A row of the live table: fixed widths, so rows printed a minute apart line up."""
    return " | ".join(c.rjust(max(len(h), 7)) if i else c.rjust(3) for i, (c, h) in enumerate(zip(cells, LIVE_HEADERS)))


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(headers) - 1)) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def verdict(result: dict, args) -> list[dict]:
    out = []

    def add(name: str, ok: bool, detail: str) -> None:
        out.append({"criterion": name, "ok": bool(ok), "detail": detail})

    check = result["check"]
    if check:
        add("(a) nothing lost", check["count"] == check["unique"] == result["acknowledged"],
            f"acknowledged {result['acknowledged']:,}, stored {check['count']:,} (spans FINAL), unique (trace_id, span_id) "
            f"{check['unique']:,}; server exit code {check['server_exit']}")
    else:
        add("(a) nothing lost", False, "not checked: " + result.get("check_error", "the run did not finish"))
    memory = result["memory"]
    if memory["slope_mib_per_min"] is None:
        add("(b) memory flat", False, "too few RSS samples")
    else:
        add("(b) memory flat", memory["slope_mib_per_min"] < args.max_rss_slope,
            f"server RSS slope over minutes {memory['from_minute']:g}–{memory['to_minute']:g}: "
            f"{memory['slope_mib_per_min']:+.2f} ± {memory['slope_error']:.2f} MiB/min (least squares over "
            f"{memory['samples']} samples, ± one standard error, autocorrelation-corrected; bar < {args.max_rss_slope:g}); "
            f"RSS {memory['rss_first_mib']:,.0f} → {memory['rss_last_mib']:,.0f} MiB over the window, "
            f"max {memory['rss_max_mib']:,.0f} MiB over the run; floor (each {memory.get('floor_slice_s', 30):g} s's "
            f"lowest RSS) {_signed(memory.get('floor_slope_mib_per_min'))} ± {_plain(memory.get('floor_slope_error'))} MiB/min; "
            f"of which anonymous memory {_signed(memory.get('anon_slope_mib_per_min'))} ± "
            f"{_plain(memory.get('anon_slope_error'))}, mapped files' pages {_signed(memory.get('file_slope_mib_per_min'))} ± "
            f"{_plain(memory.get('file_slope_error'))} MiB/min")
    lat = result["latency"]
    if lat["first_p99_ms"] is None or lat["last_p99_ms"] is None:
        add("(c) latency steady", False, "no page requests in one of the windows")
    else:
        ratio = lat["last_p99_ms"] / lat["first_p99_ms"]
        add("(c) latency steady", ratio <= args.max_p99_factor,
            f"page p99 {lat['first_p99_ms']:,.0f} ms in minutes {lat['first_window'][0]:g}–{lat['first_window'][1]:g} "
            f"({lat['first_requests']} requests), {lat['last_p99_ms']:,.0f} ms in minutes {lat['last_window'][0]:g}–"
            f"{lat['last_window'][1]:g} ({lat['last_requests']}): ×{ratio:.2f} (bar ≤ ×{args.max_p99_factor:g}); "
            f"p50 {lat['first_p50_ms']:,.0f} → {lat['last_p50_ms']:,.0f} ms")
    errors = result["errors"]
    # A 5xx, or a dropped connection / timeout (named by its exception); a 4xx is an error but not the server's fault.
    server_errors = {k: v for k, v in errors["by_status"].items() if (int(k) >= 500 if k.isdigit() else not k[:1].isdigit())}
    add("(d) no server errors", not server_errors,
        f"5xx/dropped: {sum(server_errors.values())} {server_errors or ''}; all non-2xx: {errors['total']} "
        f"{errors['by_kind_status'] or ''}".rstrip())
    ingest = result["ingest"]
    on_time = ingest.get("on_time_spans", result["acknowledged"])
    share = on_time / ingest["planned_spans"] if ingest["planned_spans"] else 0.0
    add("(e) ingestion kept its rate", share >= 0.98,
        f"{on_time:,} of {ingest['planned_spans']:,} planned spans acknowledged by the end + {ON_TIME_GRACE_SECONDS:g} s "
        f"({100 * share:.1f} %, bar ≥ 98 %; {result['acknowledged']:,} in all); "
        f"{ingest['spans_per_s']:,.0f} spans/s on time; ingest p50 {ingest['p50_ms']} ms, p99 {ingest['p99_ms']} ms; "
        f"sent late: p99 {ingest['late_p99_ms']} ms, max {ingest['late_max_ms']} ms")
    return out


def _mmss(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def alerts_summary(alerts: dict, start_epoch: float, up: float, down: float) -> list[str]:
    """The climbing GPU's alert in detail; the other default rules in one line each."""
    if not alerts:
        return ["alerts: (not read)"]
    events, series = alerts.get("events", []), alerts.get("series", [])
    mine = [e for e in events if e["rule"] == GPU_RULE and e["series"] == GPU_SERIES]
    end_state = next((s["state"] for s in series if s["rule"] == GPU_RULE and s["series"] == GPU_SERIES), "inactive")
    steps = "; ".join(f"{_mmss(e['at'] - start_epoch)} {e['from']} → {e['to']}"
                      + ("" if e["value"] is None else f" ({e['value']:.1f} %)") for e in mine) or "no state changes"
    lines = [f"alert {GPU_RULE!r} on {GPU_SERIES} (memory ≥ 85 % from {_mmss(up)} to {_mmss(down)}; mm:ss into the run): "
             f"{steps}; at the end: {end_state}"]
    others = [e for e in events if not (e["rule"] == GPU_RULE and e["series"] == GPU_SERIES)]
    by_rule: dict[str, dict] = {}
    for e in others:
        entry = by_rule.setdefault(e["rule"], {"series": set(), "transitions": 0})
        entry["series"].add(e["series"])
        entry["transitions"] += 1
    if by_rule:
        lines.append("other alerts (the synthetic traces and this machine's own CPU trip some default rules):")
        for rule, entry in sorted(by_rule.items()):
            states = Counter(s["state"] for s in series if s["rule"] == rule and not (rule == GPU_RULE and s["series"] == GPU_SERIES))
            at_end = ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "all inactive"
            lines.append(f"  {rule}: {len(entry['series'])} series, {entry['transitions']} transitions; at the end {at_end}")
    return lines


# --- main -----------------------------------------------------------------------------------------
def build_templates(seed: int) -> tuple[list[bytes], str]:
    """Pre-encoded 1,000-span bodies, and the trace id of request 1's first trace."""
    factory = TraceFactory(seed, time.time_ns())
    templates = []
    while len(templates) < TEMPLATES:
        spans = factory.batch(BATCH)
        body = encode_native(spans)
        if native_template_ok(body, spans):
            templates.append(body)
    suffix = re.search(rb'"trace_id":"' + JSON_MARKER + rb'([0-9a-f]{24})"', templates[0]).group(1).decode()
    return templates, "%08x" % 1 + suffix


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run (default 10)")
    parser.add_argument("--rate", type=float, default=10_000.0,
                        help="spans/s, open loop, in 1,000-span batches (default 10,000: half the measured maximum)")
    parser.add_argument("--page-clients", type=int, default=4, help="logged-in clients polling the pages (default 4)")
    parser.add_argument("--page-pause", type=float, default=1.0, help="mean pause of a page client between requests, s (default 1)")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs, spread over 2 hosts (default 8)")
    parser.add_argument("--senders", type=int, default=8, help="ingest connections (most requests in flight; default 8)")
    parser.add_argument("--max-rss-slope", type=float, default=5.0, help="bar for (b), MiB/min (default 5)")
    parser.add_argument("--max-p99-factor", type=float, default=1.5, help="bar for (c): last p99 / first p99 (default 1.5)")
    parser.add_argument("--data-dir", type=Path, help="where to make the temporary data dir (default: the system's temp dir)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the raw results as JSON here")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="write the table and verdict as a markdown section here")
    parser.add_argument("--keep", action="store_true", help="keep the data dir and the server log")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    if args.minutes < 1 or args.rate <= 0 or args.page_clients < 0 or args.gpus < 1 or args.senders < 1:
        parser.error("--minutes ≥ 1, --rate > 0, --gpus ≥ 1, --senders ≥ 1 and --page-clients ≥ 0, please")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "bench/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    duration = args.minutes * 60
    # Minutes in each window of (b) and (c): 5 (as the issue says), or half of what follows the warm-up on a short run.
    window = 5.0 if args.minutes >= 10 else (args.minutes - WARMUP_MINUTES) / 2
    if args.data_dir:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tracedash-soak-", dir=args.data_dir))
    log("encoding request bodies…")
    templates, trace_id = build_templates(args.seed)
    server = Server(work / "server")
    record = Record()
    result: dict = {"command": command, "check": {}}
    password = secrets.token_urlsafe(12)
    try:
        log("starting `manage.py serve`…")
        server.start()
        server.manage("shell", "-c", f"from django.contrib.auth import get_user_model; "
                                     f"get_user_model().objects.create_user({USERNAME!r}, password={password!r})")
        key = server.manage("create_project", PROJECT, "--member", USERNAME).strip().splitlines()[-1]

        up = min(90.0, 0.15 * duration)
        down = up + max(0.30 * duration, 80.0)
        urls = page_urls(trace_id)
        log(f"soak: {args.minutes:g} min on {server.base} (pid {server.proc.pid}, data {work}): "
            f"{args.rate:,.0f} spans/s open loop in {BATCH:,}-span native JSON batches "
            f"({args.rate / BATCH:.1f} req/s, up to {args.senders} in flight); {args.page_clients} logged-in page "
            f"clients over {len(urls)} URLs (pause ~{args.page_pause:g} s); {args.gpus} GPUs on {len(HOSTS)} hosts "
            f"every 1 s, {HOSTS[0]} GPU 0 memory ≥ 85 % from {up:.0f} s to {down:.0f} s; a row per minute")

        start_epoch = time.time() + 0.5
        start = time.monotonic() + 0.5
        end = start + duration
        ingest = Ingest(server.port, key, templates, rate=args.rate, start=start, end=end, senders=args.senders,
                        record=record)
        gpus = Gpus(server.port, key, args.gpus, start=start, end=end, up=up, down=down, record=record)
        resource_marks: list[tuple[float, int]] = []  # (t, resource rows acknowledged so far)

        def resource_rows_by(t: float) -> int:
            before = [rows for at, rows in resource_marks if at <= t]
            return before[-1] if before else 0

        clients = [threading.Thread(target=page_client, args=(n, server.port, password, urls),
                                    kwargs=dict(end=end, pause=args.page_pause, trace_ready=ingest.first_acked,
                                                record=record), name=f"soak-pages-{n}", daemon=True)
                   for n in range(args.page_clients)]
        ingest.start_threads()
        gpus.thread.start()
        for thread in clients:
            thread.start()

        headers_printed = False
        printed = 0
        tick = 0
        while True:
            due = start + tick * RSS_SECONDS
            if due > end + 0.5:
                break
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            tick += 1
            now, server_rss = time.monotonic(), rss_parts(server.proc.pid)  # one read of the server's /proc
            record.rss.append((now, server_rss["total"], rss_bytes()))
            record.rss_parts.append((now, server_rss["anon"], server_rss["file"]))
            if (tick - 1) % round(SAMPLE_SECONDS / RSS_SECONDS):
                continue
            resource_rows = gpus.rows_acknowledged  # read before /healthz: the writer has at least these
            try:
                health = server.health()
            except Exception as exc:  # noqa: BLE001 - a slow or failed /healthz is reported, the soak goes on
                record.errors.append((time.monotonic(), "healthz", "/healthz", type(exc).__name__))
                continue
            now = time.monotonic()
            resource_marks.append((now, resource_rows))
            record.samples.append((now, server.rss_bytes(), rss_bytes(), health["checks"]["ingest"],
                                   health["checks"]["clickhouse"].get("active_parts"), list(record.firing),
                                   _memory_figures(health)))
            minute = int((now - start + 0.5) // 60)
            if minute > printed and minute <= math.ceil(args.minutes):
                if not headers_printed:
                    print(live_line(LIVE_HEADERS), flush=True)
                    headers_printed = True
                for row in minute_rows(record, start, minute, resource_rows_by)[printed:]:
                    print(live_line(_cells(row)), flush=True)
                printed = minute
        ingest.join()
        for thread in clients:
            thread.join(timeout=130)
        gpus.thread.join(timeout=130)
        minutes = max(1, math.ceil(args.minutes - 1e-9))
        rows = minute_rows(record, start, minutes, resource_rows_by, open_end=True)
        headers, text_rows = render_table(rows)
        print("\nper minute (final; the last minute includes requests that finished after the end):",
              table(headers, text_rows), FOOTNOTE, sep="\n", flush=True)

        # Figures of the run.
        acknowledged = sum(s for _, s, _, _ in record.ingest)
        on_time = sum(s for done, s, _, _ in record.ingest if done <= end + ON_TIME_GRACE_SECONDS)
        ingest_latencies = sorted(x for _, _, x, _ in record.ingest)
        lateness = sorted(x for _, _, _, x in record.ingest)
        rss_window = [(t - start, rss / MiB) for t, rss, _ in record.rss if t - start >= duration - window * 60]
        slope, error = slope_per_minute(rss_window)
        floor_slope, floor_error = slope_per_minute(floor_points(rss_window))
        # The same window's RSS split: anonymous memory (heaps: where a leak shows) and mapped files' pages.
        by_kind = {kind: slope_per_minute([(t - start, sample[i] / MiB) for t, *sample in record.rss_parts
                                           if t - start >= duration - window * 60])
                   for i, kind in enumerate(("anon", "file"))}

        def pages_between(lo_min: float, hi_min: float) -> list[float]:
            return sorted(x for t, _, status, x in record.pages if lo_min * 60 <= t - start < hi_min * 60)

        first = pages_between(WARMUP_MINUTES, WARMUP_MINUTES + window)
        last = pages_between(args.minutes - window, args.minutes + 1)
        by_url: dict[str, list[float]] = {}
        for _, name, _, x in record.pages:
            by_url.setdefault(name, []).append(x)
        errors = Counter(str(what) for *_, what in record.errors)
        result.update(
            settings={"minutes": args.minutes, "rate": args.rate, "batch": BATCH, "page_clients": args.page_clients,
                      "page_pause": args.page_pause, "gpus": args.gpus, "senders": args.senders,
                      "max_rss_slope": args.max_rss_slope, "max_p99_factor": args.max_p99_factor, "window_minutes": window,
                      "gpu_memory_up_s": up, "gpu_memory_down_s": down},
            machine=machine(), started_at=datetime.fromtimestamp(start_epoch, timezone.utc).isoformat(timespec="seconds"),
            acknowledged=acknowledged, minutes=rows,
            ingest={"planned_spans": ingest.planned * BATCH, "requests": len(record.ingest), "on_time_spans": on_time,
                    "spans_per_s": on_time / duration,
                    "p50_ms": ms(percentile(ingest_latencies, 50)), "p99_ms": ms(percentile(ingest_latencies, 99)),
                    "late_p99_ms": ms(percentile(lateness, 99)), "late_max_ms": ms(percentile(lateness, 100))},
            memory={"from_minute": max(0.0, args.minutes - window), "to_minute": args.minutes, "slope_mib_per_min": slope,
                    "slope_error": error, "floor_slope_mib_per_min": floor_slope, "floor_slope_error": floor_error,
                    "floor_slice_s": FLOOR_SLICE_SECONDS,
                    "anon_slope_mib_per_min": by_kind["anon"][0], "anon_slope_error": by_kind["anon"][1],
                    "file_slope_mib_per_min": by_kind["file"][0], "file_slope_error": by_kind["file"][1],
                    "rss_first_mib": rss_window[0][1] if rss_window else 0,
                    "rss_last_mib": rss_window[-1][1] if rss_window else 0,
                    "rss_max_mib": max((s[1] for s in record.rss), default=0) / MiB,
                    "samples": len(rss_window), "every_s": RSS_SECONDS},
            latency={"first_window": [WARMUP_MINUTES, WARMUP_MINUTES + window], "last_window": [args.minutes - window, args.minutes],
                     "first_requests": len(first), "last_requests": len(last),
                     "first_p99_ms": None if not first else percentile(first, 99) * 1000,
                     "last_p99_ms": None if not last else percentile(last, 99) * 1000,
                     "first_p50_ms": None if not first else percentile(first, 50) * 1000,
                     "last_p50_ms": None if not last else percentile(last, 50) * 1000},
            pages={name: {"requests": len(xs), "p50_ms": round(percentile(sorted(xs), 50) * 1000, 1),
                          "p99_ms": round(percentile(sorted(xs), 99) * 1000, 1)} for name, xs in by_url.items()},
            resources={"requests": len(record.resources), "rows": gpus.rows_acknowledged},
            errors={"total": sum(errors.values()), "by_status": dict(errors),
                    "by_kind_status": dict(Counter(f"{kind} {what} {status}" for _, kind, what, status in record.errors))},
            samples=[{"t": round(t - start, 1), "server_rss_mib": round(a / MiB, 1), "client_rss_mib": round(b / MiB, 1),
                      "active_parts": parts, **{k: ing[k] for k in ("queued_rows", "spool_bytes", "rows_stored", "rows_spooled")},
                      **memory}
                     for t, a, b, ing, parts, _, memory in record.samples],
            rss=[[round(t - start, 1), round(a / MiB, 1), round(b / MiB, 1)] for t, a, b in record.rss],  # t, server, client
            rss_parts=[[round(t - start, 1), round(a / MiB, 1), round(f / MiB, 1)] for t, a, f in record.rss_parts],  # t, anon, file
            # every page request (t done, page, status, latency s): what was being answered when the RSS peaked
            page_requests=[[round(t - start, 2), name, status, round(latency, 3)] for t, name, status, latency in record.pages],
        )

        log("reading the alert history…")
        try:
            result["alerts"] = json.loads(server.manage("shell", "-c", ALERTS_SCRIPT % PROJECT).strip().splitlines()[-1])
        except (RuntimeError, ValueError, IndexError) as exc:
            result["alerts"] = {}
            log(f"  could not read the alerts: {exc}")
        log("waiting for the server's queue and spool to drain…")
        drained = wait_drained(server)
        result["drained"] = drained
        log("stopping the server (SIGINT)…")
        exit_code = server.stop()
        log("counting stored spans in a separate process…")
        counted = stored_count(server)
        result["check"] = {**counted, "server_exit": exit_code}
    except BaseException as exc:
        log(f"\nserver log (last lines, {server.log_path}):\n{server.log_tail()}")
        result["check_error"] = f"{type(exc).__name__}: {exc}"
        args.keep = True
        if "settings" not in result:
            raise
    finally:
        server.stop()

    checks = verdict(result, args)
    result["verdict"] = checks
    ok = all(c["ok"] for c in checks)
    page_lines = [f"  {name}: {v['requests']} requests, p50 {v['p50_ms']:,.0f} ms, p99 {v['p99_ms']:,.0f} ms"
                  for name, v in sorted(result["pages"].items(), key=lambda kv: -kv[1]["p99_ms"])]
    alert_lines = alerts_summary(result.get("alerts", {}), start_epoch, up, down)
    info = result["machine"]
    machine_line = (f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}, "
                    f"{info.get('memory_gib', '?')} GiB RAM" + (f", cgroup CPU limit {info['cgroup_cpu_limit']}"
                                                                if "cgroup_cpu_limit" in info else ""))
    print("\npages (whole run, slowest p99 first):", *page_lines, sep="\n")
    print(*alert_lines, sep="\n")
    print(f"resource samples: {result['resources']['rows']:,} rows in {result['resources']['requests']:,} requests")
    print(machine_line)
    print("\nverdict:")
    for c in checks:
        print(f"  {'PASS' if c['ok'] else 'FAIL'} {c['criterion']}: {c['detail']}")
    print(f"soak: {'PASS' if ok else 'FAIL'}", flush=True)

    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if args.markdown:
        headers, text_rows = render_table(result["minutes"])
        section = [f"### Soak run of {result['started_at'][:16].replace('T', ' ')} UTC", "",
                   f"`.venv/bin/python {command.strip()}` — {args.minutes:g} min, {args.rate:,.0f} spans/s in "
                   f"{BATCH:,}-span native JSON batches, {args.page_clients} page clients, {args.gpus} fake GPUs on "
                   f"{len(HOSTS)} hosts; one `manage.py serve` on the embedded defaults.", "",
                   markdown_table(headers, text_rows), "", FOOTNOTE, "",
                   "| criterion | result | detail |", "| --- | --- | --- |",
                   *[f"| {c['criterion']} | {'**PASS**' if c['ok'] else '**FAIL**'} | {c['detail']} |" for c in checks], "",
                   "Pages over the whole run:", "", *[f"- {line.strip()}" for line in page_lines], "",
                   *[("- " + line.strip()) if line.startswith("  ") else line for line in alert_lines], "",
                   machine_line + ".", ""]
        args.markdown.write_text("\n".join(section))
    if args.keep:
        log(f"kept {work} (server log {server.log_path})")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
