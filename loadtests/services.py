"""Writes for load test runs, and starting them from the page."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import threading
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config.db_retry import retry_locked
from projects.models import Project

from .models import LoadTestKey, LoadTestRun

log = logging.getLogger("tracedash.loadtests")

LOAD_TEST_KEY_NAME = "load tests"
# The load tests key's secret is HMAC-SHA256(SECRET_KEY, KEY_DERIVATION_LABEL + nonce), the nonce
# random per key and kept in its LoadTestKey row (load_test_key_ensure).
KEY_DERIVATION_LABEL = "tracedash-loadtest-key:"
LOAD_TEST_KEY_NONCE_BYTES = 16
# A run started from the page writes its progress about once a second; one silent this long had
# its server stopped under it, and no longer blocks the project's next run.
HEARTBEAT_STALE = timedelta(minutes=2)


class LoadTestBusy(Exception):
    """The project already has a load test running (one at a time per project)."""

    def __init__(self, run: LoadTestRun):
        self.run = run
        super().__init__(f"a load test is already running in this project (run {run.run_id}, started "
                         f"{run.created_at:%Y-%m-%d %H:%M:%S} UTC); wait for it to finish")


def load_test_run_create(*, project: Project, run_id: str, test_type: str, target_url: str,
                         config: dict) -> LoadTestRun:
    return LoadTestRun.objects.create(project=project, run_id=run_id, test_type=test_type, target_url=target_url,
                                      config=config)


def load_test_run_finish(*, run: LoadTestRun, report: dict) -> LoadTestRun:
    run.report = report
    run.status = LoadTestRun.Status.COMPLETED
    run.finished_at = timezone.now()
    run.save(update_fields=["report", "status", "finished_at"])
    return run


def load_test_run_fail(*, run: LoadTestRun, error: str, interrupted: bool = False) -> LoadTestRun:
    run.status = LoadTestRun.Status.INTERRUPTED if interrupted else LoadTestRun.Status.FAILED
    run.error = error[:5000]
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "finished_at"])
    return run


def load_test_run_progress(*, run_pk: int, progress: dict) -> None:
    """Record a running run's live counters (and so its heartbeat); the last one is the final count
    the page shows, so a write that meets SQLite's lock is retried, not lost."""
    retry_locked(lambda: LoadTestRun.objects.filter(pk=run_pk, status=LoadTestRun.Status.RUNNING).update(
        progress=progress, heartbeat_at=timezone.now()))


def _load_test_key_secret(nonce: str) -> str:
    """The secret part of the load tests key with ``nonce``: HMAC-SHA256 of the server's
    SECRET_KEY over ``KEY_DERIVATION_LABEL + nonce``, its first ``KEY_SECRET_BYTES`` bytes in
    URL-safe base64 (the length and alphabet of a random key's secret)."""
    from projects.services import KEY_SECRET_BYTES

    digest = hmac.new(settings.SECRET_KEY.encode(), (KEY_DERIVATION_LABEL + nonce).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:KEY_SECRET_BYTES]).decode().rstrip("=")


@transaction.atomic
def load_test_key_ensure(*, project: Project) -> str:
    """The plaintext of the project's "load tests" ingest key: created once (with
    ``projects.services.api_key_create``, so it is listed and revocable on Settings like any key)
    and reused by every run; a revoked or deleted one is replaced by a fresh one.

    Nothing usable is stored: the row keeps a random nonce and the key keeps only its hash, and
    the plaintext is derived again from SECRET_KEY and the nonce each time. When SECRET_KEY has
    changed the derived key no longer matches the hash: that key is revoked (whoever holds the old
    SECRET_KEY could derive it) and a fresh one made."""
    from projects.services import api_key_create, api_key_revoke, api_key_with_secret

    Project.objects.select_for_update().filter(pk=project.pk).first()  # one creator at a time per project
    held = LoadTestKey.objects.select_related("api_key").filter(project=project).first()
    if held is not None and held.api_key.revoked_at is None:
        raw = api_key_with_secret(key=held.api_key, secret=_load_test_key_secret(held.nonce))
        if raw is not None:
            return raw
        log.warning("the load tests key td_%s_… of project %s no longer matches (SECRET_KEY changed?): "
                    "revoked, and a fresh one made", held.api_key.prefix, project.pk)
        api_key_revoke(key=held.api_key)
    nonce = secrets.token_hex(LOAD_TEST_KEY_NONCE_BYTES)
    key, raw = api_key_create(project=project, name=LOAD_TEST_KEY_NAME, secret=_load_test_key_secret(nonce))
    if held is None:
        LoadTestKey.objects.create(project=project, api_key=key, nonce=nonce)
    else:
        held.api_key, held.nonce = key, nonce
        held.save(update_fields=["api_key", "nonce"])
    return raw


def load_test_run_expire_if_stale(*, run: LoadTestRun, now=None) -> bool:
    """Mark a page-started run interrupted if it still says running but its heartbeat stopped (its
    server was stopped under it). Returns whether it did."""
    if run.status != LoadTestRun.Status.RUNNING or run.config.get("source") != "page":
        return False  # `manage.py loadtest` runs have no heartbeat: they run beside the server
    last = run.heartbeat_at or run.created_at
    if (now or timezone.now()) - last <= HEARTBEAT_STALE:
        return False
    load_test_run_fail(run=run, error="the server stopped while the load test ran", interrupted=True)
    return True


def _running_run(project: Project) -> LoadTestRun | None:
    """The project's page-started run that is still going, if any (stale ones are expired here)."""
    for run in LoadTestRun.objects.filter(project=project, status=LoadTestRun.Status.RUNNING).defer("report"):
        if run.config.get("source") == "page" and not load_test_run_expire_if_stale(run=run):
            return run
    return None


def load_test_start(*, project: Project, options: dict, trace_endpoint: str) -> LoadTestRun:
    """Start a load test from the page (``options``: the cleaned ``LoadTestStartForm`` data).

    One at a time per project (``LoadTestBusy`` otherwise). The run goes on in the background:
    a thread of the serving process when embedded, a Celery task in production. Its requests are
    traced to ``trace_endpoint`` with the project's "load tests" key."""
    from tracedash_sdk.loadtest import new_run_id

    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()  # serialises concurrent starts
        busy = _running_run(project)
        if busy is not None:
            raise LoadTestBusy(busy)
        target_url = options["target_url"] if options["target"] == "url" else "built-in simulator"
        config = {"source": "page", **{k: v for k, v in options.items() if k != "target_api_key"}}
        run = LoadTestRun.objects.create(project=project, run_id=new_run_id(), test_type=options["test_type"],
                                         target_url=target_url, config=config, heartbeat_at=timezone.now())
        # The target's own key (if any) is passed to the runner, never stored with the run.
        secret = options.get("target_api_key") or None
        transaction.on_commit(lambda: _dispatch(run.pk, trace_endpoint, secret))
    return run


def _dispatch(run_pk: int, trace_endpoint: str, target_api_key: str | None) -> None:
    if settings.CELERY_TASK_ALWAYS_EAGER:  # embedded: no broker, so not a task (it would run right here)
        from .runner import load_test_execute_in_thread

        threading.Thread(target=load_test_execute_in_thread, name=f"loadtest-{run_pk}", daemon=True,
                         kwargs={"run_pk": run_pk, "trace_endpoint": trace_endpoint,
                                 "target_api_key": target_api_key}).start()
    else:
        from .tasks import load_test_run_task

        load_test_run_task.delay(run_pk, trace_endpoint, target_api_key)
