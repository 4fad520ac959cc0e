"""The spans just stored, held in memory for the summariser (analytics.fresh_spans): the same columns
and values as a read of ``spans``, served only where every insert of the window is known, and the
summariser's figures unchanged when it reads neither the arrivals nor the new traces' spans back."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from clickhouse_cityhash.cityhash import CityHash64

from analytics import fresh_spans, summarizer, summary_arrays, summary_sql
from ingest.schemas import Limits, parse_span
from store import StoreError, get_store
from tests.spans import llm_trace
from tests.test_summarizer import _stored

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

MS = 1_000_000
PRICES_JSON = summary_sql.prices_json({"gpt-4o-mini": (0.15, 0.6)})


def rows_of(project_id, spans):
    return [parse_span(json.dumps(s).encode(), project_id=project_id, limits=Limits()) for s in spans]


def attach():
    """The store's memory of fresh spans, holding every insert from the next ms on."""
    fresh = fresh_spans.fresh_for(get_store())
    time.sleep(0.002)
    return fresh


def settle():
    time.sleep(0.003)  # the inserts' stamps lie before the ms a reader stops at
    return get_store().settled_until_ms("spans")


def test_city_hash_of_a_span_id_and_an_arrival_is_clickhouses():
    """The digest's hashes computed in numpy: CityHash v1.0.2 (ClickHouse's cityHash64) of a
    FixedString(16), of a DateTime64(3), and of the two together."""
    ids = [os.urandom(8).hex() for _ in range(200)] + ["ab" + "\0" * 14, "0" * 16]
    raw = np.frombuffer(b"".join(i.encode() for i in ids), dtype=np.uint8).reshape(-1, 16)
    assert fresh_spans.city_hash64_16(raw).tolist() == [CityHash64(i.encode()) for i in ids]
    stamp = 1_796_544_032_298
    got = get_store().query(
        "SELECT cityHash64(toFixedString({s:String}, 16), fromUnixTimestamp64Milli(toInt64({t:Int64}), 'UTC')) AS h",
        {"s": ids[0], "t": stamp}, tag="tests.fresh_spans.hash").scalar()
    mine = fresh_spans.combine(fresh_spans.city_hash64_16(raw[:1]), np.array([fresh_spans.city_hash64_ms(stamp)], np.uint64))
    assert int(got) == int(mine[0])


def test_the_spans_held_are_what_a_read_of_spans_returns(project_with_key):
    """Every column the summaries read, value for value: span ids shorter than the FixedString
    (NUL-padded as stored), a copy sent again in a later insert, missing figures, errors, load-test traffic, and
    the digest's hash of each copy's id and arrival."""
    store = get_store()
    project, _ = project_with_key()
    fresh = attach()
    a, b = llm_trace(), llm_trace(error=True)
    b[1]["attributes"] = {"loadtest.run_id": "run-7"}
    b[3].update(ttft_ms=42.5, input_tokens=30, output_tokens=7, cost_usd=0.0125)
    store.insert("spans", rows_of(project.pk, a + b), tag="tests.fresh_spans.spans")
    tid = "7" * 32
    short = [{**s, "trace_id": tid, "span_id": f"s{i}", "parent_span_id": None if i == 0 else "s0"} for i, s in enumerate(a)]
    rows = rows_of(project.pk, a[:2]) + [dict(r, trace_id=s["trace_id"], span_id=s["span_id"], parent_span_id=s["parent_span_id"] or "")
                                         for r, s in zip(rows_of(project.pk, a), short)]
    time.sleep(0.002)
    store.insert("spans", rows, tag="tests.fresh_spans.again")  # a's first two again; a trace with short span ids
    ids = sorted({a[0]["trace_id"], b[0]["trace_id"], tid})
    window = fresh.window(project.pk, fresh.since_ms, settle(), 10**9)
    assert window is not None and window.spans == len(a) + len(b) + 2 + len(short)
    held = window.spans_of(ids, PRICES_JSON)
    read = store.query_arrow(summary_arrays.spans_sql(trace_filter="trace_id IN (SELECT arrayJoin(splitByChar(',', {ids:String})))"),
                             {"project_id": project.pk, "prices": PRICES_JSON, "ids": ",".join(ids)}, tag="tests.fresh_spans.read")
    assert held.column_names == read.column_names
    order = [("trace_id", "ascending"), ("sid", "ascending"), ("ingested", "ascending")]
    held, read = held.sort_by(order), read.sort_by(order)
    for name in read.column_names:
        assert held.column(name).to_pylist() == read.column(name).to_pylist(), name
    assert set(held.column("loadtest").to_pylist()) == {0, 1}
    assert len(set(held.column("ingested").to_pylist())) == 2


