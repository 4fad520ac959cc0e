"""Writes for projects, members and keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from .models import ApiKey, Membership, Project

KEY_PREFIX_BYTES = 6  # 12 hex characters
KEY_SECRET_BYTES = 24  # 192 bits of entropy


def _hash_key(raw_key: str) -> str:
    # Keys are long random strings, so a plain SHA-256 is enough (no password-style stretching).
    return hashlib.sha256(raw_key.encode()).hexdigest()


def api_key_create(*, project: Project, name: str = "default") -> tuple[ApiKey, str]:
    """Create a key; returns the row and the plaintext key, which is never stored."""
    while True:
        prefix = secrets.token_hex(KEY_PREFIX_BYTES)
        if not ApiKey.objects.filter(prefix=prefix).exists():
            break
    raw = f"td_{prefix}_{secrets.token_urlsafe(KEY_SECRET_BYTES)}"
    key = ApiKey.objects.create(project=project, name=name, prefix=prefix, key_hash=_hash_key(raw))
    return key, raw


def api_key_revoke(*, key: ApiKey) -> None:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The active key matching ``raw_key``, or None. Revocation takes effect at once."""
    parts = raw_key.split("_", 2)
    if len(parts) != 3 or parts[0] != "td" or len(parts[1]) != KEY_PREFIX_BYTES * 2:
        return None
    key = ApiKey.objects.select_related("project").filter(prefix=parts[1], revoked_at__isnull=True).first()
    if key is None:
        _hash_key(raw_key)  # same work on a miss, so timing does not reveal valid prefixes
        return None
    if not hmac.compare_digest(key.key_hash, _hash_key(raw_key)):
        return None
    return key


@transaction.atomic
def project_create(*, name: str, owner=None) -> tuple[Project, str]:
    """Create a project with one ingest key; returns the project and the plaintext key."""
    project = Project.objects.create(name=name)
    if owner is not None:
        Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
    _, raw = api_key_create(project=project)
    return project, raw


def membership_add(*, project: Project, user, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.get_or_create(project=project, user=user, defaults={"role": role})
    return membership


def local_admin_ensure(*, username: str = "admin") -> dict:
    """The embedded first start: an admin account and a first project it belongs to.

    Returns what was created, for printing once: ``{"user", "password", "project", "key"}`` where
    password/project/key are None when they already existed."""
    User = get_user_model()
    created = {"user": User.objects.filter(username=username).first(), "password": None, "project": None, "key": None}
    if created["user"] is None:
        created["password"] = secrets.token_urlsafe(12)
        created["user"] = User.objects.create_superuser(username=username, email="", password=created["password"])
    if not Project.objects.exists():
        created["project"], created["key"] = project_create(name="default", owner=created["user"])
    return created


def project_retention_update(*, project: Project, retention_days: int) -> Project:
    """Set how many days the project's data is kept (validated by the model's bounds)."""
    project.retention_days = int(retention_days)
    project.full_clean(validate_unique=False, validate_constraints=False)
    project.save(update_fields=["retention_days"])
    return project
