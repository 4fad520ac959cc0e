"""The tasks' watermarks known in memory on the embedded store (analytics.watermarks): read once,
then kept from every insert into ``task_watermarks``; forgotten on anything else that writes it."""

from __future__ import annotations

import threading

import pytest

from analytics import summarizer, watermarks
from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def _reads(monkeypatch) -> list[str]:
    seen: list[str] = []
    store = get_store()
    real = type(store).query

    def query(self, sql, params=None, *, tag):
        seen.append(tag)
        return real(self, sql, params, tag=tag)

    monkeypatch.setattr(type(store), "query", query)
    return seen


def test_a_watermark_is_read_once_then_followed_through_its_writes(monkeypatch):
    store = get_store()
    assert store.kind == "embedded" and watermarks.known_for(store) is not None
    reads = _reads(monkeypatch)
    get = lambda job="tests.a": summarizer.watermark_get(project_id=424242, job=job)  # noqa: E731
    assert get() == 0 and reads == ["analytics.summarizer.watermark_get"]
    summarizer.watermark_set(project_id=424242, job="tests.a", value=1_000)
    summarizer.watermark_set(project_id=424242, job="tests.a", value=900)  # lower: the highest counts (max)
    assert get() == 1_000 and len(reads) == 1
    assert get("tests.b") == 0 and len(reads) == 2  # another key: read once
    # Written by another statement: forgotten, read again, and what the store holds is the answer.
    store.command("ALTER TABLE task_watermarks DELETE WHERE project_id = 424242 AND job = 'tests.a'"
                  " SETTINGS mutations_sync = 2", tag="tests.watermarks.delete")
    assert get() == 0 and len(reads) == 3
    summarizer.watermark_set(project_id=424242, job="tests.a", value=5)
    assert get() == 5 and len(reads) == 3
    # As the store reads it, every time.
    assert int(store.query(watermarks.READ_SQL, {"project_id": 424242, "job": "tests.a"}, tag="t").scalar()) == 5


def test_a_failed_insert_forgets_and_a_server_store_always_reads(monkeypatch):
    store = get_store()
    known = watermarks.known_for(store)
    summarizer.watermark_set(project_id=434343, job="tests.a", value=7)
    assert summarizer.watermark_get(project_id=434343, job="tests.a") == 7
    known.on_insert_failed("task_watermarks", "tests")
    reads = _reads(monkeypatch)
    assert summarizer.watermark_get(project_id=434343, job="tests.a") == 7 and len(reads) == 1
    monkeypatch.setattr(type(store), "kind", property(lambda self: "server"))
    assert watermarks.known_for(store) is None
    assert summarizer.watermark_get(project_id=434343, job="tests.a") == 7 and len(reads) == 2
    assert summarizer.summaries_fresh(project_id=434343, within_seconds=1) is False


def test_a_write_during_the_first_read_is_not_lost():
    """A read of the store that began before an insert ended caches the higher of the two."""
    store = get_store()
    known = watermarks.KnownWatermarks()
    entered, go = threading.Event(), threading.Event()

    class Slow:
        kind = "embedded"

        def query(self, sql, params, tag):
            entered.set()
            go.wait(10)
            return store.query(sql, params, tag=tag)

    got = []
    reader = threading.Thread(target=lambda: got.append(known.get(Slow(), 454545, "tests.a", "t")))
    reader.start()
    entered.wait(10)
    known.on_insert("task_watermarks", [{"project_id": 454545, "job": "tests.a", "value": 99}], "t")  # not stored
    go.set()
    reader.join(10)
    assert got == [99] and known.get(store, 454545, "tests.a", "t") == 99


def test_the_summarisers_watermark_is_stored_every_ten_seconds_of_progress(monkeypatch):
    """``lazily``: moved in memory alone while the value stored is less than STORE_EVERY_MS behind,
    stored past that; what makes the memory forget leaves the value stored (a restart redoes at
    most that much)."""
    store = get_store()
    known = watermarks.known_for(store)
    stored = lambda: int(store.query(watermarks.READ_SQL, {"project_id": 464646, "job": "tests.a"},  # noqa: E731
                                     tag="t").scalar() or 0)
    get = lambda: summarizer.watermark_get(project_id=464646, job="tests.a")  # noqa: E731
    summarizer.watermark_set(project_id=464646, job="tests.a", value=1_000, lazily=True)  # never read: stored
    assert stored() == 1_000 and get() == 1_000
    summarizer.watermark_set(project_id=464646, job="tests.a", value=5_000, lazily=True)
    summarizer.watermark_set(project_id=464646, job="tests.a", value=10_999, lazily=True)
    assert get() == 10_999 and stored() == 1_000, "in memory alone"
    summarizer.watermark_set(project_id=464646, job="tests.a", value=11_000, lazily=True)
    assert get() == 11_000 and stored() == 11_000, "10 s past the value stored: stored"
    summarizer.watermark_set(project_id=464646, job="tests.a", value=12_000, lazily=True)
    summarizer.watermark_set(project_id=464646, job="tests.a", value=12_500)  # not lazily: stored at once
    assert stored() == 12_500
    summarizer.watermark_set(project_id=464646, job="tests.a", value=13_000, lazily=True)
    known.reset()  # e.g. a failed insert into task_watermarks
    assert get() == 12_500, "what was stored"
