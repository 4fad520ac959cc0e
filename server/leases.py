"""Per-project leases: several Celery workers (or beats) running the same periodic job split its
projects between them, and never work on one project at the same time.

A lease is a row of ``alerts.EvaluationLease`` named ``<job>:<project id>`` (in PostgreSQL or
SQLite, the metadata database every process already shares). A run claims the free leases of a
few projects at a time (``BATCH`` — the least recently served first), works on them, releases
them, and claims the next few; a concurrent run of the same job claims other projects meanwhile,
so the work is shared and no project is done twice. A lease is free when it was released, or when
it expired: a worker that crashed (or was killed) holding one loses it after ``seconds``.

Claiming is one atomic step on both databases:

- PostgreSQL: ``SELECT … FOR UPDATE SKIP LOCKED`` of free rows, then ``UPDATE`` of those rows,
  in one transaction: two workers never wait for each other nor pick the same row;
- SQLite: one conditional ``UPDATE … WHERE name IN (SELECT … LIMIT n) AND <free>``: SQLite runs
  one writer at a time, so the statement sees no concurrent change. A claim that meets the
  database locked by another writer for longer than its busy timeout gives back what it may have
  taken and tries again (``CLAIM_ATTEMPTS``); after the last try it claims nothing (the run does
  nothing this time; the next run tries again).

The holder name is unique per run (host, pid, thread, random suffix), so a run reads back exactly
the rows it took.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from config.db_retry import retry_locked  # a release must not be lost (the lease would wait for its expiry)

log = logging.getLogger("tracedash.leases")

BATCH = 8  # projects claimed at a time: small, so concurrent runs interleave and share the work
LEASE_SECONDS = 120  # a claim not released (crashed holder) is free again after this
# A claim that meets SQLite's lock tries again this many times, this far apart, before the run
# gives up for this time: the runs that found the same projects held meanwhile have stopped.
CLAIM_ATTEMPTS = 20
CLAIM_PAUSE_SECONDS = 0.05


def new_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"


def lease_name(job: str, project_id: int) -> str:
    return f"{job}:{int(project_id)}"


def _model():
    from alerts.models import EvaluationLease

    return EvaluationLease


def _free(now) -> Q:
    return Q(expires_at__isnull=True) | Q(expires_at__lt=now)


def _ensure_rows(names: list[str]) -> None:
    Lease = _model()
    have = set(Lease.objects.filter(name__in=names).values_list("name", flat=True))
    missing = [Lease(name=name) for name in names if name not in have]
    if missing:
        try:
            Lease.objects.bulk_create(missing, ignore_conflicts=True)
        except IntegrityError:  # pragma: no cover - ignore_conflicts covers the race on both databases
            pass


def leases_claim(*, job: str, project_ids: Iterable[int], holder: str, limit: int = BATCH,
                 seconds: float = LEASE_SECONDS) -> list[int]:
    """Take up to ``limit`` free leases of ``job`` among ``project_ids``; the project ids taken."""
    by_name = {lease_name(job, pid): int(pid) for pid in project_ids}
    if not by_name or limit < 1:
        return []
    Lease = _model()
    names = list(by_name)
    for attempt in range(CLAIM_ATTEMPTS):
        now = timezone.now()
        until = now + timedelta(seconds=seconds)
        try:
            _ensure_rows(names)
            if connection.features.has_select_for_update_skip_locked:
                with transaction.atomic():
                    free = list(Lease.objects.select_for_update(skip_locked=True).filter(name__in=names).filter(_free(now))
                                .order_by(F("last_round_at").asc(nulls_first=True), "name")
                                .values_list("name", flat=True)[:limit])
                    if free:
                        Lease.objects.filter(name__in=free).update(holder=holder, expires_at=until)
            else:
                pick = (Lease.objects.filter(name__in=names).filter(_free(now))
                        .order_by(F("last_round_at").asc(nulls_first=True), "name").values("name")[:limit])
                Lease.objects.filter(name__in=pick).filter(_free(now)).update(holder=holder, expires_at=until)
            taken = list(Lease.objects.filter(name__in=names, holder=holder, expires_at=until).values_list("name", flat=True))
        except OperationalError as exc:
            if "locked" not in str(exc):  # SQLite busy past its timeout, or a shared-cache table lock
                raise
            # The UPDATE may have gone through before the read-back failed: give back what it took
            # (another run that found these held meanwhile may have stopped, trusting this one).
            retry_locked(lambda: Lease.objects.filter(name__in=names, holder=holder).update(expires_at=now))
            if attempt == CLAIM_ATTEMPTS - 1:
                log.info("%s: leases busy (%s); nothing claimed", job, exc)
                return []
            time.sleep(CLAIM_PAUSE_SECONDS)
            continue
        return sorted(by_name[name] for name in taken)
    return []


def leases_release(*, job: str, project_ids: Iterable[int], holder: str, round_ms: float | None = None,
                   error: str = "") -> None:
    """Give the leases back (only those this holder still holds), noting the run."""
    names = [lease_name(job, pid) for pid in project_ids]
    if not names:
        return
    now = timezone.now()
    fields = {"expires_at": now, "last_round_at": now, "last_error": error[:2000], "rounds": F("rounds") + 1}
    if round_ms is not None:
        fields["last_round_ms"] = round_ms
    retry_locked(lambda: _model().objects.filter(name__in=names, holder=holder).update(**fields))


def run_by_project(job: str, work: Callable[[list[int]], None], project_ids: Iterable[int] | None = None, *,
                   holder: str | None = None, batch: int = BATCH, seconds: float = LEASE_SECONDS) -> list[int]:
    """One run of ``job``: ``work(project_ids)`` on each claimed batch of projects (default: every
    project), each batch released after ``work`` returned (or raised: the error is noted on its
    leases and raised). A project another run holds is left to it; each comes at most once per
    run. Returns the projects this run worked on."""
    if project_ids is None:
        from projects.models import Project

        project_ids = list(Project.objects.order_by("pk").values_list("pk", flat=True))
    remaining = [int(pid) for pid in project_ids]
    holder = holder or new_holder()
    done: list[int] = []
    while remaining:
        taken = leases_claim(job=job, project_ids=remaining, holder=holder, limit=batch, seconds=seconds)
        if not taken:
            break
        claimed = set(taken)
        remaining = [pid for pid in remaining if pid not in claimed]
        started = time.perf_counter()
        error = ""
        try:
            work(taken)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            leases_release(job=job, project_ids=taken, holder=holder, round_ms=(time.perf_counter() - started) * 1000,
                           error=error)
        done += taken
    return done
