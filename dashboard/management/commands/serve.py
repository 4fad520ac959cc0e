"""``python manage.py serve``: what ``make run`` runs.

Applies both migrations (Django's and ClickHouse's), makes sure a local admin account and a first
project exist (printing the credentials once, on first start), starts the in-process beat when no
broker is configured, and serves the ASGI app with uvicorn until Ctrl-C.
"""

from __future__ import annotations

import logging

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
        import uvicorn

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

        writer = None
        if workers == 1:
            from ingest.writer import get_writer

            writer = get_writer()  # replays at once whatever a previous run left in the spool
            if writer.spool.pending():
                self.stdout.write(f"tracedash: replaying {writer.spool.pending()} spooled batch(es) into ClickHouse")
        beat = None
        if settings.ENV.embedded_beat and settings.CELERY_BEAT_SCHEDULE:
            from config.celery import app
            from config.embedded_beat import EmbeddedBeat

            beat = EmbeddedBeat(app, settings.CELERY_BEAT_SCHEDULE)
            beat.start()
        demo = self._start_demo(host, port) if settings.ENV.demo and embedded else None
        shown = f"[{host}]" if ":" in host else host
        self.stdout.write(self.style.SUCCESS(f"tracedash: serving on http://{shown}:{port}/  (Ctrl-C stops)"))
        self.stdout.flush()
        try:
            uvicorn.run(
                "config.asgi:application" if workers > 1 else _asgi_app(),
                host=host, port=port, workers=workers if workers > 1 else None,
                lifespan="off", log_level="info", proxy_headers=True, access_log=False,
            )
        finally:
            if demo is not None:
                demo.stop()
            if beat is not None:
                beat.stop()
            if writer is not None:
                from ingest.writer import stop_writer

                stop_writer()  # writes what is queued (or spools it) before the store closes
            store.close()
            self.stdout.write("tracedash: stopped.")

    def _start_demo(self, host, port):
        """The demo workload (simulated LLM chat service + OpenAI-compatible simulator), sending
        its traces through this server's own ingestion API with a fresh key of the first project."""
        from demo.runner import start_demo
        from projects.models import ApiKey, Project
        from projects.services import api_key_create, api_key_revoke

        project = Project.objects.order_by("pk").first()
        if project is None:
            return None
        for old in ApiKey.objects.filter(project=project, name=DEMO_KEY_NAME, revoked_at__isnull=True):
            api_key_revoke(key=old)  # each start makes its own; yesterday's is no longer needed
        _, key = api_key_create(project=project, name=DEMO_KEY_NAME)
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        demo = start_demo(endpoint=f"http://{'[' + local + ']' if ':' in local else local}:{port}", api_key=key, loop=True)
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
                f"tracedash: created project {created['project'].name!r}; its ingest key (shown once): {created['key']}"))


def _asgi_app():
    from config.asgi import application

    return application
