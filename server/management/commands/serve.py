"""``python manage.py serve``: what ``make run`` runs.

Applies both migrations (Django's and ClickHouse's), makes sure a local admin account and a first
project exist (printing the credentials once, on first start), starts the in-process beat when no
broker is configured, and serves the ASGI app with uvicorn until Ctrl-C.

``--workers N`` (a ClickHouse server only: embedded chdb is one process's) serves with N worker
processes on one socket, bound here and shared, each with its own group-commit writer
(``server.worker_app``); this process supervises them and runs the one in-process beat (none when
Celery beat runs the schedule).

Ctrl-C (SIGINT) or SIGTERM stops it in a fixed order (``server.shutdown``).
"""

from __future__ import annotations

import faulthandler
import logging
import signal

import uvicorn
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from config import memory
from store import StoreError, get_store

from server.shutdown import DemoFirstServer, StopNotes, hard_exit, main_thread, stop_in_order

log = logging.getLogger("tracedash.serve")
DEMO_KEY_NAME = "demo (make run)"
WORKER_GRACE_SECONDS = 30  # --workers N: how long a stopping worker waits for its open connections


class Command(BaseCommand):
    help = "Apply migrations and serve tracedash (embedded defaults: one process, no other service needed)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.ENV.host)
        parser.add_argument("--port", type=int, default=settings.ENV.port)
        parser.add_argument("--workers", type=int, default=1,
                            help="web worker processes (a ClickHouse server is needed for more than one)")
        parser.add_argument("--no-migrate", action="store_true", help="skip applying migrations")

    def handle(self, *args, host, port, workers, no_migrate, **options):
        if not faulthandler.is_enabled():
            faulthandler.enable()  # a crash in native code prints every Python thread's stack
        memory.limit_arenas()  # the serving threads share two malloc arenas (config.memory)
        embedded = settings.ENV.embedded_store
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        if embedded and workers > 1:
            raise CommandError("the embedded ClickHouse store can be opened by one process only: "
                               "use --workers 1, or set TRACEDASH_CLICKHOUSE_URL to a ClickHouse server")
        store = get_store()
        self.stdout.write(f"tracedash: ClickHouse: {store.describe()}")
        self.stdout.write(f"tracedash: metadata DB: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}"
                          f" ({settings.DATABASES['default']['NAME']})")
        if not no_migrate:
            call_command("migrate", interactive=False, verbosity=0)
            try:
                call_command("migrate_clickhouse", stdout=self.stdout)
            except StoreError as exc:
                raise CommandError(str(exc)) from exc
        if embedded:
            self._ensure_local_admin(host, port)

        writer = beat = demo = previous = None
        failed = False
        notes = StopNotes()
        try:
            if workers == 1:
                from ingest.parse_pool import parse_pool
                from ingest.writer import get_writer

                writer = get_writer()  # replays at once whatever a previous run left in the spool
                if writer.spool.pending():
                    self.stdout.write(f"tracedash: replaying {writer.spool.pending()} spooled batch(es) into ClickHouse")
                pool = parse_pool(settings.TRACEDASH_INGEST_PARSE_PROCESSES)
                if pool is not None:
                    pool.start()
                    self.stdout.write(f"tracedash: {pool.processes} ingest parse worker process(es)")
            if settings.ENV.embedded_beat and settings.CELERY_BEAT_SCHEDULE:
                from config.celery import app
                from server.embedded_beat import EmbeddedBeat

                # The summariser in a thread of its own: a trace's summary must not wait behind a
                # rollup or an alert round.
                beat = EmbeddedBeat(app, settings.CELERY_BEAT_SCHEDULE, own_thread=("traces-summarize",),
                                    nice=settings.ENV.background_nice)
                beat.start()
            demo = self._start_demo(host, port) if settings.ENV.demo and embedded else None
            shown = f"[{host}]" if ":" in host else host
            self.stdout.write(self.style.SUCCESS(f"tracedash: serving on http://{shown}:{port}/  (Ctrl-C stops)"))
            self.stdout.flush()
            if workers > 1:
                failed = not self._serve_workers(host, port, workers)
            else:
                config = uvicorn.Config(_asgi_app(), host=host, port=port, lifespan="off", log_level="info",
                                        proxy_headers=True, access_log=False)
                server = DemoFirstServer(config, before_stop=demo.stop if demo is not None else None, out=self.stdout)
                # uvicorn puts this handler back when it returns: no Ctrl-C can then fall between
                # the server's end and the steps below as a KeyboardInterrupt.
                previous = signal.signal(signal.SIGINT, notes) if main_thread() else None
                try:
                    server.run()
                except SystemExit:  # uvicorn's answer to an address it cannot listen on
                    pass
                finally:
                    notes.stopping = True
                if not server.started:
                    failed = True
                    self.stderr.write(f"tracedash: could not serve on {host}:{port} (see the error above; "
                                      "PORT and HOST choose another address)")
        except KeyboardInterrupt:  # Ctrl-C before the server had started
            pass
        except Exception:
            if not embedded:
                raise
            failed = True  # still stop in order (below) and end without the interpreter's teardown
            log.exception("tracedash: serving failed")
        finally:
            notes.stopping = True
            clean = stop_in_order(demo=demo, beat=beat, store=store, notes=notes,
                                  out=self.stdout, err=self.stderr)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if embedded:
            # chdb's C++ background threads outlive every close; letting the interpreter tear down
            # its globals under them is what crashed. Everything is stored and closed by now.
            hard_exit(0 if clean and not failed else 1)
        if failed:
            raise CommandError(f"could not serve on {host}:{port}")

    def _serve_workers(self, host, port, workers) -> bool:
        """``workers`` processes serving one socket, bound here once and handed to each (uvicorn's
        supervisor, as ``uvicorn --workers`` runs it); each has its own group-commit writer, started
        and stopped by the ASGI lifespan (server.worker_app). Ctrl-C or SIGTERM: every worker stops
        accepting, answers its open requests (at most ``WORKER_GRACE_SECONDS``), flushes its writer
        and ends; then this process stops the beat and returns. False when it could not serve."""
        from uvicorn.config import STARTUP_FAILURE
        from uvicorn.supervisors import Multiprocess

        config = uvicorn.Config("server.worker_app:application", host=host, port=port, workers=workers,
                                lifespan="on", log_level="info", proxy_headers=True, access_log=False,
                                timeout_graceful_shutdown=WORKER_GRACE_SECONDS)
        try:
            sock = config.bind_socket()
        except SystemExit:  # uvicorn's answer to an address it cannot listen on (logged by it)
            self.stderr.write(f"tracedash: could not serve on {host}:{port} (see the error above; "
                              "PORT and HOST choose another address)")
            return False
        supervisor = Multiprocess(config, sockets=[sock])
        try:
            supervisor.run()
        finally:
            sock.close()
        if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
            self.stderr.write("tracedash: a web worker could not start (see the error above)")
            return False
        return True

    def _start_demo(self, host, port):
        """The demo workload (simulated LLM chat service + OpenAI-compatible simulator), sending
        its traces through this server's own ingestion API with a fresh key of the first project."""
        from demo.runner import DemoError, start_demo
        from projects.models import ApiKey, Project
        from projects.services import api_key_create, api_key_revoke

        project = Project.objects.order_by("pk").first()
        if project is None:
            return None
        for old in ApiKey.objects.filter(project=project, name=DEMO_KEY_NAME, revoked_at__isnull=True):
            api_key_revoke(key=old)  # each start makes its own; yesterday's is no longer needed
        _, key = api_key_create(project=project, name=DEMO_KEY_NAME)
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        try:
            demo = start_demo(endpoint=f"http://{'[' + local + ']' if ':' in local else local}:{port}", api_key=key,
                              loop=True, simulator_port=settings.ENV.demo_simulator_port)
        except DemoError as exc:
            api_key_revoke(key=ApiKey.objects.get(project=project, name=DEMO_KEY_NAME, revoked_at__isnull=True))
            self.stderr.write(f"tracedash: no demo workload: {exc}")
            return None
        from agent.tasks import sampler_add, scrape_target_add

        scrape_target_add(f"vllm={demo.simulator.url}/metrics")  # its vLLM-style /metrics, on the Engines page
        for sampler in demo.gpu_samplers:  # each variant's simulated GPU host, on the Resources page
            sampler_add(sampler)
        self.stdout.write(f"tracedash: demo workload sending traces to project {project.name!r} "
                          f"(LLM simulator on {demo.simulator.url}; TRACEDASH_DEMO=0 turns it off)")
        return demo

    def _ensure_local_admin(self, host, port):
        from projects.services import local_admin_ensure

        created = local_admin_ensure()
        name = created["user"].get_username()
        if created["password"]:
            self.stdout.write(self.style.WARNING(
                f"tracedash: created the local admin account — username: {name}  password: {created['password']}\n"
                f"tracedash: (shown once; change it with `python manage.py changepassword {name}`)"))
        else:
            self.stdout.write(f"tracedash: log in as {name!r} (the password was printed at first start; "
                              f"`python manage.py changepassword {name}` sets a new one)")
        if created["key"]:
            self.stdout.write(self.style.WARNING(
                f"tracedash: created project {created['project'].name!r}; its ingest key (shown once): {created['key']}\n"
                "tracedash: (keys, members and projects are managed on Settings, /settings/)"))


def _asgi_app():
    from config.asgi import application

    return application
