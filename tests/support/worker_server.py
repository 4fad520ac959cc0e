"""One subprocess that is both a web server and a real Celery worker, for worker tests over Redis.

Why: the embedded ClickHouse (chdb) opens a data directory from ONE process only, so a Celery
worker cannot share the pytest process's store. This process owns its own data dir (chdb) and its
own SQLite file, serves the ASGI app with uvicorn in a thread (so the test ingests over HTTP and
reads pages), and runs a Celery worker (``--pool threads``) in the main thread that consumes one
queue of a Redis broker, with Celery beat embedded (``-B``) running the entries you choose from
``CELERY_BEAT_SCHEDULE``.

Usage (``python tests/support/worker_server.py --help``):

    python tests/support/worker_server.py --broker redis://127.0.0.1:6379/5 --queue q-<uuid> \
        --beat alerts-evaluate --setup tests.alerts_support:alerts_project \
        --setup-json '{"webhook_url": "http://127.0.0.1:PORT/hook"}'

Environment: whatever the caller passes (e.g. ``TRACEDASH_ALERTS_EVALUATE_SECONDS=1``); this
script sets ``TRACEDASH_DATA_DIR`` (``--data-dir``, default a fresh temp dir), ``DATABASE_URL``
(SQLite in the data dir: never the caller's database), ``CELERY_BROKER_URL`` (``--broker``) and
``TRACEDASH_DEMO=0``. ``--beat none`` runs no beat: the caller sends tasks itself, e.g. with
``tests.support.worker_server.send_task(broker, queue, "alerts.tasks.evaluate")``.

It prints, one per line, once ready (read them with ``WorkerServer`` below):
``WORKER_SERVER_SETUP=<json returned by the setup function>`` then ``WORKER_SERVER_URL=http://…``.
Django and ClickHouse migrations run at start. SIGTERM stops the worker (warm shutdown) and the
server.

``WorkerServer`` (context manager) starts it from a test, waits for the URL, and stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", required=True, help="redis://host:port/db (use a DB number of your own)")
    parser.add_argument("--queue", required=True, help="a queue name unique to this run")
    parser.add_argument("--beat", default="none", help="comma-separated CELERY_BEAT_SCHEDULE entries to run, or none")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--setup", default=None, help="module:function called after migrations with **setup-json")
    parser.add_argument("--setup-json", default="{}")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = _parse(argv)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="tracedash-worker-")
    os.environ["TRACEDASH_DATA_DIR"] = data_dir
    os.environ["DATABASE_URL"] = f"sqlite:///{data_dir}/worker.sqlite3"
    os.environ["CELERY_BROKER_URL"] = args.broker
    os.environ["TRACEDASH_DEMO"] = "0"
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    sys.path.insert(0, str(ROOT))

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    call_command("migrate_clickhouse", verbosity=0)

    setup_result = {}
    if args.setup:
        module, _, function = args.setup.partition(":")
        import importlib

        setup_result = getattr(importlib.import_module(module), function)(**json.loads(args.setup_json))
    print("WORKER_SERVER_SETUP=" + json.dumps(setup_result), flush=True)

    from config.celery import app

    wanted = [] if args.beat == "none" else [name.strip() for name in args.beat.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in settings.CELERY_BEAT_SCHEDULE]
    if unknown:
        raise SystemExit(f"unknown beat entries {unknown}; known: {sorted(settings.CELERY_BEAT_SCHEDULE)}")
    app.conf.beat_schedule = {name: settings.CELERY_BEAT_SCHEDULE[name] for name in wanted}
    app.conf.task_default_queue = args.queue
    app.conf.task_always_eager = False

    import uvicorn

    from config.asgi import application

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(application, lifespan="off", log_level="warning"))
    web = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="worker-server-web", daemon=True)
    web.start()
    while not server.started:
        if not web.is_alive():
            raise SystemExit("uvicorn did not start")
        time.sleep(0.02)
    print(f"WORKER_SERVER_URL=http://127.0.0.1:{sock.getsockname()[1]}", flush=True)

    worker_argv = ["worker", "--pool", "threads", "--concurrency", str(args.concurrency), "--queues", args.queue,
                   "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--hostname", f"{args.queue}@%h"]
    if wanted:
        worker_argv += ["--beat", "--schedule", str(Path(data_dir) / "celerybeat-schedule")]
    try:
        app.worker_main(argv=worker_argv)
    finally:
        server.should_exit = True
        web.join(10)
        from ingest.writer import stop_writer
        from store import get_store

        stop_writer()
        get_store().close()


def redis_up(url: str) -> bool:
    """Whether a Redis server answers at ``url``."""
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001 - any failure: no broker to test against
        return False


def start_redis_server(port: int):
    """A throwaway ``redis-server`` on 127.0.0.1:``port`` (nothing saved), once it accepts
    connections; the caller kills it."""
    import socket
    import subprocess

    from tests.conftest import wait_until

    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_until(up, timeout=20, message="redis-server up")
    return proc


def requires_redis(url: str):
    """A pytest mark for tests that need the Redis at ``url``: skipped where none runs, but a
    failure under CI (``TRACEDASH_REQUIRE_SERVICES=1``, set by .ci/run), so a real-worker test can
    never silently stop running there."""
    import pytest

    if redis_up(url):
        return pytest.mark.usefixtures()
    if os.environ.get("TRACEDASH_REQUIRE_SERVICES"):
        raise RuntimeError(f"no Redis at {url}, and TRACEDASH_REQUIRE_SERVICES is set")
    return pytest.mark.skip(reason=f"no Redis at {url}")


def send_task(broker: str, queue: str, name: str, *args, **kwargs):
    """Send a task by name to the worker's queue over the broker, from any process."""
    from celery import Celery

    client = Celery("tracedash-test-client", broker=broker)
    try:
        return client.send_task(name, args=args, kwargs=kwargs, queue=queue)
    finally:
        client.close()


