"""``python manage.py demo --traces N``: send N realistic LLM traces through a running server's
ingestion API (never writing to the store behind its back), with a progress bar."""

from __future__ import annotations

import sys
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from projects.models import Project


class Command(BaseCommand):
    help = "Send N demo traces (simulated LLM chat requests) to a running tracedash server."

    def add_arguments(self, parser):
        parser.add_argument("--traces", type=int, default=100)
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--endpoint", default=None, help="server base URL (default: this install's HOST/PORT)")
        parser.add_argument("--api-key", default=None, help="ingest key (default: a new 'demo' key of --project)")
        parser.add_argument("--project", default="default", help="project for the new key when --api-key is not given")
        parser.add_argument("--fast", action="store_true", help="no app-side delays (model delays stay)")

    def handle(self, *args, traces, concurrency, endpoint, api_key, project, fast, **options):
        from demo.runner import start_demo

        if traces < 1 or concurrency < 1:
            raise CommandError("--traces and --concurrency must be at least 1")
        endpoint = endpoint or f"http://{settings.ENV.host if settings.ENV.host not in ('0.0.0.0', '::') else '127.0.0.1'}:{settings.ENV.port}"
        if api_key is None:
            target = Project.objects.filter(name=project).first()
            if target is None:
                raise CommandError(f"no project named {project!r}; create it with `manage.py create_project {project}`")
            from projects.services import api_key_create

            _, api_key = api_key_create(project=target, name="demo command")
        demo = start_demo(endpoint=endpoint, api_key=api_key, loop=False, pace=0.0 if fast else 1.0)
        done = 0
        lock = threading.Lock()
        started = time.monotonic()

        def worker(count: int) -> None:
            nonlocal done
            for _ in range(count):
                demo.app.handle_request()
                with lock:
                    done += 1

        shares = [traces // concurrency + (1 if i < traces % concurrency else 0) for i in range(concurrency)]
        threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in shares if n]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                _progress(done, traces, started)
                time.sleep(0.2)
            _progress(done, traces, started)
            sys.stderr.write("\n")
            flushed = demo.tracer.flush(timeout=30.0)
        finally:
            demo.stop()
        stats = demo.tracer.exporter.stats
        self.stdout.write(
            f"Sent {done} traces to {endpoint} in {time.monotonic() - started:.1f}s: "
            f"{stats.get('spans_sent', 0)} spans accepted, {stats.get('spans_dropped', 0)} dropped, "
            f"{demo.app.stats.errors} failed requests, {demo.app.stats.retries} retries.")
        if not flushed or stats.get("spans_dropped", 0) or stats.get("batches_failed", 0):
            raise CommandError("some spans did not reach the server (is it running? is the key valid?)")


def _progress(done: int, total: int, started: float) -> None:
    width = 30
    filled = int(width * done / total)
    rate = done / max(time.monotonic() - started, 1e-6)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} traces  {rate:5.1f}/s")
    sys.stderr.flush()