def test_the_summariser_reads_neither_the_arrivals_nor_a_new_traces_spans(project_with_key, settings, monkeypatch):
    """After the project's first run (its watermark lies before the memory's start), runs take what
    arrived and the new traces' spans from memory, and the earlier spans of a trace summarised
    without its root when its root comes (spans sent as they end); a trace that grows after its root
    came, or whose earlier spans the memory lost, is read. Every summary equals the reference trace
    math over the stored spans."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    settings.TRACEDASH_SUMMARY_ENGINE = "arrays"
    store = get_store()
    project, _ = project_with_key()
    fresh = attach()
    first, second, third, fourth, fifth = (llm_trace() for _ in range(5))
    store.insert("spans", rows_of(project.pk, first), tag="tests.fresh_spans.spans")
    summarizer.traces_summarize(project_ids=[project.pk])  # the first run: by the store
    tags = []
    real_query, real_arrow = store.query, store.query_arrow

    def spy(kind):
        def call(sql, params=None, *, tag):
            tags.append(tag)
            return (real_query if kind == "query" else real_arrow)(sql, params, tag=tag)
        return call

    def run(spans):
        tags.clear()
        time.sleep(0.002)
        store.insert("spans", rows_of(project.pk, spans), tag="tests.fresh_spans.spans")
        summarizer.traces_summarize(project_ids=[project.pk])
        return "analytics.summarizer.spans" in tags

    # on the instance, for this test alone (monkeypatch removes them again: others patch the class)
    monkeypatch.setattr(store, "query", spy("query"))
    monkeypatch.setattr(store, "query_arrow", spy("arrow"))
    before = dict(fresh.stats)
    assert not run(second + third[1:] + fourth + fifth[1:3])
    assert fresh.stats["windows"] == before["windows"] + 1
    assert not {"analytics.summarizer.touched", "analytics.summarizer.bound"} & set(tags), tags
    assert fresh.kept_rows == len(third[1:]) + 2, "the rootless traces' spans are kept"
    assert not run(third[:1] + fifth[3:4]), "third's root and a child of fifth, both from memory"
    assert run(third[:1]), "its root sent again (a retry): a trace summarised with its root is no longer kept"
    late = dict(fourth[2], span_id="f" * 16, name="late", start_time=fourth[2]["start_time"] + 5 * MS)
    assert run([late]), "a trace summarised with its root that grows is read"
    fresh.reset()  # e.g. a failed insert: what was kept may no longer be what is stored
    assert run(fifth[:1]), "its earlier spans are no longer held: read"
    assert "analytics.summarizer.touched" in tags, "and the window, just after a reset, too"
    monkeypatch.undo()
    rows = {r["trace_id"]: r for r in store.query(
        "SELECT *, toUnixTimestamp64Nano(start_time) AS start_time_ns, toUnixTimestamp64Nano(spans_start) AS spans_start_ns,"
        " toUnixTimestamp64Nano(spans_end) AS spans_end_ns FROM traces FINAL WHERE project_id = {p:UInt64}",
        {"p": project.pk}, tag="tests.fresh_spans.latest").dicts()}
    assert len(rows) == 5
    for spans in (first, second, third, fourth, fifth):
        tid = spans[0]["trace_id"]
        want = summarizer.trace_row(project_id=project.pk, trace_id=tid, spans=_stored(project.pk, tid), prices={}, version=1)
        for field in ("span_count", "has_root", "e2e_ns", "input_tokens", "output_tokens", "inference_ns", "network_ns",
                      "preprocess_ns", "postprocess_ns", "other_ns", "ttft_ns", "status", "error_spans", "root_name",
                      "cost_usd"):
            assert rows[tid][field] == want[field], (tid, field)
        for field in ("start_time", "spans_start", "spans_end"):
            assert rows[tid][field + "_ns"] == want[field], (tid, field)
    assert rows[fourth[0]["trace_id"]]["span_count"] == 6
    assert fresh.rows == 0, "what was summarised is let go"


def _children_held(project_with_key):
    """A project whose trace's children (not its root) were stored and are held: (store, project,
    memory, the trace, its id, the end of their window, the digest a summary of them carries, as
    ClickHouse adds it up)."""
    store = get_store()
    project, _ = project_with_key()
    fresh = attach()
    trace = llm_trace()
    tid = trace[0]["trace_id"]
    store.insert("spans", rows_of(project.pk, trace[1:]), tag="tests.fresh_spans.spans")
    until = settle()
    window = fresh.window(project.pk, fresh.since_ms, until, 10**9)
    with np.errstate(over="ignore"):  # the digest a summary of these copies carries, as ClickHouse adds it up
        digest = int(np.add.reduce(fresh_spans._copy_hashes(window.table), dtype=np.uint64)
                     + np.uint64(CityHash64(PRICES_JSON.encode())))
    return store, project, fresh, trace, tid, until, digest


def test_a_trace_that_grows_is_read_unless_the_copies_held_are_its_summarys(project_with_key):
    """``Window.grown`` serves a trace's earlier spans from memory only where the copies kept add up
    to its latest summary's digest (prices included): a copy missing, one too many, or a summary
    made with another price table, and the trace is read."""
    store, project, fresh, trace, tid, until, digest = _children_held(project_with_key)
    fresh.consumed(project.pk, until, keep=[tid])
    time.sleep(0.002)
    store.insert("spans", rows_of(project.pk, trace[:1]), tag="tests.fresh_spans.spans")
    window = fresh.window(project.pk, until, settle(), 10**9)
    assert window.grown({tid: digest}, PRICES_JSON) == [tid]
    spans = window.spans_of([tid], PRICES_JSON)
    assert spans.num_rows == 5 and len(set(spans.column("ingested").to_pylist())) == 2
    assert window.grown({tid: digest + 1}, PRICES_JSON) == [], "not the copies the summary saw"
    other = summary_sql.prices_json({"gpt-4o-mini": (0.3, 1.2)})
    assert window.grown({tid: digest}, other) == [], "a summary made with another price table"
    assert window.grown({"9" * 32: digest}, PRICES_JSON) == [], "nothing held"


def test_a_failed_insert_or_a_statement_on_spans_starts_over(project_with_key):
    """An insert that raised (its rows may be stored all the same) and a statement that writes
    ``spans`` make the memory start over: a window that began before is read from the store.
    While such a statement runs, nothing is served."""
    store = get_store()
    project, _ = project_with_key()
    fresh = attach()
    since = fresh.since_ms
    store.insert("spans", rows_of(project.pk, llm_trace()), tag="tests.fresh_spans.spans")
    assert fresh.window(project.pk, since, settle(), 10**9) is not None
    bad = rows_of(project.pk, llm_trace())
    bad[0]["duration_ns"] = "soon"  # refused
    with pytest.raises(StoreError):
        store.insert("spans", bad, tag="tests.fresh_spans.bad")
    assert fresh.window(project.pk, since, settle(), 10**9) is None
    assert fresh.since_ms > since
    since = fresh.since_ms
    time.sleep(0.002)
    store.insert("spans", rows_of(project.pk, llm_trace()), tag="tests.fresh_spans.spans")
    assert fresh.window(project.pk, since, settle(), 10**9).spans == 5
    fresh.on_command_start("ALTER TABLE spans DELETE WHERE name = 'x'", "tests.fresh_spans.delete")
    assert fresh.window(project.pk, since, settle(), 10**9) is None, "a statement on spans is running"
    fresh.on_command("ALTER TABLE spans DELETE WHERE name = 'x'", "tests.fresh_spans.delete")
    assert fresh.window(project.pk, since, settle(), 10**9) is None and fresh.since_ms > since
    since = fresh.since_ms
    time.sleep(0.002)
    store.command("INSERT INTO traces_by_start SELECT * FROM traces_by_start WHERE 0", tag="tests.fresh_spans.other")
    store.insert("spans", rows_of(project.pk, llm_trace()), tag="tests.fresh_spans.spans")
    assert fresh.window(project.pk, since, settle(), 10**9).spans == 5, "a statement on another table changes nothing"


def test_a_backlog_stops_where_the_store_would_stop_it(project_with_key, settings):
    """More arrivals than a run takes: the window ends exactly where the summariser's read of
    ``ingested_at`` would end it (before the insert past the limit; after the first, when it alone
    is over)."""
    store = get_store()
    project, _ = project_with_key()
    fresh = attach()
    since = fresh.since_ms
    for _ in range(4):
        time.sleep(0.002)
        store.insert("spans", rows_of(project.pk, llm_trace() + llm_trace()), tag="tests.fresh_spans.spans")
    until = settle()
    for limit in (3, 10, 15, 25, 40, 1000):
        window = fresh.window(project.pk, since, until, limit)
        settings.TRACEDASH_SUMMARIZE_MAX_SPANS = limit
        assert window.until_ms == summarizer._bounded_until(project_id=project.pk, since_ms=since, until_ms=until), limit
        assert window.spans == store.query(
            "SELECT count() FROM spans WHERE project_id = {p:UInt64} AND ingested_at >= fromUnixTimestamp64Milli({a:Int64})"
            " AND ingested_at < fromUnixTimestamp64Milli({b:Int64})", {"p": project.pk, "a": since, "b": window.until_ms},
            tag="tests.fresh_spans.count").scalar()


def test_the_oldest_arrivals_go_first_when_too_many_are_held(project_with_key, monkeypatch):
    """Over MAX_ROWS, or older than MAX_AGE_MS, the oldest inserts are let go: their projects read
    the store until their runs are past them; another project's window is still served."""
    monkeypatch.setattr(fresh_spans, "MAX_ROWS", 12)
    store = get_store()
    one, _ = project_with_key()
    two, _ = project_with_key()
    fresh = attach()
    since = fresh.since_ms
    store.insert("spans", rows_of(one.pk, llm_trace()), tag="tests.fresh_spans.spans")
    time.sleep(0.002)
    store.insert("spans", rows_of(two.pk, llm_trace()), tag="tests.fresh_spans.spans")
    time.sleep(0.002)
    store.insert("spans", rows_of(two.pk, llm_trace()), tag="tests.fresh_spans.spans")  # 15 > 12: project one's goes
    until = settle()
    assert fresh.window(one.pk, since, until, 10**9) is None
    assert fresh.window(two.pk, since, until, 10**9).spans == 10
    assert fresh.window(one.pk, until, until + 1, 10**9) is not None, "past the insert let go"
    monkeypatch.setattr(fresh_spans, "MAX_AGE_MS", 1)
    time.sleep(0.003)
    store.insert("spans", rows_of(one.pk, llm_trace()), tag="tests.fresh_spans.spans")  # the others are too old now
    until = settle()
    assert fresh.window(two.pk, since, until, 10**9) is None, "an insert no run took for too long is let go"
    assert fresh.rows == 5, "only the newest insert is held"


