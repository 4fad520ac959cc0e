"""Reads for load test runs: always through the user's projects."""

from __future__ import annotations

from django.db.models import QuerySet

from projects.selectors import projects_for_user

from .models import LoadTestRun


def load_test_runs_for_project(*, project_id: int, limit: int = 100) -> QuerySet[LoadTestRun]:
    return LoadTestRun.objects.filter(project_id=project_id).defer("report", "config")[:limit]


def load_test_run_for_user(*, user, run_pk: int) -> LoadTestRun | None:
    """The run if ``user`` is a member of its project, else None (same answer for "absent")."""
    return LoadTestRun.objects.filter(pk=run_pk, project__in=projects_for_user(user=user)).select_related(
        "project").first()
