"""Ctrl-C on `make run` under load: every stop is orderly (exit code 0, never a crash), every
acknowledged span is stored exactly once, and the demo's last spans reach the server before it
stops. Also the pieces of that order on their own: the embedded store's close, the beat's stop,
the demo simulator's port, and the slow-query log."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.spans import llm_trace
from tests.test_serve import ROOT, Server, _free_port

ROUNDS = 5


class _Load:
    """Concurrent ingest clients posting batches until stopped; remembers what was acknowledged."""

    def __init__(self, base: str, key: str, *, clients: int = 4, traces_per_batch: int = 40):
        self.base, self.key, self.traces_per_batch = base, key, traces_per_batch
        self.acked: list[tuple[str, str]] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self):
        while not self._stop.is_set():
            spans = [span for _ in range(self.traces_per_batch) for span in llm_trace()]
            request = urllib.request.Request(
                self.base + "/api/v1/traces", data=json.dumps({"spans": spans}).encode(),
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    answer = json.load(response)
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                time.sleep(0.05)  # refused (stopping or stopped) or cut off: not acknowledged
                continue
            assert answer == {"accepted": len(spans), "rejected": []}, answer
            with self._lock:
                self.acked += [(span["trace_id"], span["span_id"]) for span in spans]
                self.requests += 1

    def start(self):
        for thread in self._threads:
            thread.start()
        return self

    def wait_for(self, requests: int, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while self.requests < requests:
            assert time.monotonic() < deadline, f"only {self.requests} ingest requests answered in {timeout:.0f} s"
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(150)


def _stored_span_counts(server: Server) -> dict[tuple[str, str], int]:
    """(trace_id, span_id) -> stored rows, read by a separate process (the server is stopped)."""
    code = ("import json; from store import get_store; "
            "rows = get_store().query('SELECT trace_id, span_id, count() FROM spans GROUP BY trace_id, span_id', "
            "tag='tests.shutdown').rows; print(json.dumps(rows), flush=True); "
            "import os; os._exit(0)")  # not the interpreter's teardown under chdb's threads (see serve)
    out = server.manage("shell", "-c", code)
    return {(trace, span): count for trace, span, count in json.loads(out.strip().splitlines()[-1])}


def _health(server: Server) -> dict:
    try:
        with urllib.request.urlopen(server.base + "/healthz", timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        return json.load(exc)


def test_ctrl_c_under_load_stops_cleanly_and_keeps_every_acknowledged_span(tmp_path):
    data_dir = tmp_path / "var"
    port = _free_port()
    simulator_port = _free_port()
    acked: list[tuple[str, str]] = []
    key = None
    for round_no in range(ROUNDS):
        server = Server(data_dir, port)
        server.env.update(TRACEDASH_INGEST_RATE_LIMIT="0", PYTHONFAULTHANDLER="1",
                          TRACEDASH_DEMO_SIMULATOR_PORT=str(simulator_port))
        server.start()
        try:
            if key is None:
                key = re.search(r"ingest key \(shown once\): (td_\S+)", server.output()).group(1)
            assert f"LLM simulator on http://127.0.0.1:{simulator_port}" in server.output()
            load = _Load(server.base, key).start()
            try:
                load.wait_for(requests=10 * (round_no + 1) // 2 + 5)  # well into the load, a bit further each round
            finally:
                code = server.interrupt()  # Ctrl-C mid-load
                load.stop()
        except BaseException:
            if server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait(30)
            raise
        acked += load.acked
        output = server.output()
        assert code == 0, f"round {round_no}: exit code {code}\n{output[-5000:]}"
        assert "tracedash: stopped." in output, output[-5000:]
        assert "Fatal Python error" not in output and "Segmentation fault" not in output, output[-5000:]
        # The demo stopped first: its exporter's last spans reached the still-running server.
        assert "gave up sending" not in output and "Connection refused" not in output, output[-5000:]

    # One more start replays anything spooled; then every acknowledged span is there exactly once.
    server = Server(data_dir, port)
    server.env.update(TRACEDASH_DEMO="0")
    server.start()
    try:
        deadline = time.monotonic() + 120
        while _health(server)["checks"]["ingest"]["spooled_segments"]:
            assert time.monotonic() < deadline, "the spool did not drain within 120 s"
            time.sleep(0.5)
    finally:
        assert server.interrupt() == 0, server.output()[-5000:]
    stored = _stored_span_counts(server)
    assert len(acked) == len(set(acked)) > 0
    missing = [span for span in acked if span not in stored]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged spans are not stored"
    twice = {span: n for span, n in stored.items() if n != 1}
    assert not twice, f"{len(twice)} spans are stored more than once"


def test_a_taken_demo_simulator_port_is_named_and_the_server_serves_without_the_demo(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(tmp_path / "var", _free_port())
        server.env.update(TRACEDASH_DEMO_SIMULATOR_PORT=str(port))
        server.start()
        try:
            output = server.output()
            assert (f"tracedash: no demo workload: the demo's LLM simulator cannot listen on 127.0.0.1:{port}"
                    in output), output
            assert "TRACEDASH_DEMO_SIMULATOR_PORT" in output and "DemoError" not in output and "OSError" not in output
        finally:
            code = server.interrupt()
    assert code == 0, server.output()
    assert "tracedash: stopped." in server.output()


def test_a_taken_server_port_is_named_and_the_exit_is_orderly(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = Server(tmp_path / "var", taken.getsockname()[1])
        server.env.update(TRACEDASH_DEMO="0")
        done = subprocess.run([sys.executable, "manage.py", "serve"], cwd=ROOT, env=server.env, capture_output=True,
                              text=True, timeout=180)
    assert done.returncode == 1, done.stderr
    assert f"tracedash: could not serve on 127.0.0.1:{server.port}" in done.stderr
    assert "tracedash: stopped." in done.stdout and "SystemExit" not in done.stderr


def test_the_simulator_cli_names_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "demo.simulator", "--port", str(port)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"simulator: cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_start_demo_raises_demo_error_for_a_taken_port():
    from demo.runner import DemoError, start_demo

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DemoError, match=rf"127\.0\.0\.1:{port}.*TRACEDASH_DEMO_SIMULATOR_PORT"):
            start_demo(endpoint="http://127.0.0.1:9", api_key="td_x", loop=False, simulator_port=port)


# --- the pieces -------------------------------------------------------------------------------
@pytest.mark.clickhouse
def test_embedded_close_waits_for_running_calls_then_refuses_new_ones(settings):
    import secrets

    from store import StoreUnavailable
    from store.backends import EmbeddedBackend
    from store.client import Store

    if settings.TRACEDASH_CLICKHOUSE is not None:
        pytest.skip("the embedded backend is not the configured store in this run")
    store = Store(EmbeddedBackend(settings.TRACEDASH_CLICKHOUSE_PATH, f"tracedash_t_{secrets.token_hex(4)}"))
    store.query("SELECT 1", tag="tests.warm")  # this thread's connection
    finished = {}

    def slow():
        finished["value"] = store.query("SELECT sleep(2), 7", tag="tests.slow").rows[0][1]

    worker = threading.Thread(target=slow)
    worker.start()
    deadline = time.monotonic() + 60
    while store.backend._active == 0:  # until the slow call is inside chdb
        assert time.monotonic() < deadline
        time.sleep(0.01)
    began = time.monotonic()
    assert store.close(timeout=60) is True
    assert time.monotonic() - began > 0.5  # close() waited for the running call ...
    worker.join(30)
    assert finished["value"] == 7  # ... which was answered, not cut off
    with pytest.raises(StoreUnavailable, match="closed"):
        store.query("SELECT 1", tag="tests.after_close")
    assert store.close() is True  # a second close is a no-op
    store.backend.reopen()
    try:
        assert store.query("SELECT 2", tag="tests.reopened").scalar() == 2
    finally:
        store.command(f"DROP DATABASE IF EXISTS `{store.database}`", tag="tests.drop")
        store.close()


class _FakeTask:
    def __init__(self, started: threading.Event, release: threading.Event, calls: list):
        self.started, self.release, self.calls = started, release, calls

    def apply(self, args=(), kwargs=None, throw=True):
        self.calls.append(time.monotonic())
        self.started.set()
        self.release.wait(10)


class _FakeApp:
    def __init__(self, tasks):
        self.tasks = tasks

        class Loader:
            def import_default_modules(self):
                pass

        self.loader = Loader()


def test_beat_stop_waits_for_the_running_task_and_starts_no_other():
    from server.embedded_beat import EmbeddedBeat

    started, release, calls = threading.Event(), threading.Event(), []
    app = _FakeApp({"a": _FakeTask(started, release, calls), "b": _FakeTask(threading.Event(), release, calls)})
    beat = EmbeddedBeat(app, {"first": {"task": "a", "schedule": 60.0}, "second": {"task": "b", "schedule": 60.0}})
    beat.start()
    assert started.wait(10)
    beat.request_stop()
    threading.Timer(0.5, release.set).start()
    began = time.monotonic()
    assert beat.stop(timeout=30) is True
    assert time.monotonic() - began >= 0.3  # it waited for the running task
    assert len(calls) == 1  # and did not start the second one


# --- slow-query log ---------------------------------------------------------------------------
class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_slow_reads_are_summed_up_once_a_minute_per_tag(caplog):
    from store.client import SlowQueryLog

    clock = _Clock()
    slow = SlowQueryLog(read_ms=1000, write_ms=5000, clock=clock)
    with caplog.at_level(logging.INFO, logger="tracedash.store"):
        slow.record("read", "panel.latency", 900)  # under the threshold
        slow.record("write", "ingest.writer.spans", 4000)  # writes have their own, higher threshold
        assert caplog.records == []
        for elapsed in (1200, 1500, 3000, 1100):
            slow.record("read", "panel.latency", elapsed)
            clock.now += 5
        slow.record("read", "alerts.fetch", 1300)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2  # the first of each tag at once, the rest counted
        assert lines[0].startswith("slow ClickHouse read from panel.latency took 1200 ms")
        assert caplog.records[0].levelno == logging.INFO
        clock.now += 60
        slow.record("read", "alerts.fetch", 12_000)  # a minute on: the pending summary is written
        lines = [r.getMessage() for r in caplog.records]
        assert "3 slow ClickHouse reads from panel.latency in the last minute, max 3000 ms (threshold 1000 ms)" in lines
        assert any(line.startswith("slow ClickHouse read from alerts.fetch took 12000 ms") for line in lines)
        assert caplog.records[-1].levelno == logging.WARNING or caplog.records[-2].levelno == logging.WARNING
        slow.record("write", "ingest.writer.spans", 6000)
        slow.record("write", "ingest.writer.spans", 7000)
        slow.flush()  # at close: what is counted is written
        assert caplog.records[-1].getMessage() == (
            "1 slow ClickHouse writes from ingest.writer.spans in the last minute, max 7000 ms (threshold 5000 ms)")
        assert len(caplog.records) == 6


def test_a_zero_threshold_turns_the_slow_log_off(caplog):
    from store.client import SlowQueryLog

    slow = SlowQueryLog(read_ms=0, write_ms=0)
    with caplog.at_level(logging.INFO, logger="tracedash.store"):
        slow.record("read", "x", 10**6)
        slow.record("write", "x", 10**6)
    assert caplog.records == []


def test_the_store_takes_its_slow_query_thresholds_from_settings(settings):
    import dataclasses

    from store.client import store_from_settings

    settings.ENV = dataclasses.replace(settings.ENV, slow_query_ms=250, slow_write_ms=0)
    store = store_from_settings()  # opens nothing until the first query
    assert (store.slow_log.read_ms, store.slow_log.write_ms) == (250, 0)


def test_slow_query_thresholds_come_from_the_environment(tmp_path):
    from config.env import ConfigError, load

    env = {"TRACEDASH_DATA_DIR": str(tmp_path), "TRACEDASH_SLOW_QUERY_MS": "250", "TRACEDASH_SLOW_WRITE_MS": "0",
           "TRACEDASH_DEMO_SIMULATOR_PORT": "8100"}
    loaded = load(env)
    assert (loaded.slow_query_ms, loaded.slow_write_ms, loaded.demo_simulator_port) == (250, 0, 8100)
    defaults = load({"TRACEDASH_DATA_DIR": str(tmp_path)})
    assert (defaults.slow_query_ms, defaults.slow_write_ms, defaults.demo_simulator_port) == (1000, 5000, 0)
    with pytest.raises(ConfigError, match="TRACEDASH_SLOW_QUERY_MS"):
        load({**env, "TRACEDASH_SLOW_QUERY_MS": "fast"})
    with pytest.raises(ConfigError, match="TRACEDASH_DEMO_SIMULATOR_PORT"):
        load({**env, "TRACEDASH_DEMO_SIMULATOR_PORT": "70000"})
