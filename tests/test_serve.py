"""`make run`'s command end to end, as a user meets it: first start, a project created beside the
running server, spans posted, the traces page after logging in, Ctrl-C, and a second start that
reuses the data. Runs in a subprocess on its own data dir with the embedded defaults."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.spans import llm_trace

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION_VARIABLES = ("TRACEDASH_CLICKHOUSE_URL", "DATABASE_URL", "CELERY_BROKER_URL", "TRACEDASH_CHANNEL_LAYER_URL",
                        "DJANGO_SETTINGS_MODULE", "TRACEDASH_SECRET_KEY")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir: Path, port: int):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
        self.env.update(TRACEDASH_DATA_DIR=str(data_dir), PORT=str(port), PYTHONUNBUFFERED="1")
        self.log = data_dir.parent / f"serve-{port}-{time.time_ns()}.log"

    def start(self):
        self.handle = open(self.log, "w")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "serve"], cwd=ROOT, env=self.env,
                                     stdout=self.handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited early:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        raise AssertionError(f"serve did not answer /healthz within 90 s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text()

    def interrupt(self, timeout: float = 180) -> int:
        """Ctrl-C; the exit code. The orderly stop (demo flush, writer drain, a running beat task,
        closing ClickHouse) is bounded but slow on a loaded machine: a generous ceiling."""
        self.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            raise AssertionError(f"serve did not stop within {timeout:.0f} s of Ctrl-C:\n{self.output()[-5000:]}")
        finally:
            self.handle.close()

    def manage(self, *args) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout


def _login(opener, base, username, password):
    opener.open(base + "/login/").read()
    jar = next(h for h in opener.handlers if isinstance(h, urllib.request.HTTPCookieProcessor)).cookiejar
    token = next(c.value for c in jar if c.name == "csrftoken")
    data = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": token}).encode()
    request = urllib.request.Request(base + "/login/", data=data, headers={"Referer": base + "/login/"})
    with opener.open(request) as response:
        assert response.url == base + "/", response.url  # logged in: the overview


@pytest.fixture
def server_dir(tmp_path):
    return tmp_path / "var"


def _json(opener, url: str) -> dict:
    with opener.open(url) as response:
        return json.load(response)


def _engine_moving(engines: dict) -> bool:
    """The simulator's instances: a KV cache taking at least two values with requests running, and
    the queue moving — requests seen waiting, or the engine's queue-time P95 changing (its histogram
    counts every request that waited, where the waiting gauge is only what a scrape happened to see
    of the demo's short rushes)."""
    kv_moving = queue_moving = False
    for instance in engines.get("instances", []):
        if instance["engine"] != "vllm":
            continue
        values = instance["values"]
        kv = [v for v in values["kv_cache_usage"] if v is not None]
        running = [v for v in values["requests_running"] if v is not None]
        waiting = [v for v in values["requests_waiting"] if v is not None]
        queue = [v for v in values["queue_p95_ms"] if v is not None]
        kv_moving |= len(set(kv)) >= 2 and max(kv) > 0 and max(running, default=0) > 0 and bool(waiting)
        queue_moving |= max(waiting, default=0) > 0 or len(set(queue)) >= 2
    return kv_moving and queue_moving


def _cache_shown(overview: dict) -> bool:
    stats = (overview.get("cache") or {}).get("stats") or {}
    return bool(stats.get("hits")) and stats.get("hit_rate") and stats.get("latency_saved_ms") is not None


def _int8_against_fp16(variants: dict) -> dict | None:
    """INT8's differences from FP16 on the Variants JSON, once it shows INT8 faster (E2E P50, each
    with its interval, significant), on hosts with less GPU memory (significant) and with a lower
    judge's quality (with its interval); else None (not enough of the demo's traffic yet)."""
    if variants.get("values") != ["fp16", "int8"]:
        return None
    rows = {f["metric"]: f["differences"][1] for f in variants["figures"]}
    quality = next((s for s in variants["scores"] if s["name"] == "quality"), None)
    if quality is None:
        return None
    rows["quality"] = quality["figures"][0]["differences"][1]
    e2e, memory, judged = rows["E2E P50"], rows["GPU memory"], rows["quality"]
    if all(d and d["difference"] is not None and d["low"] is not None and d["high"] is not None
           for d in (e2e, memory, judged)) and e2e["significant"] and memory["significant"] \
            and e2e["high"] < 0 and memory["high"] < 0 and judged["difference"] < 0:
        return rows
    return None


def _differences(variants: dict) -> dict:
    """The Variants JSON's INT8-against-FP16 differences, short enough to read in a failure."""
    rows = {f["metric"]: f["differences"][1:] for f in variants.get("figures", [])
            if f["metric"] in ("E2E P50", "GPU memory")}
    rows.update({s["name"]: s["figures"][0]["differences"][1:] for s in variants.get("scores", [])})
    keep = ("difference", "low", "high", "significant")
    return {"values": variants.get("values"),
            **{name: [d and {k: d.get(k) for k in keep} for d in ds] for name, ds in rows.items()}}


