"""Shared fixtures.

ClickHouse: each test run gets its own database (``tracedash_test_<random>``) on the store the
settings name (embedded chdb by default), built by the same migrations users run, and dropped at
the end. Tests that touch it carry ``@pytest.mark.clickhouse``; an unmarked test that reaches the
store fails, so isolation (tables truncated before each marked test) is never forgotten.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import uuid

import pytest
from django.conf import settings

import store
from analytics import attribute_index
from store import Store, store_from_settings
from store.migrator import MigrationContext, migrate
from store.schema import TABLES


# Browser tests: every Playwright wait (actions, wait_for_*, and expect() assertions) gives up only
# after this long. It is a ceiling, never an expected duration: tests wait on the page's own
# readiness, so a slow or loaded machine makes them slower, never red.
BROWSER_TIMEOUT_MS = 90_000
try:
    from playwright.sync_api import expect as _playwright_expect
except ImportError:  # pragma: no cover - browser tests skip themselves without Playwright
    pass
else:
    _playwright_expect.set_options(timeout=BROWSER_TIMEOUT_MS)


class _UnmarkedStoreGuard:
    """Stands in for the store in tests without the ``clickhouse`` marker."""

    name = kind = "guard"
    database = "none"

    def describe(self):
        return "guard"

    def _refuse(self, *args, **kwargs):
        raise AssertionError("this test reached ClickHouse; mark it with @pytest.mark.clickhouse")

    query = command = insert = ping = _refuse

    def close(self):
        pass


@pytest.fixture(scope="session")
def clickhouse_store():
    database = f"tracedash_test_{secrets.token_hex(4)}"
    test_store = store_from_settings(database=database)
    migrate(test_store, MigrationContext(retention_days=settings.TRACEDASH_RETENTION_DAYS))
    yield test_store
    try:
        test_store.command(f"DROP DATABASE IF EXISTS `{database}`", tag="tests.drop_database")
    finally:
        test_store.close()
        if settings.TRACEDASH_CLICKHOUSE is None and str(settings.DATA_DIR).startswith(("/tmp/", os.environ.get("TMPDIR", "/tmp/"))):
            shutil.rmtree(settings.DATA_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _store_for_test(request):
    if request.node.get_closest_marker("clickhouse"):
        test_store = request.getfixturevalue("clickhouse_store")
        for table in TABLES:
            test_store.command(f"TRUNCATE TABLE IF EXISTS {table}", tag="tests.truncate")
        attribute_index.forget_known()
        previous = store.set_store(test_store)
    else:
        previous = store.set_store(Store(_UnmarkedStoreGuard()))
    yield
    store.set_store(previous)


@pytest.fixture
def make_user(django_user_model):
    def make(username=None, password="pw-for-tests-1"):
        username = username or f"user-{uuid.uuid4().hex[:8]}"
        return django_user_model.objects.create_user(username=username, password=password)

    return make


@pytest.fixture
def remembered_keys(settings):
    """Ingest keys remembered for a minute (long enough that no test depends on the machine's
    speed), from an empty memory: a revocation must still be honoured at once on that path."""
    from projects.keycache import CACHE

    settings.TRACEDASH_KEY_CACHE_MS = 60_000
    CACHE.forget()
    yield
    CACHE.forget()


@pytest.fixture
def project_with_key(db):
    """(project, plaintext ingest key), made through the same service users call."""
    from projects.services import project_create

    def make(name=None, members=()):
        from projects.services import membership_add

        project, key = project_create(name=name or f"project-{uuid.uuid4().hex[:8]}")
        for user in members:
            membership_add(project=project, user=user)
        return project, key

    return make


@pytest.fixture(scope="module")
def asgi_server():
    """uvicorn serving the app on a free port, in this process (see tests/live.py)."""
    from tests.live import AsgiServer

    server = AsgiServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def closed_port_url():
    """A URL where nothing listens (connection refused): a server that is down."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def wait_until(predicate, timeout=60.0, interval=0.05, message="condition"):
    """Poll until ``predicate()`` is true: a ceiling, not an expected duration (a loaded machine
    only makes this slower)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def spool_drained(writer, timeout=60.0, message="the spool to drain"):
    """Wake ``writer``'s replayer now (not after its back-off) and wait until its spool is empty."""
    writer._replay_wakeup.set()
    wait_until(lambda: writer.spool.pending() == 0, timeout=timeout, message=message)
