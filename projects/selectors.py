"""Reads for projects: what a user may see."""

from __future__ import annotations

from django.db.models import F, QuerySet

from .models import ApiKey, Membership, Project


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


def api_keys_for_project(*, project: Project) -> QuerySet[ApiKey]:
    """The project's ingest keys, active ones first, newest first (never their hashes' use)."""
    return (ApiKey.objects.filter(project=project)
            .only("pk", "project_id", "name", "prefix", "created_at", "revoked_at", "last_used_at")
            .order_by(F("revoked_at").desc(nulls_first=True), "-created_at", "-pk"))


def api_key_for_project(*, project: Project, key_id) -> ApiKey | None:
    """One key of ``project`` by id, or None (another project's key is "absent")."""
    try:
        key_id = int(key_id)
    except (TypeError, ValueError):
        return None
    return ApiKey.objects.filter(project=project, pk=key_id).first()


def memberships_for_project(*, project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user").order_by("user__username")


def membership_for_project(*, project: Project, membership_id) -> Membership | None:
    try:
        membership_id = int(membership_id)
    except (TypeError, ValueError):
        return None
    return Membership.objects.filter(project=project, pk=membership_id).select_related("user").first()