def test_nothing_acknowledged_is_missed_while_inserts_and_runs_overlap(project_with_key, settings):
    """Inserts from three threads while the summariser runs again and again: every trace's summary
    holds every span stored (a run stops before the inserts still running, and an insert is held
    before it stops counting as one)."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    settings.TRACEDASH_SUMMARY_ENGINE = "arrays"
    store = get_store()
    project, _ = project_with_key()
    fresh = attach()
    summarizer.traces_summarize(project_ids=[project.pk])
    stop = threading.Event()
    sent: list[str] = []
    errors: list[BaseException] = []

    def send():
        try:
            while not stop.is_set():
                traces = [llm_trace() for _ in range(3)]
                sent.extend(t[0]["trace_id"] for t in traces)
                store.insert("spans", rows_of(project.pk, [s for t in traces for s in t]), tag="tests.fresh_spans.spans")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=send) for _ in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 3.0
    runs = 0
    while time.monotonic() < deadline:
        summarizer.traces_summarize(project_ids=[project.pk])
        runs += 1
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors
    time.sleep(0.003)
    summarizer.traces_summarize(project_ids=[project.pk])
    assert fresh.stats["windows"] >= 2, fresh.stats
    counts = {r["trace_id"]: (r["span_count"], r["has_root"]) for r in store.query(
        "SELECT trace_id, span_count, has_root FROM traces FINAL WHERE project_id = {p:UInt64}",
        {"p": project.pk}, tag="tests.fresh_spans.latest").dicts()}
    assert runs >= 2 and sent and set(sent) <= set(counts)
    assert {counts[t] for t in sent} == {(5, 1)}


def test_a_quiet_project_is_served_from_memory_from_its_first_spans_on(project_with_key, settings):
    """A project's first runs after a start read the store (its watermark lies before the memory's
    start); once one finds none of its spans up to past the memory's start, the next window, the
    first with spans, comes from memory. A start-over forgets it."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    settings.TRACEDASH_SUMMARY_ENGINE = "arrays"
    store = get_store()
    project, _ = project_with_key()
    store.insert("spans", rows_of(project.pk, llm_trace()), tag="tests.fresh_spans.spans")
    summarizer.traces_summarize(project_ids=[project.pk])  # the watermark: now
    fresh = fresh_spans.fresh_for(get_store())
    fresh.reset()  # the memory starts after the watermark, as after a restart
    time.sleep(0.003)
    before = dict(fresh.stats)
    summarizer.traces_summarize(project_ids=[project.pk])  # nothing arrived: read from the store, found none
    assert fresh.stats["store"] == before["store"] + 1
    store.insert("spans", rows_of(project.pk, llm_trace()), tag="tests.fresh_spans.spans")
    settle()
    summarizer.traces_summarize(project_ids=[project.pk])
    assert fresh.stats["windows"] == before["windows"] + 1 and fresh.stats["store"] == before["store"] + 1
    assert store.query("SELECT count() FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": project.pk},
                       tag="tests.fresh_spans.count").scalar() == 2
    fresh.reset()
    store.insert("spans", rows_of(project.pk, llm_trace()), tag="tests.fresh_spans.spans")
    settle()
    summarizer.traces_summarize(project_ids=[project.pk])
    assert fresh.stats["store"] == before["store"] + 2, "after a start-over, the store again"
    assert store.query("SELECT count() FROM traces FINAL WHERE project_id = {p:UInt64}", {"p": project.pk},
                       tag="tests.fresh_spans.count").scalar() == 3


