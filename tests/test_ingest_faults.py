"""The fault test: under continuous load, ClickHouse goes away for a while and the server is
killed (SIGKILL) after acknowledging; afterwards every acknowledged span is stored exactly once.

The clients behave like an OTLP exporter or the SDK: a request that got no answer is sent again
until it is acknowledged.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import wait_until
from tests.test_serve import PRODUCTION_VARIABLES, ROOT, _free_port



def batch(n_traces: int = 20, *, spans_per_trace: int = 5, name: str = "step",
          prompt: str | None = "hello " * 200) -> tuple[bytes, set[tuple[str, str]]]:
    """A native batch of ``n_traces`` fresh traces (a root and its children, one per phase) and
    their (trace_id, span_id) pairs."""
    now = time.time_ns()
    phases = ["other", "network", "preprocess", "inference", "postprocess"]
    spans, ids = [], set()
    for _ in range(n_traces):
        trace_id, root = secrets.token_hex(16), secrets.token_hex(8)
        for i in range(spans_per_trace):
            span_id = root if i == 0 else secrets.token_hex(8)
            span = {"trace_id": trace_id, "span_id": span_id, "parent_span_id": None if i == 0 else root,
                    "name": f"{name}-{i}", "phase": phases[i % len(phases)], "start_time": now - 10**9,
                    "duration_ms": 10.0 + i}
            if prompt is not None:
                span["attributes"] = {"gen_ai.prompt": prompt}
            spans.append(span)
            ids.add((trace_id, span_id))
    return json.dumps({"spans": spans}).encode(), ids


def stored_spans(env: dict, tag: str = "tests.faults") -> tuple[list[tuple[str, str]], int]:
    """(trace_id, span_id) of every span in ``spans FINAL`` and the raw row count, read by a
    separate process from the data dir of ``env`` (chdb: one process per data path, so only once
    the server has stopped)."""
    count = subprocess.run([sys.executable, "-c", (
        "import django, json; django.setup(); from store import get_store; s = get_store();"
        f"ids = s.query('SELECT trace_id, span_id FROM spans FINAL', tag={tag!r}).rows;"
        f"raw = s.query('SELECT count() FROM spans', tag={tag!r}).scalar();"
        "print(json.dumps({'ids': ids, 'raw': raw}))")], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True, text=True, check=True)
    stored = json.loads(count.stdout.strip().splitlines()[-1])
    return [tuple(pair) for pair in stored["ids"]], stored["raw"]


class Server:
    def __init__(self, data_dir, outage_file, port):
        self.env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
        self.env.update(TRACEDASH_DATA_DIR=str(data_dir), PORT=str(port), PYTHONUNBUFFERED="1",
                        TRACEDASH_TEST_OUTAGE_FILE=str(outage_file), TRACEDASH_INGEST_RATE_LIMIT="0",
                        TRACEDASH_BEAT_SAMPLE_SECONDS="3600", TRACEDASH_DEMO="0")
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(data_dir.parent / f"server-{time.time_ns()}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "tests/support/serve_with_outages.py"], cwd=ROOT, env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, open(self.log.name).read()
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # answering (503 while ClickHouse is "down")
            except OSError:
                time.sleep(0.2)
        raise AssertionError("server did not start")

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(self.base + "/healthz", timeout=5) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            return json.load(exc)


def test_outage_and_kill_lose_nothing_acknowledged(tmp_path):
    data_dir = tmp_path / "var"
    outage = tmp_path / "outage"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION_VARIABLES}
    env["TRACEDASH_DATA_DIR"] = str(data_dir)
    server = Server(data_dir, outage, port)  # migrates the metadata DB on start
    key = subprocess.run([sys.executable, "manage.py", "create_project", "faults"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]

    acknowledged: set[tuple[str, str]] = set()
    retried_spans = 0
    stop = threading.Event()
    lock = threading.Lock()

    def client():
        nonlocal retried_spans
        while not stop.is_set():
            body, ids = batch()
            attempt = 0
            while True:  # resend until acknowledged, as exporters do
                request = urllib.request.Request(server.base + "/api/v1/traces", data=body, headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        assert json.load(response)["accepted"] == len(ids)
                    with lock:
                        acknowledged.update(ids)
                        retried_spans += len(ids) if attempt else 0
                    break
                except (OSError, urllib.error.HTTPError):
                    attempt += 1
                    time.sleep(0.2)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)  # normal operation
        outage.touch()  # ClickHouse goes away: acknowledgements now come from the spool
        time.sleep(2)
        health = server.health()
        assert health["checks"]["clickhouse"]["ok"] is False
        assert health["checks"]["ingest"]["spooled_segments"] > 0
        with lock:
            before_kill = len(acknowledged)
        server.proc.send_signal(signal.SIGKILL)  # killed after acknowledging spooled data
        server.proc.wait(10)
        outage.unlink()  # ClickHouse is back
        server = Server(data_dir, outage, port)  # restarts on the same data dir and replays
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:  # each finishes the batch it holds, resending it until acknowledged
            t.join(300)
    assert not any(t.is_alive() for t in threads), "a client still had a batch unacknowledged after 300 s"
    assert before_kill > 0

    def drained() -> bool:
        ingest = server.health()["checks"]["ingest"]
        return ingest["spooled_segments"] == 0 and ingest["queued_rows"] == 0

    wait_until(drained, timeout=300, interval=0.2, message="the restarted server to drain its spool")
    ingest = server.health()["checks"]["ingest"]
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(60) == 0

    ids, raw = stored_spans(env)
    stored_ids = set(ids)
    assert len(ids) == len(stored_ids)  # no duplicates after FINAL
    missing, unknown = acknowledged - stored_ids, stored_ids - acknowledged
    logs = "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in sorted(tmp_path.glob("server-*.log")))
    # Nothing acknowledged was lost, nothing unknown appeared.
    assert not missing and not unknown, (f"{len(missing)} of {len(acknowledged)} acknowledged spans are not stored, "
                                         f"{len(unknown)} stored spans were never acknowledged; the restarted "
                                         f"server's ingest counters: {ingest}\n{logs}")
    # Rows beyond the unique ones can only come from requests resent because they got no answer.
    assert raw - len(stored_ids) <= retried_spans