class WorkerServer:
    """Starts ``worker_server.py`` as a subprocess; ``url`` and ``setup`` once ready; ``log()``."""

    def __init__(self, *, broker: str, queue: str, beat: str = "none", setup: str | None = None,
                 setup_kwargs: dict | None = None, env: dict | None = None, timeout: float = 120.0):
        self.broker, self.queue, self.timeout = broker, queue, timeout
        self.data_dir = tempfile.mkdtemp(prefix="tracedash-worker-")
        command = [sys.executable, str(Path(__file__).resolve()), "--broker", broker, "--queue", queue,
                   "--beat", beat, "--data-dir", self.data_dir]
        if setup:
            command += ["--setup", setup, "--setup-json", json.dumps(setup_kwargs or {})]
        child_env = {k: v for k, v in os.environ.items()
                     if k not in ("DATABASE_URL", "TRACEDASH_DATA_DIR", "DJANGO_SETTINGS_MODULE", "TRACEDASH_CLICKHOUSE_URL")}
        child_env.update(env or {})
        self.log_path = Path(self.data_dir) / "worker-server.log"
        self._log = open(self.log_path, "w+b")
        self.command, self.env = command, child_env
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.setup: dict = {}

    def start(self):
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                        stderr=self._log)
        deadline = time.monotonic() + self.timeout
        lines: list[str] = []
        reader = threading.Thread(target=self._read_stdout, args=(lines,), daemon=True)
        reader.start()
        while time.monotonic() < deadline:
            for line in list(lines):
                if line.startswith("WORKER_SERVER_SETUP="):
                    self.setup = json.loads(line.split("=", 1)[1])
                if line.startswith("WORKER_SERVER_URL="):
                    self.url = line.split("=", 1)[1]
                    return self
            if self.process.poll() is not None:
                raise RuntimeError(f"worker server exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"worker server not ready after {self.timeout}s:\n{self.log()}")

    def _read_stdout(self, lines):
        for raw in self.process.stdout:
            lines.append(raw.decode(errors="replace").strip())

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-20000:]

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    main()
