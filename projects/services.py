"""Writes for projects, members and keys."""

from __future__ import annotations

import hmac
import logging
import re
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from .keycache import CACHE, key_digest
from .models import ApiKey, Membership, Project

log = logging.getLogger("tracedash.projects")

KEY_PREFIX_BYTES = 6  # 12 hex characters
KEY_SECRET_BYTES = 24  # 192 bits of entropy
_URLSAFE = re.compile(r"[A-Za-z0-9_-]+")
NAME_MAX_LENGTH = 200
# "Last used" is written at most once per this interval per key: ingestion runs thousands of
# requests a second, and a metadata write per request would make the database the bottleneck.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _clean_name(value, *, field: str, what: str) -> str:
    name = (value or "").strip()
    if not name:
        raise ValidationError({field: f"the {what} name is empty"})
    if len(name) > NAME_MAX_LENGTH:
        raise ValidationError({field: f"the {what} name is longer than {NAME_MAX_LENGTH} characters"})
    return name


def _hash_key(raw_key: str) -> str:
    # Keys are long random strings, so a plain SHA-256 is enough (no password-style stretching).
    return key_digest(raw_key)


def _format_key(prefix: str, secret: str) -> str:
    return f"td_{prefix}_{secret}"


def api_key_create(*, project: Project, name: str = "default", secret: str | None = None) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the plaintext key, which is never stored.

    The one way keys are made (settings page, admin, ``create_project``, first start, the load
    tests key). A blank or over-long name is a ``ValidationError`` on ``name``.

    ``secret`` (optional) is the key's secret part, for a caller that can derive it again itself
    (``loadtests.services``: an HMAC of the server's SECRET_KEY); it must be as strong as a random
    one (at least ``KEY_SECRET_BYTES`` of URL-safe base64). By default it is random."""
    name = _clean_name(name, field="name", what="key")
    if secret is None:
        secret = secrets.token_urlsafe(KEY_SECRET_BYTES)
    elif len(secret) < len(secrets.token_urlsafe(KEY_SECRET_BYTES)) or not _URLSAFE.fullmatch(secret):
        raise ValueError("a key's secret is at least 32 URL-safe base64 characters")
    while True:
        prefix = secrets.token_hex(KEY_PREFIX_BYTES)
        if not ApiKey.objects.filter(prefix=prefix).exists():
            break
    raw = _format_key(prefix, secret)
    key = ApiKey.objects.create(project=project, name=name, prefix=prefix, key_hash=_hash_key(raw))
    return key, raw


def api_key_with_secret(*, key: ApiKey, secret: str) -> str | None:
    """The plaintext of ``key`` given its secret part, or None when that secret is not the key's
    (its hash differs). For a caller that derives the secret again (see ``api_key_create``);
    neither checks revocation nor records a use."""
    raw = _format_key(key.prefix, secret)
    return raw if hmac.compare_digest(key.key_hash, _hash_key(raw)) else None


def api_key_revoke(*, key: ApiKey) -> None:
    """Revoke ``key``: refused from the next request on in this process, and within
    ``TRACEDASH_KEY_CACHE_MS`` in every other one (``projects.keycache``)."""
    if key.revoked_at is None:
        with transaction.atomic():  # the row and the key revision change together
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])


# (key id, prefix) -> when this process last wrote (or tried to write) that key's last_used_at.
_USE_WRITES: dict[tuple[int, str], object] = {}


def api_key_use_due(*, key: ApiKey, now=None) -> bool:
    """Whether ``api_key_record_use`` would write now (no database): the key's ``last_used_at``
    and this process's own attempts are both older than ``LAST_USED_RESOLUTION``."""
    now = now or timezone.now()
    if key.last_used_at is not None and now - key.last_used_at < LAST_USED_RESOLUTION:
        return False
    attempted = _USE_WRITES.get((key.pk, key.prefix))
    return attempted is None or now - attempted >= LAST_USED_RESOLUTION


def api_key_record_use(*, key: ApiKey, now=None) -> bool:
    """Note that ``key`` was just used, at most once per ``LAST_USED_RESOLUTION`` per key.

    The row's ``last_used_at`` (already loaded by the lookup) decides, so a key used within the
    last minute costs no write at all; otherwise one conditional ``UPDATE`` (which several
    processes may race for: only the first in a minute changes the row). Each process also
    remembers its own attempts, so a write that failed is not retried before the minute is up. Best effort: a failed
    write is logged and never fails the request that used the key. Returns whether it wrote."""
    now = now or timezone.now()
    if not api_key_use_due(key=key, now=now):
        return False  # used within the minute, or this process wrote (or tried to): a locked database is not retried per request
    if len(_USE_WRITES) > 10_000:
        _USE_WRITES.clear()
    _USE_WRITES[(key.pk, key.prefix)] = now
    stale = now - LAST_USED_RESOLUTION
    try:
        with transaction.atomic():
            updated = (ApiKey.objects.filter(pk=key.pk)
                       .exclude(last_used_at__gt=stale)
                       .update(last_used_at=now))
    except DatabaseError as exc:
        log.warning("could not record the use of ingest key td_%s_…: %s", key.prefix, exc)
        return False
    key.last_used_at = now
    return bool(updated)


def _key_shape_ok(raw_key: str) -> bool:
    parts = raw_key.split("_", 2)
    return len(parts) == 3 and parts[0] == "td" and len(parts[1]) == KEY_PREFIX_BYTES * 2


def api_key_public_key(*, raw_key: str) -> str | None:
    """The public part of a plaintext key, ``td_<prefix>`` (``ApiKey.public_key``: what the Settings
    page lists, and the Langfuse SDK's public key), or None for text not shaped like a key."""
    return f"td_{raw_key.split('_', 2)[1]}" if _key_shape_ok(raw_key) else None


def api_key_authenticate_cached(*, raw_key: str) -> ApiKey | None:
    """The active key matching ``raw_key`` when this process has checked it recently enough to
    answer without the database (``projects.keycache``), else None: then ask
    ``api_key_authenticate``. Records no use (see ``api_key_use_due``)."""
    if not _key_shape_ok(raw_key):
        return None
    return CACHE.peek(key_digest(raw_key))


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The active key matching ``raw_key``, or None. A key this process checked is remembered
    (``projects.keycache``); a revocation in any process makes every process forget it (at once
    here, within ``TRACEDASH_KEY_CACHE_MS`` elsewhere), so a revoked key's requests are refused.
    A match records the use (``api_key_record_use``: at most one write a minute per key)."""
    if not _key_shape_ok(raw_key):
        return None
    digest = key_digest(raw_key)
    key = CACHE.get(digest)
    if key is None:
        prefix = raw_key.split("_", 2)[1]
        key = ApiKey.objects.select_related("project").filter(prefix=prefix, revoked_at__isnull=True).first()
        if key is None or not hmac.compare_digest(key.key_hash, digest):
            return None  # the digest was computed either way: timing does not reveal valid prefixes
        CACHE.put(digest, key)
    api_key_record_use(key=key)
    return key


def project_create(*, name: str, owner=None) -> tuple[Project, str]:
    """Create a project with one ingest key; returns the project and the plaintext key.

    ``owner`` (optional) becomes its first member. A blank, over-long or already used name is a
    ``ValidationError`` on ``name``, and nothing is written."""
    name = _clean_name(name, field="name", what="project")
    duplicate = ValidationError({"name": f"a project named {name!r} already exists"})
    if Project.objects.filter(name=name).exists():
        raise duplicate
    try:
        with transaction.atomic():
            project = Project.objects.create(name=name)
            if owner is not None:
                Membership.objects.create(project=project, user=owner, role=Membership.Role.OWNER)
            _, raw = api_key_create(project=project)
    except IntegrityError:  # the same name, created between the check and the insert
        raise duplicate from None
    return project, raw


def membership_add(*, project: Project, user, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.get_or_create(project=project, user=user, defaults={"role": role})
    return membership


def membership_add_by_username(*, project: Project, username: str) -> Membership:
    """Add the existing user ``username`` to ``project`` (as a member). An unknown username or
    one that is already a member is a ``ValidationError`` on ``username``."""
    username = (username or "").strip()
    if not username:
        raise ValidationError({"username": "the username is empty"})
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationError({"username": f"no user named {username!r}"})
    if Membership.objects.filter(project=project, user=user).exists():
        raise ValidationError({"username": f"{username!r} is already a member of {project.name!r}"})
    try:
        with transaction.atomic():
            return Membership.objects.create(project=project, user=user, role=Membership.Role.MEMBER)
    except IntegrityError:  # added by someone else in between
        raise ValidationError({"username": f"{username!r} is already a member of {project.name!r}"}) from None


@transaction.atomic
def membership_remove(*, membership: Membership) -> None:
    """Remove a member from its project. The last member cannot be removed: a project nobody
    belongs to could only be reached through the admin again."""
    others = Membership.objects.select_for_update().filter(project_id=membership.project_id).exclude(pk=membership.pk)
    if not others.exists():
        raise ValidationError(f"{membership.user.get_username()!r} is the last member of the project; "
                              "add someone else before removing them")
    membership.delete()


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
