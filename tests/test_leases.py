"""Per-project leases (server.leases) on the real metadata database (SQLite by default,
PostgreSQL when DATABASE_URL is set): concurrent runs of one job share the projects, never hold
one at the same time, and a dead holder's lease expires."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from alerts.models import EvaluationLease
from projects.models import Project
from server.leases import lease_name, leases_claim, leases_release, run_by_project

JOB = "test-job"


@pytest.fixture
def projects(db):
    return [Project.objects.create(name=f"lease-{n}").pk for n in range(5)]


def test_claims_share_the_projects_and_a_released_one_is_free_again(projects):
    a = leases_claim(job=JOB, project_ids=projects, holder="a", limit=2)
    b = leases_claim(job=JOB, project_ids=projects, holder="b", limit=2)
    c = leases_claim(job=JOB, project_ids=projects, holder="c", limit=5)
    assert len(a) == 2 and len(b) == 2 and len(c) == 1
    assert sorted(a + b + c) == sorted(projects)
    assert leases_claim(job=JOB, project_ids=projects, holder="d") == []
    assert len(leases_claim(job="another-job", project_ids=projects, holder="d", limit=1)) == 1  # jobs are apart
    leases_release(job=JOB, project_ids=a, holder="someone-else")  # not theirs: nothing changes
    assert leases_claim(job=JOB, project_ids=projects, holder="d") == []
    leases_release(job=JOB, project_ids=a, holder="a", round_ms=12.5)
    assert leases_claim(job=JOB, project_ids=projects, holder="d") == a
    row = EvaluationLease.objects.get(name=lease_name(JOB, a[0]))
    assert row.holder == "d" and row.rounds == 1 and row.last_round_ms == 12.5


def test_a_dead_holders_lease_expires(projects):
    assert leases_claim(job=JOB, project_ids=projects[:1], holder="dead", seconds=60) == projects[:1]
    assert leases_claim(job=JOB, project_ids=projects[:1], holder="alive") == []
    EvaluationLease.objects.filter(name=lease_name(JOB, projects[0])).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert leases_claim(job=JOB, project_ids=projects[:1], holder="alive") == projects[:1]


def test_a_run_skips_held_projects_and_notes_a_failure(projects):
    leases_claim(job=JOB, project_ids=projects[:2], holder="other")
    seen = []
    done = run_by_project(JOB, seen.append, projects, batch=2)
    assert done == projects[2:] and sorted(sum(seen, [])) == projects[2:] and all(len(b) <= 2 for b in seen)

    def fail(batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_by_project(JOB, fail, projects[2:3])
    row = EvaluationLease.objects.get(name=lease_name(JOB, projects[2]))
    assert "RuntimeError: boom" in row.last_error and row.expires_at <= timezone.now()  # released, error noted
    assert leases_claim(job=JOB, project_ids=projects[2:3], holder="next") == projects[2:3]


@pytest.mark.django_db(transaction=True)
def test_concurrent_runs_never_hold_one_project_at_the_same_time():
    ids = [Project.objects.create(name=f"race-{n}").pk for n in range(12)]
    busy: set[int] = set()
    overlaps: list[int] = []
    worked: dict[int, int] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(4)
    errors = []

    def work(batch):
        with lock:
            overlaps.extend(pid for pid in batch if pid in busy)
            busy.update(batch)
        time.sleep(0.01)  # let the other runs claim meanwhile (no assertion depends on the time)
        with lock:
            busy.difference_update(batch)
            for pid in batch:
                worked[pid] = worked.get(pid, 0) + 1

    def runner():
        try:
            barrier.wait(30)
            run_by_project(JOB, work, ids, batch=3)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and not overlaps
    assert set(worked) == set(ids)  # every project was done by some run
    # No project twice at once; done again only by a run that claimed it after the first released it.
    assert EvaluationLease.objects.filter(name__startswith=f"{JOB}:", expires_at__gt=timezone.now()).count() == 0


@pytest.mark.clickhouse
def test_the_summarize_task_leaves_a_held_project_to_its_holder(projects):
    from server.tasks import summarize_traces

    leases_claim(job="traces-summarize", project_ids=projects[:1], holder="another-worker")
    report = summarize_traces()
    assert report["projects"] == len(projects) - 1
    assert EvaluationLease.objects.get(name=lease_name("traces-summarize", projects[0])).holder == "another-worker"
    assert EvaluationLease.objects.get(name=lease_name("traces-summarize", projects[1])).rounds == 1


def test_a_claim_that_meets_a_lock_gives_back_and_tries_again(projects, monkeypatch):
    """SQLite answers "database table is locked" to a read that meets another thread's write (the
    read-back after the UPDATE, say): the claim gives back what it may have taken and tries again,
    instead of leaving the projects to runs that already stopped because it held them."""
    from django.db import OperationalError

    from server import leases

    real = leases._ensure_rows
    calls = []

    def locked_once(names):
        calls.append(1)
        if len(calls) == 2:  # the first claim went through; its retry meets the lock
            raise OperationalError("database table is locked: alerts_evaluationlease")
        return real(names)

    monkeypatch.setattr(leases, "CLAIM_PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(leases, "_ensure_rows", locked_once)
    assert leases_claim(job=JOB, project_ids=projects[:2], holder="a") == sorted(projects[:2])
    leases_release(job=JOB, project_ids=projects[:2], holder="a")
    assert leases_claim(job=JOB, project_ids=projects[:2], holder="b") == sorted(projects[:2])
    assert len(calls) == 3
    monkeypatch.setattr(leases, "CLAIM_ATTEMPTS", 1)
    calls.clear()
    calls.append(1)  # the next call is the second: locked, and no try is left
    assert leases_claim(job=JOB, project_ids=projects[2:], holder="c") == []
    assert leases_claim(job=JOB, project_ids=projects[2:], holder="d") == sorted(projects[2:])  # nothing kept
