"""Reads for projects: what a user may see."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import Project


def projects_for_user(*, user) -> QuerySet[Project]:
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user).order_by("name")


def project_for_user(*, user, project_id) -> Project | None:
    """The project if ``user`` is a member of it, else None (same answer for "absent")."""
    try:
        project_id = int(project_id)
    except (TypeError, ValueError):
        return None
    return projects_for_user(user=user).filter(pk=project_id).first()
