"""Writes for load test runs."""

from __future__ import annotations

from django.utils import timezone

from projects.models import Project

from .models import LoadTestRun


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
