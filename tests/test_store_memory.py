"""The embedded store hands the memory ClickHouse freed back to the system (Store.release_memory),
and the embedded beat does it every few seconds: chdb's allocator otherwise keeps the freed pages,
so the serving process's RSS climbed under steady ingestion while the memory in use stayed flat."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from store import get_store
from store.backends import EmbeddedBackend
from store.client import Store
from store.errors import StoreError, StoreUnavailable

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


@pytest.mark.clickhouse
def test_release_memory_returns_what_a_large_query_freed():
    store = get_store()
    if not isinstance(store.backend, EmbeddedBackend):
        assert store.release_memory() is False  # a server manages its own memory
        return
    store.release_memory()
    before = _rss()
    # ~250 MiB of strings built and freed inside ClickHouse: the process keeps the pages
    store.query("SELECT sum(length(s)) FROM (SELECT groupArray(toString(number)) AS s FROM numbers(5000000))",
                tag="tests.memory")
    kept = _rss()
    assert store.release_memory() is True
    released = _rss()
    assert kept - before > 100 * MIB, (before / MIB, kept / MIB)  # what the fix is for: freed, still held
    assert kept - released > 100 * MIB, (kept / MIB, released / MIB)


def _backend_refusing(exc: Exception) -> tuple[EmbeddedBackend, list]:
    backend = EmbeddedBackend(Path("/nonexistent"), "unused")
    calls = []

    def command(sql, params, tag):
        calls.append(sql)
        raise exc

    backend.command = command
    return backend, calls


def test_a_build_without_jemalloc_is_asked_once(caplog):
    backend, calls = _backend_refusing(StoreError("Code: 344. DB::Exception: SYSTEM JEMALLOC PURGE is not supported"))
    store = Store(backend)
    assert store.release_memory() is False and store.release_memory() is False
    assert calls == ["SYSTEM JEMALLOC PURGE"]
    assert "cannot return freed memory" in caplog.text


def test_a_closed_store_is_asked_again_later():
    backend, calls = _backend_refusing(StoreUnavailable("the store is closed"))
    assert backend.release_memory() is False and backend.release_memory() is False
    assert len(calls) == 2  # closing is not "unsupported": a reopened store releases again


def _schedule(**env) -> list[str]:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TRACEDASH_CLICKHOUSE_URL", "CELERY_BROKER_URL", "TRACEDASH_EMBEDDED_BEAT",
                            "TRACEDASH_RELEASE_MEMORY_SECONDS")}
    environ.update(env, DJANGO_SETTINGS_MODULE="config.settings", TRACEDASH_DATA_DIR=str(settings.DATA_DIR))
    out = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings;"
                          " print(' '.join(settings.CELERY_BEAT_SCHEDULE))"],
                         env=environ, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_the_embedded_beat_releases_memory_and_a_server_setup_does_not():
    from config.celery import app

    assert "store-release-memory" in _schedule()
    assert "store-release-memory" not in _schedule(TRACEDASH_CLICKHOUSE_URL="clickhouse://default@127.0.0.1:9000/tracedash")
    assert "store-release-memory" not in _schedule(CELERY_BROKER_URL="redis://127.0.0.1:6379/0")
    assert "store-release-memory" not in _schedule(TRACEDASH_RELEASE_MEMORY_SECONDS="0")
    app.loader.import_default_modules()
    assert "store.tasks.release_memory" in app.tasks


def _fragment_in_a_thread(megabytes: int) -> list:
    """Python objects of a few KiB (glibc's malloc, not Python's small-object allocator) allocated
    by a thread of their own, one in fifty kept: the rest freed but not at the arena's top, so glibc
    keeps the pages."""
    import threading

    kept = []

    def work():
        blocks = [bytes(4096) for _ in range(megabytes * 256)]
        kept.extend(blocks[::50])
        del blocks

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return kept


def test_trim_returns_what_python_threads_freed():
    from config import memory

    if memory._glibc() is None:
        assert memory.trim() is False and memory.limit_arenas() is False
        return
    memory.trim()
    before = _rss()
    kept = _fragment_in_a_thread(200)
    held = _rss()
    assert memory.trim() is True
    trimmed = _rss()
    assert held - before > 100 * MIB, (before / MIB, held / MIB)  # freed, still held by glibc
    assert held - trimmed > 100 * MIB, (held / MIB, trimmed / MIB)
    assert len(kept) == len(range(0, 200 * 256, 50))


def test_memory_helpers_do_nothing_without_glibc(monkeypatch):
    from config import memory

    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory.trim() is False
    assert memory.limit_arenas() is False


def test_the_release_task_trims_and_purges(monkeypatch):
    from config import memory
    from store import tasks

    calls = []
    monkeypatch.setattr(memory, "trim", lambda: calls.append("trim") or True)
    monkeypatch.setattr(tasks, "get_store", lambda: type("S", (), {"release_memory": lambda self: calls.append("purge") or False})())
    assert tasks.release_memory() is True
    assert calls == ["trim", "purge"]
