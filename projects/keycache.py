"""Checked ingest keys, kept in process memory, with revocation honoured across processes.

An ingest request used to cost a metadata-database round trip (and a thread, because Django's ORM
is synchronous) only to find its key. Keys change rarely, so each process remembers the keys it
has checked, by the SHA-256 of the key (which is the key's stored hash): a request whose key is
remembered is answered on the event loop without touching the database.

Revocation: every change to a key or a project (revoke, edit, delete, in any process: settings
page, admin, another web or worker process) raises ``KeyRevision.version`` in the same
transaction. A process trusts its memory for at most ``TRACEDASH_KEY_CACHE_MS`` (default 500 ms)
after it last read that number; when the number moved, it forgets every key. So a revoked key is
refused at once by the process that revoked it and within ``TRACEDASH_KEY_CACHE_MS`` by every other
one. ``TRACEDASH_KEY_CACHE_MS=0`` turns the memory off (every request reads its key's row).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save

from .models import ApiKey, KeyRevision, Project

MAX_KEYS = 10_000  # per process; past it the memory starts again (a flood of distinct valid keys is not expected)


def key_digest(raw_key: str) -> str:
    """The SHA-256 (hex) of a plaintext key: what ``ApiKey.key_hash`` stores."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


def revision_read() -> int:
    row = KeyRevision.objects.filter(pk=1).values_list("version", flat=True).first()
    return int(row) if row is not None else 0


def revision_bump() -> None:
    """Raise the revision (in the caller's transaction) and forget this process's keys now and
    again once the transaction commits (a request may have read the old row in between)."""
    if not KeyRevision.objects.filter(pk=1).update(version=F("version") + 1):
        KeyRevision.objects.get_or_create(pk=1, defaults={"version": 1})
    CACHE.forget()
    transaction.on_commit(CACHE.forget)


class KeyCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, ApiKey] = {}
        self._version: int | None = None
        self._checked = -math.inf  # time.monotonic() of the last revision read

    @staticmethod
    def _ttl() -> float:
        return settings.TRACEDASH_KEY_CACHE_MS / 1000

    def peek(self, digest: str) -> ApiKey | None:
        """The remembered key when the revision was read less than the TTL ago; no database."""
        if time.monotonic() - self._checked >= self._ttl():
            return None
        return self._keys.get(digest)

    def get(self, digest: str) -> ApiKey | None:
        """The remembered key, reading the revision first when the last read is older than the TTL."""
        ttl = self._ttl()
        if ttl <= 0:
            return None
        now = time.monotonic()
        if now - self._checked >= ttl:
            version = revision_read()
            with self._lock:
                if version != self._version:
                    self._keys = {}
                    self._version = version
                self._checked = now
        return self._keys.get(digest)

    def put(self, digest: str, key: ApiKey) -> None:
        """Remember an active key found in the database. Only after a revision read (``get``), so
        the key was read no earlier than the revision it is remembered under."""
        if self._ttl() <= 0 or self._version is None:
            return
        with self._lock:
            if len(self._keys) >= MAX_KEYS:
                self._keys = {}
            self._keys[digest] = key

    def forget(self) -> None:
        with self._lock:
            self._keys = {}
            self._checked = -math.inf


CACHE = KeyCache()


def _changed(sender, instance, created=False, **kwargs) -> None:
    """A key or project saved or deleted. A new one is in no process's memory yet (misses are not
    remembered), so only changes and deletions move the revision."""
    if not created:
        revision_bump()


for _model in (ApiKey, Project):
    post_save.connect(_changed, sender=_model, dispatch_uid=f"projects.keycache.{_model.__name__}.saved")
    post_delete.connect(_changed, sender=_model, dispatch_uid=f"projects.keycache.{_model.__name__}.deleted")
