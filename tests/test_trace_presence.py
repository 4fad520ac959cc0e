"""The summariser's memory of which traces have a summary (analytics.trace_presence): the Bloom
filter never forgets an id, the lookup it answers equals the read of ``traces`` after every kind
of write, and it reads by id only what memory cannot answer."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from analytics import summarizer, trace_presence
from analytics.trace_presence import BloomFilter, presence_for
from store import get_store
from tests.spans import llm_trace
from tests.test_summarizer import MS, insert
from tests.trace_seed import seed

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def _ids(n: int, rng: random.Random) -> list[str]:
    return [f"{rng.getrandbits(128):032x}" for _ in range(n)]


def test_the_filter_holds_every_id_it_was_given_and_few_others():
    rng = random.Random(5)
    bloom = BloomFilter(20_000)
    added = _ids(20_000, rng) + [f"{n:032x}" for n in range(500)]  # random ids and a counter's
    bloom.add(7, added[:12_000])
    bloom.add(7, np.frombuffer("".join(added[12_000:]).encode(), dtype=np.uint8).reshape(-1, 32))  # as bytes
    assert bloom.may_contain(7, added).all(), "no false negative, whatever form the ids came in"
    others = _ids(20_000, rng)
    # At capacity a new id is taken for a known one ~1.4e-5 of the time: each such id costs a
    # summariser run a read of ``traces``, so a handful in 20,000 at most (a one-word blocked filter
    # of 12 bits a trace answered 0.3-1.7 %).
    assert bloom.may_contain(7, others).sum() <= 4
    assert bloom.may_contain(8, added).sum() <= 4, "an id of one project is not another's"
    assert not bloom.full and bloom.count == 20_500
    small = BloomFilter(1)
    small.add(1, _ids(small.capacity + 1, rng))
    assert small.capacity == trace_presence.MIN_CAPACITY and small.full, "sized for its capacity, then full"


def _read(project_id: int, ids: list[str]) -> dict[str, dict]:
    """The lookup as the store answers it (every id read from ``traces``)."""
    return {r["trace_id"]: r for r in get_store().query(
        summarizer._PREVIOUS_SQL, {"project_id": project_id, "trace_ids": ",".join(ids)},
        tag="tests.trace_presence.read").dicts()}


def _assert_lookup_exact(project_id: int, ids: list[str]) -> None:
    got = summarizer._previous(get_store(), project_id, ids)
    want = _read(project_id, ids)
    assert set(got) == set(want)
    for trace_id, row in want.items():
        assert {k: int(got[trace_id][k]) for k in trace_presence.FIELDS} == {k: int(row[k]) for k in trace_presence.FIELDS}, trace_id


@pytest.mark.parametrize("engine", ["arrays", "sql"])
def test_the_lookup_equals_the_table_after_every_kind_of_write(engine, project_with_key, settings):
    """Summaries written by the summariser, grown by late spans, seeded by a plain insert and by a
    statement, and a truncation: after each, the lookup answers exactly what reading ``traces`` would."""
    settings.TRACEDASH_SUMMARY_ENGINE = engine
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    other, _ = project_with_key()
    store = get_store()
    presence = presence_for(store)
    rng = random.Random(11)
    start = time.time_ns() - 600 * 1_000_000_000
    traces = [llm_trace(start_ns=start + i * 3000 * MS) for i in range(6)]
    ids = [t[0]["trace_id"] for t in traces]
    never = _ids(40, rng)

    # children first: every trace is new, none is read by id
    insert(project.pk, [s for t in traces for s in t[1:]])
    insert(other.pk, traces[0][1:])  # the same ids in another project
    asked = dict(presence.stats)
    summarizer.traces_summarize(project_ids=[project.pk])
    assert presence.stats["read"] == asked["read"], "new traces are known to be new"
    _assert_lookup_exact(project.pk, ids + never)
    _assert_lookup_exact(other.pk, ids[:1])

    # the roots arrive: the previous summaries come from memory, and the result is the table's
    time.sleep(0.01)
    insert(project.pk, [t[0] for t in traces])
    summarizer.traces_summarize(project_ids=[project.pk])
    rows = {r["trace_id"]: r for r in store.query(
        "SELECT trace_id, span_count, has_root FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": project.pk},
        tag="tests.trace_presence.rows").dicts()}
    assert all(rows[t]["span_count"] == 5 and rows[t]["has_root"] == 1 for t in ids)
    _assert_lookup_exact(project.pk, ids + never)

    # a summary inserted by someone else (a seed, through Store.insert), then a late span of it
    seeded = llm_trace(start_ns=start)
    seeded_id = seed(seeded[1:], project_id=project.pk)
    _assert_lookup_exact(project.pk, [seeded_id] + never)
    time.sleep(0.01)
    insert(project.pk, seeded[:1])
    summarizer.traces_summarize(project_ids=[project.pk])
    grown = store.query("SELECT span_count, has_root FROM traces FINAL WHERE trace_id = {t:String}", {"t": seeded_id},
                        tag="tests.trace_presence.grown").dicts()[0]
    assert grown == {"span_count": 5, "has_root": 1}
    _assert_lookup_exact(project.pk, [seeded_id] + never)

    # a statement writing ``traces``: the memory starts over from the table
    copied = _ids(1, rng)[0]
    store.command("INSERT INTO traces SELECT * REPLACE (toFixedString({t:String}, 32) AS trace_id, version + 1 AS version) "
                  "FROM traces WHERE project_id = {p:UInt64} AND trace_id = {s:String} LIMIT 1",
                  {"t": copied, "p": project.pk, "s": ids[0]}, tag="tests.trace_presence.copy")
    builds = presence.stats["builds"]
    _assert_lookup_exact(project.pk, [copied, ids[0]] + never)
    assert presence.stats["builds"] == builds + 1

    # a truncation: nothing has a summary any more
    store.command("TRUNCATE TABLE IF EXISTS traces", tag="tests.trace_presence.truncate")
    _assert_lookup_exact(project.pk, ids + [copied] + never)


def test_an_older_trace_past_the_recent_memory_is_read_by_id(project_with_key, settings, monkeypatch):
    """A late span of a trace summarised longer ago than the recent memory keeps: the filter says
    "maybe", the summary is read from ``traces``, and the trace grows as it should."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    presence = presence_for(get_store())
    spans = llm_trace(start_ns=time.time_ns() - 3600 * 1_000_000_000)
    insert(project.pk, spans[1:])
    summarizer.traces_summarize(project_ids=[project.pk])
    monkeypatch.setattr(trace_presence, "RECENT_SECONDS", 0.0)
    time.sleep(0.01)
    read = presence.stats["read"]
    insert(project.pk, spans[:1])
    summarizer.traces_summarize(project_ids=[project.pk])
    assert presence.stats["read"] == read + 1
    row = get_store().query("SELECT span_count, has_root, e2e_ns FROM traces FINAL WHERE trace_id = {t:String}",
                            {"t": spans[0]["trace_id"]}, tag="tests.trace_presence.grown").dicts()[0]
    assert row == {"span_count": 5, "has_root": 1, "e2e_ns": 1200 * MS}