def test_the_spans_kept_for_traces_that_grow_are_bounded(project_with_key, monkeypatch):
    """Over MAX_HISTORY_BYTES the oldest kept spans go: a trace whose earlier spans went is read back
    (``Window.grown`` leaves it out)."""
    store, project, fresh, trace, tid, until, digest = _children_held(project_with_key)
    monkeypatch.setattr(fresh_spans, "MAX_HISTORY_BYTES", 1)
    fresh.consumed(project.pk, until, keep=[tid])
    assert fresh.kept_rows == 0 and fresh.kept_bytes == 0
    time.sleep(0.002)
    store.insert("spans", rows_of(project.pk, trace[:1]), tag="tests.fresh_spans.spans")
    assert fresh.window(project.pk, until, settle(), 10**9).grown({tid: digest}, PRICES_JSON) == []


def test_a_kept_trace_asked_for_in_a_window_without_arrivals(project_with_key):
    """Found by the property test: a trace kept whole, asked for in a window where nothing of the
    project arrived, gives its kept spans (the window's empty table has none of the columns)."""
    store, project, fresh, trace, tid, until, digest = _children_held(project_with_key)
    fresh.consumed(project.pk, until, keep=[tid])
    empty = fresh.window(project.pk, until, settle(), 10**9)
    assert empty.spans == 0 and empty.grown({tid: digest}, PRICES_JSON) == [tid]
    assert empty.spans_of([tid], PRICES_JSON).num_rows == 4
