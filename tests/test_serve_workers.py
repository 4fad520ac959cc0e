"""``manage.py serve --workers N``: N web worker processes on one port, each with its own
group-commit writer, one embedded beat, and an orderly stop of every worker.

The first test runs everywhere: the store is a ClickHouse server address where nothing answers,
so every acknowledged batch goes to its worker's spool, which is then read back (the spool is
what a worker writes to when ClickHouse cannot take the rows). The second needs a ClickHouse
server (``TRACEDASH_TEST_CLICKHOUSE_URL``, e.g. the docker-compose stack's) and checks that every
acknowledged span is stored in ClickHouse exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ingest.spool import Spool
from tests.spans import llm_trace

ROOT = Path(__file__).resolve().parent.parent
NATIVE_URL = os.environ.get("TRACEDASH_TEST_CLICKHOUSE_URL")
WORKERS = 2
TRACES = 24  # of 5 spans each
STOP_SECONDS = 180  # ceilings only: a loaded machine is slow, nothing depends on the time taken


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkersServer:
    def __init__(self, data_dir: Path, clickhouse_url: str):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "TRACEDASH_CHANNEL_LAYER_URL",
                                 "DJANGO_SETTINGS_MODULE", "TRACEDASH_SECRET_KEY")}
        self.env.update(TRACEDASH_DATA_DIR=str(data_dir), TRACEDASH_CLICKHOUSE_URL=clickhouse_url,
                        TRACEDASH_DEMO="0", PORT=str(self.port), PYTHONUNBUFFERED="1")
        self.data_dir = data_dir
        self.log = data_dir.parent / f"serve-workers-{self.port}.log"

    def manage(self, *args) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, *args):
        self.handle = open(self.log, "w")
        # A session of its own: os.killpg sends Ctrl-C to the whole group, as a terminal does.
        self.proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--workers", str(WORKERS), *args],
                                     cwd=ROOT, env=self.env, stdout=self.handle, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited early:\n{self.output()[-5000:]}")
            if len(self.workers_serving()) == WORKERS:
                try:
                    urllib.request.urlopen(self.base + "/healthz", timeout=5).close()
                    return self
                except urllib.error.HTTPError:  # 503 without ClickHouse: still an answer
                    return self
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
            time.sleep(0.3)
        raise AssertionError(f"{WORKERS} workers did not start within 120 s:\n{self.output()[-5000:]}")

    def output(self) -> str:
        return self.log.read_text()

    def workers_serving(self) -> set[str]:
        return set(re.findall(r"tracedash: worker (\d+) serving", self.output()))

    def stop(self, how: str) -> int:
        if how == "ctrl-c":
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGTERM)  # what `docker stop` sends: to the parent only
        try:
            return self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            raise AssertionError(f"serve did not stop within {STOP_SECONDS} s:\n{self.output()[-5000:]}")
        finally:
            self.handle.close()

    def post_traces(self, key: str) -> set[str]:
        """TRACES traces over 4 concurrent connections; the span ids acknowledged."""
        def post(_):
            spans = llm_trace()
            request = urllib.request.Request(self.base + "/api/v1/traces", data=json.dumps({"spans": spans}).encode(),
                                             method="POST", headers={"Content-Type": "application/json",
                                                                     "Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200 and json.load(response)["accepted"] == len(spans)
            return {s["span_id"] for s in spans}

        with ThreadPoolExecutor(4) as pool:
            return set().union(*pool.map(post, range(TRACES)))


def _setup(server: WorkersServer) -> tuple[int, str]:
    """Django's tables (SQLite in the data dir) and a project with an ingest key, in one process."""
    out = server.manage("shell", "-c", "from django.core.management import call_command; "
                        "call_command('migrate', verbosity=0); from projects.services import project_create; "
                        "p, k = project_create(name='workers'); print(p.pk, k)").split()
    return int(out[-2]), out[-1]


def _stopped_workers(output: str) -> dict[str, tuple[int, int]]:
    return {pid: (int(stored), int(spooled)) for pid, stored, spooled in
            re.findall(r"tracedash: worker (\d+) stopped: (\d+) row\(s\) stored, (\d+) spooled", output)}


def test_workers_share_one_port_each_with_its_writer_and_stop_on_ctrl_c(tmp_path):
    with socket.socket() as unreachable:  # bound, never listening: every connection is refused
        unreachable.bind(("127.0.0.1", 0))
        url = f"clickhouse://default@127.0.0.1:{unreachable.getsockname()[1]}/tracedash?connect_timeout=1"
        server = WorkersServer(tmp_path / "var", url)
        _, key = _setup(server)
        server.start("--no-migrate")
        try:
            sent = server.post_traces(key)
        finally:
            code = server.stop("ctrl-c")
    output = server.output()
    assert code == 0, output[-5000:]
    assert "tracedash: stopped." in output
    assert output.count("embedded beat running") == 1  # one beat, in the supervising process
    serving = server.workers_serving()
    stopped = _stopped_workers(output)
    assert len(serving) == WORKERS and set(stopped) == serving, output[-5000:]  # every worker flushed and ended
    # Every acknowledged span is in exactly one worker's spool, once; each worker had a slot of its own.
    spooled_ids: list[str] = []
    slots_with_spans = 0
    for slot in sorted((server.data_dir / "spool").glob("slot-*")):
        spool = Spool(slot, max_bytes=2**30)
        rows = [row for path in spool.segments() for segment in [spool.read(path)] if segment.table == "spans"
                for row in segment.rows]
        slots_with_spans += bool(rows)
        spooled_ids += [row["span_id"] for row in rows]
    assert len(spooled_ids) == len(sent) and set(spooled_ids) == sent
    assert sum(spooled for _, spooled in stopped.values()) == len(sent)
    assert 1 <= slots_with_spans <= WORKERS


@pytest.mark.skipif(not NATIVE_URL, reason="set TRACEDASH_TEST_CLICKHOUSE_URL=clickhouse://user:pass@host:9000/db "
                                           "(a ClickHouse server, e.g. the docker-compose stack's) to run it")
def test_workers_on_a_clickhouse_server_store_every_acknowledged_span_once(tmp_path):
    from config.env import parse_clickhouse_url
    from store import Store
    from store.backends import NativeBackend

    database = f"tracedash_workers_{uuid.uuid4().hex[:10]}"
    base = parse_clickhouse_url(NATIVE_URL, "TRACEDASH_TEST_CLICKHOUSE_URL")
    server = WorkersServer(tmp_path / "var", urlsplit(NATIVE_URL)._replace(path=f"/{database}").geturl())
    project_id, key = _setup(server)
    store = Store(NativeBackend(base, database=database))
    try:
        server.start()  # applies the ClickHouse migrations to the fresh database first
        try:
            sent = server.post_traces(key)
        finally:
            code = server.stop("sigterm")
        output = server.output()
        assert code == 0 and "tracedash: stopped." in output, output[-5000:]
        assert len(_stopped_workers(output)) == WORKERS
        rows = store.query("SELECT span_id, count() AS n FROM spans WHERE project_id = {p:UInt64} GROUP BY span_id",
                           {"p": project_id}, tag="tests.workers.spans").rows
        assert {r[0] for r in rows} == sent and all(int(r[1]) == 1 for r in rows)
    finally:
        store.command(f"DROP DATABASE IF EXISTS `{database}`", tag="tests.workers.drop")
        store.close()