def test_a_failed_write_or_a_failing_listener_makes_it_start_over(project_with_key):
    store = get_store()
    presence = presence_for(store)
    presence.split(1, ["a" * 32])  # built
    assert presence._filter is not None
    with pytest.raises(Exception):
        store.command("INSERT INTO traces (project_id, trace_id) SELECT throwIf(1), 'x'", tag="tests.trace_presence.fail")
    assert presence._filter is None

    class Broken:
        def on_command(self, sql, tag):
            raise RuntimeError("boom")

        def reset(self):
            self.was_reset = True

    broken = Broken()
    store.add_write_listener(broken)
    try:
        store.command("SELECT 1 FORMAT Null", tag="tests.trace_presence.noop")
    finally:
        store._write_listeners.remove(broken)
    assert broken.was_reset, "a listener that fails starts over; the write stands"


def test_a_server_store_keeps_reading_every_id():
    from types import SimpleNamespace

    assert presence_for(SimpleNamespace(kind="native")) is None


def test_a_big_table_is_read_on_a_thread_of_its_own_while_the_lookup_goes_on(project_with_key, monkeypatch):
    """Past SYNC_BUILD_MAX summaries the filter is (re)built on a thread: the lookup does not wait
    for it. Until the new filter is filled, a full one keeps answering (or, with none, every id is
    read); an id written during the build is in the new one; a failed build is tried again."""
    import threading

    project, _ = project_with_key()
    store = get_store()
    presence = presence_for(store)
    rng = random.Random(3)
    summarised = _ids(30, rng)
    store.command("INSERT INTO traces (project_id, trace_id, start_time, version) "  # (a recent start: no TTL drops it)
                  "SELECT {p:UInt64}, arrayJoin(splitByChar(',', {t:String})), now64(9), 1",
                  {"p": project.pk, "t": ",".join(summarised)}, tag="tests.trace_presence.seed")
    monkeypatch.setattr(trace_presence, "SYNC_BUILD_MAX", 0)

    gate, reading = threading.Event(), threading.Event()
    real_query_arrow = store.query_arrow

    def held_query_arrow(sql, params=None, tag=""):
        if tag == "analytics.trace_presence.build":
            reading.set()
            assert gate.wait(60)
        return real_query_arrow(sql, params, tag=tag)

    monkeypatch.setattr(store, "query_arrow", held_query_arrow)
    presence.reset()
    never = _ids(20, rng)
    known, ask = presence.split(project.pk, summarised + never)
    assert reading.wait(30) and presence._filter is None
    assert known == {} and ask == summarised + never, "no filter yet: every id is read, nothing assumed"

    # the build is held; a full filter answers meanwhile, and an id written now reaches the new one
    old = BloomFilter(1)
    old.add(project.pk, summarised)
    old.count = old.capacity + 1  # full: a bigger one is due
    with presence._lock:
        presence._filter = old
    late = _ids(1, rng)
    presence.on_insert("traces", [{"project_id": project.pk, "trace_id": late[0]}], "tests.trace_presence.late")
    known, ask = presence.split(project.pk, summarised + late + never)
    assert set(ask) >= set(summarised + late) and len(ask) < len(summarised + late + never), \
        "the full filter answers while the new one is read"
    assert presence._building is not None and presence._filter is old
    gate.set()
    assert presence.wait_built(60)
    assert presence._filter is not old and not presence._filter.full
    assert presence._filter.may_contain(project.pk, summarised + late).all()

    # a build that fails leaves no build pending: the next full filter starts another
    def failing(sql, params=None, tag=""):
        raise RuntimeError("the store stopped")

    monkeypatch.setattr(store, "query_arrow", failing)
    presence._filter.count = presence._filter.capacity + 1
    presence.split(project.pk, never)
    assert presence.wait_built(60) and presence._building is None
    monkeypatch.setattr(store, "query_arrow", real_query_arrow)
    builds = presence.stats["builds"]
    presence.split(project.pk, never)
    assert presence.wait_built(60) and presence.stats["builds"] == builds + 1
    assert presence._filter.may_contain(project.pk, summarised).all()
