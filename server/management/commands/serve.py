"""``python manage.py serve``: what ``make run`` runs.

Applies both migrations (Django's and ClickHouse's), makes sure a local admin account and a first
project exist (printing the credentials once, on first start), starts the in-process beat when no
broker is configured, and serves the ASGI app with uvicorn until Ctrl-C.

Ctrl-C (SIGINT) or SIGTERM stops in this order, every time:

1. the demo workload stops and its SDK exporter sends its last spans, while the server still serves;
2. the server stops accepting, and answers the requests it has (each after its rows are stored);
3. the ingest writer writes what is queued, the replayer stops between spool segments;
4. the in-process beat starts no new task and the running one finishes;
5. the embedded ClickHouse (chdb) is closed once, after the last call into it has returned;
6. "tracedash: stopped." is printed and the process ends. With the embedded store it ends with
   ``os._exit`` once all of the above is done: chdb's C++ background threads (merges) are still
   alive then, and the interpreter's normal teardown destroying chdb's globals under them is what
   used to crash (a segmentation fault after "stopped.").

A second Ctrl-C while the demo flushes stops the server without waiting for it (a third does not
wait for open connections either). During the final steps a Ctrl-C is answered with a note (they
are bounded); another one ends the process at once.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading

import uvicorn
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from store import StoreError, get_store

log = logging.getLogger("tracedash.serve")
DEMO_KEY_NAME = "demo (make run)"


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
        notes = _StopNotes()
        try:
            if workers == 1:
                from ingest.writer import get_writer

                writer = get_writer()  # replays at once whatever a previous run left in the spool
                if writer.spool.pending():
                    self.stdout.write(f"tracedash: replaying {writer.spool.pending()} spooled batch(es) into ClickHouse")
            if settings.ENV.embedded_beat and settings.CELERY_BEAT_SCHEDULE:
                from config.celery import app
                from server.embedded_beat import EmbeddedBeat

                beat = EmbeddedBeat(app, settings.CELERY_BEAT_SCHEDULE)
                beat.start()
            demo = self._start_demo(host, port) if settings.ENV.demo and embedded else None
            shown = f"[{host}]" if ":" in host else host
            self.stdout.write(self.style.SUCCESS(f"tracedash: serving on http://{shown}:{port}/  (Ctrl-C stops)"))
            self.stdout.flush()
            if workers > 1:
                uvicorn.run("config.asgi:application", host=host, port=port, workers=workers, lifespan="off",
                            log_level="info", proxy_headers=True, access_log=False)
            else:
                config = uvicorn.Config(_asgi_app(), host=host, port=port, lifespan="off", log_level="info",
                                        proxy_headers=True, access_log=False)
                server = _Server(config, before_stop=demo.stop if demo is not None else None, out=self.stdout)
                # uvicorn puts this handler back when it returns: no Ctrl-C can then fall between
                # the server's end and the steps below as a KeyboardInterrupt.
                previous = signal.signal(signal.SIGINT, notes) if _main_thread() else None
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
            clean = self._shutdown(demo=demo, beat=beat, writer=writer, store=store, notes=notes)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if embedded:
            # chdb's C++ background threads outlive every close; letting the interpreter tear down
            # its globals under them is what crashed. Everything is stored and closed by now.
            _exit(0 if clean and not failed else 1)
        if failed:
            raise CommandError(f"could not serve on {host}:{port}")

    def _shutdown(self, *, demo, beat, writer, store, notes) -> bool:
        """The orderly end (see the module docstring); True when every step finished cleanly."""
        previous = signal.signal(signal.SIGINT, notes) if _main_thread() else None
        clean = True
        try:
            if demo is not None:
                demo.stop()  # normally done already, before the server stopped
            if beat is not None:
                beat.request_stop()  # winds down while the writer drains
            if writer is not None:
                from ingest.writer import stop_writer

                clean &= stop_writer()  # writes what is queued (or spools it) before the store closes
            if beat is not None:
                clean &= beat.stop()
            _wait_for_alert_deliveries()
            if not store.close():
                clean = False
                self.stderr.write("tracedash: a ClickHouse call was still running after 60 s; "
                                  "stopping without closing the store")
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        self.stdout.write("tracedash: stopped." if clean else "tracedash: stopped (not cleanly, see above).")
        self.stdout.flush()
        return clean

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


def _wait_for_alert_deliveries(timeout: float = 30.0) -> None:
    """Let notifications being sent finish (the process ends with os._exit, which would not wait
    for them; one cut off is retried at the next start, as its row says it was not sent)."""
    services = sys.modules.get("alerts.services")
    pool = getattr(services, "_pool", None)
    if pool is None:
        return
    waiter = threading.Thread(target=pool.shutdown, kwargs={"wait": True}, name="tracedash-alert-wait", daemon=True)
    waiter.start()
    waiter.join(timeout)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _exit(code: int) -> None:
    """Flush what was written, then end the process without the interpreter's teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class _Server(uvicorn.Server):
    """uvicorn's single-process server with tracedash's stop: the first Ctrl-C (or SIGTERM) runs
    ``before_stop`` (the demo's stop and flush) in a thread while the server goes on serving, then
    the server stops. The signal is not re-raised afterwards (uvicorn's own handler does that, and
    the KeyboardInterrupt it turns into could cut the orderly shutdown short)."""

    def __init__(self, config, *, before_stop=None, out=None):
        super().__init__(config)
        self.before_stop = before_stop
        self.out = out
        self._stop_thread: threading.Thread | None = None

    def handle_exit(self, sig, frame):
        if self._stop_thread is None and self.before_stop is not None:
            self._stop_thread = threading.Thread(target=self._stop_after, name="tracedash-stop", daemon=True)
            self._stop_thread.start()
            return
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a third Ctrl-C: do not wait for open connections
        self.should_exit = True

    def _stop_after(self):
        try:
            if self.out is not None:
                self.out.write("tracedash: stopping: the demo sends its last spans, then the server stops…")
                self.out.flush()
            self.before_stop()
        except Exception:  # noqa: BLE001 - the server must stop regardless
            log.exception("stopping the demo failed")
        finally:
            self.should_exit = True


class _StopNotes:
    """SIGINT once the server has stopped and the final steps run: say what is happening (they are
    bounded); a second one ends the process at once. Before that, a plain KeyboardInterrupt."""

    def __init__(self):
        self.stopping = False
        self.count = 0

    def __call__(self, sig, frame):
        if not self.stopping:
            raise KeyboardInterrupt
        self.count += 1
        if self.count >= 2:
            _exit(130)
        try:
            os.write(2, b"tracedash: still stopping: writing queued spans and closing ClickHouse "
                        b"(Ctrl-C again ends at once)\n")
        except OSError:
            pass