def test_make_run_serves_the_slice_and_restarts_on_the_same_data(server_dir):
    started = time.monotonic()
    server = Server(server_dir, _free_port()).start()
    try:
        first = server.output()
        match = re.search(r"username: (\S+)\s+password: (\S+)", first)
        assert match, first
        username, password = match.groups()
        assert "ingest key (shown once): td_" in first
        assert "embedded chdb" in first and "sqlite3" in first

        # Commands beside the running server need no ClickHouse, so they work while it serves.
        created = server.manage("create_project", "shop", "--member", username).strip().splitlines()
        project_id = int(re.search(r"\(id (\d+)\)", created[0]).group(1))
        key = created[-1]
        spans = llm_trace(name="served-request")
        request = urllib.request.Request(server.base + "/api/v1/traces", data=json.dumps({"spans": spans}).encode(),
                                         headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response) == {"accepted": 5, "rejected": []}

        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        _login(opener, server.base, username, password)
        # The explorer lists summarised traces; the summariser runs on the in-process beat schedule.
        deadline = time.monotonic() + 60
        while spans[0]["trace_id"] not in (html := opener.open(f"{server.base}/traces/?project={project_id}").read().decode()):
            assert time.monotonic() < deadline, "the posted trace is not on /traces/ after 60 s"
            time.sleep(1)
        assert "served-request" in html
        assert opener.open(server.base + "/static/tracedash/app.css").status == 200
        # The demo workload (on by default) fills the first project with traces within a minute.
        assert "demo workload sending traces to project 'default'" in server.output()
        deadline = time.monotonic() + 60
        while "POST /v1/chat" not in opener.open(f"{server.base}/traces/?project=1").read().decode():
            assert time.monotonic() < deadline, "no demo trace on /traces/ after 60 s"
            time.sleep(1)
        # ... and the in-process sampler shows the local machine's CPU and memory.
        while 'data-gpu="-1"' not in opener.open(f"{server.base}/resources/?project=1").read().decode():
            assert time.monotonic() < deadline, "no local CPU/memory sample on /resources/ after 60 s"
            time.sleep(1)
        # ... and the demo's two variants' simulated GPU hosts beside it (docs/demo.md).
        while not (">demo-gpu-fp16</option>" in (resources := opener.open(f"{server.base}/resources/?project=1").read().decode())
                   and ">demo-gpu-int8</option>" in resources):
            assert time.monotonic() < deadline, "the demo's GPU hosts are not on /resources/ after 60 s"
            time.sleep(1)
        # Within two minutes of the start: the Engines page shows the demo simulator's queue and KV cache
        # (its vLLM-style /metrics, scraped by the in-process sampler) moving with the demo's load ...
        deadline = started + 120
        while not _engine_moving(engines := _json(opener, f"{server.base}/engines/series.json?project=1&range=15m")):
            assert time.monotonic() < deadline, f"the simulator's queue and KV cache do not move after 2 min: {engines}"
            time.sleep(2)
        # ... and the overview shows the demo's semantic cache: its hit rate and the latency a hit saved.
        while not _cache_shown(overview := _json(opener, f"{server.base}/overview.json?project=1&range=15m")):
            assert time.monotonic() < deadline, f"no cache hit rate and latency saved after 2 min: {overview.get('cache')}"
            time.sleep(2)
        # ... and the Variants view puts the demo's INT8 beside its FP16: faster and on less GPU memory
        # (each difference with its 95 % interval, significant), with a lower judged quality. About a
        # minute here, idle or with the CPUs saturated; the ceiling is for a far slower machine.
        deadline = started + 600
        url = f"{server.base}/variants.json?project=1&range=15m&key=llm.quantization&value=fp16&value=int8"
        while not (shown := _int8_against_fp16(variants := _json(opener, url))):
            assert time.monotonic() < deadline, \
                f"INT8 not shown faster, smaller and lower-scored after 10 min: {_differences(variants)}"
            time.sleep(5)
        assert variants["hosts"] == {"fp16": ["demo-gpu-fp16"], "int8": ["demo-gpu-int8"]}, variants["hosts"]
    finally:
        code = server.interrupt()
    assert code == 0, server.output()
    assert "tracedash: stopped." in server.output()

    again = Server(server_dir, server.port).start()
    try:
        second = again.output()
        assert "password:" not in second and "log in as 'admin'" in second  # the account is reused
        assert "No ClickHouse migrations to apply" in second
        # The session cookie still works (the secret key persisted) and the data is still there.
        html = opener.open(f"{again.base}/traces/?project={project_id}").read().decode()
        assert spans[0]["trace_id"] in html
    finally:
        assert again.interrupt() == 0, again.output()


def test_serve_refuses_several_workers_on_the_embedded_store(server_dir):
    server = Server(server_dir, _free_port())
    done = subprocess.run([sys.executable, "manage.py", "serve", "--workers", "3"], cwd=ROOT, env=server.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "embedded ClickHouse store can be opened by one process only" in done.stderr
