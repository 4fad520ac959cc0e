"""The summariser fills the traces table from newly ingested spans: incremental, idempotent,
late spans re-summarise their trace, prices estimate missing costs, live event sent."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer

from analytics import fresh_spans, summarizer
from analytics.prices import model_price_set, prices_for_project
from ingest.schemas import Limits, parse_span
from ingest.services import traces_group
from store import get_store
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
MS = 1_000_000


@pytest.fixture(params=["arrays", "sql"])
def engine(request, settings):
    """Each summary engine in turn (TRACEDASH_SUMMARY_ENGINE): the summariser's behaviour is the same."""
    settings.TRACEDASH_SUMMARY_ENGINE = request.param
    return request.param


def test_auto_engine_is_arrays_on_the_embedded_store_and_sql_on_a_server(settings):
    from types import SimpleNamespace

    settings.TRACEDASH_SUMMARY_ENGINE = "auto"
    assert summarizer.summary_engine(get_store()) == "arrays"
    assert summarizer.summary_engine(SimpleNamespace(kind="native")) == "sql"
    settings.TRACEDASH_SUMMARY_ENGINE = "sql"
    assert summarizer.summary_engine(get_store()) == "sql"


def insert(project_id, spans):
    rows = [parse_span(json.dumps(s).encode(), project_id=project_id, limits=Limits()) for s in spans]
    get_store().insert("spans", rows, tag="tests.summarizer.spans")


def latest(project_id):
    return {r["trace_id"]: r for r in get_store().query(
        "SELECT *, toUnixTimestamp64Nano(start_time) AS start_ns FROM traces FINAL WHERE project_id = {p:UInt64}",
        {"p": project_id}, tag="tests.summarizer.read").dicts()}


def versions(project_id):
    return get_store().query("SELECT count() FROM traces WHERE project_id = {p:UInt64}", {"p": project_id},
                             tag="tests.summarizer.count").scalar()


def test_summarises_new_traces_once_per_change(engine, project_with_key):
    project, _ = project_with_key()
    other, _ = project_with_key()
    start = time.time_ns() - 60 * 1_000_000_000
    t1, t2 = llm_trace(start_ns=start), llm_trace(start_ns=start + 5000 * MS, error=True, model="gpt-4o")
    insert(project.pk, t1 + t2)
    insert(other.pk, llm_trace(start_ns=start))
    report = summarizer.traces_summarize(project_ids=[project.pk])
    assert report.traces == 2 and report.spans == 10
    rows = latest(project.pk)
    a, b = rows[t1[0]["trace_id"]], rows[t2[0]["trace_id"]]
    assert a["e2e_ns"] == 1200 * MS and a["has_root"] == 1 and a["root_name"] == "chat"
    assert a["inference_ns"] == 900 * MS and a["network_ns"] == 80 * MS and a["other_ns"] == 40 * MS
    assert a["ttft_ns"] == int(210.5 * MS) and a["input_tokens"] == 812 and a["output_tokens"] == 164
    assert a["model"] == "gpt-4o-mini" and a["services"] == ["chat-api"] and a["span_count"] == 5
    assert a["spans_start"] is not None and a["start_ns"] == start
    assert b["status"] == "error" and b["error_message"] == "upstream timeout" and b["model"] == "gpt-4o"
    assert latest(other.pk) == {}, "only the project asked for"
    # Nothing new: the overlap re-reads the same traces at most; nothing changes in what is shown.
    before = latest(project.pk)
    summarizer.traces_summarize(project_ids=[project.pk])
    after = latest(project.pk)
    for tid in before:
        assert {k: v for k, v in before[tid].items() if k != "version"} == {k: v for k, v in after[tid].items() if k != "version"}


def test_late_spans_and_resent_spans_resummarise(engine, project_with_key, settings):
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    start = time.time_ns() - 3600 * 1_000_000_000  # an hour ago
    spans = llm_trace(start_ns=start)
    tid = spans[0]["trace_id"]
    root, children = spans[0], spans[1:]
    insert(project.pk, children)  # the children arrive first (the root ends last)
    summarizer.traces_summarize(project_ids=[project.pk])
    partial = latest(project.pk)[tid]
    assert partial["has_root"] == 0 and partial["span_count"] == 4
    time.sleep(0.01)
    insert(project.pk, [root] + children[:1])  # the root arrives late, one child is re-sent
    summarizer.traces_summarize(project_ids=[project.pk])
    full = latest(project.pk)[tid]
    assert full["has_root"] == 1 and full["span_count"] == 5 and full["e2e_ns"] == 1200 * MS
    assert full["version"] > partial["version"]
    # the minute of the new start and of the old one are marked for the rollups
    marked = {r[0] for r in get_store().query(
        "SELECT toUnixTimestamp(bucket) FROM rollup_dirty WHERE project_id = {p:UInt64}", {"p": project.pk},
        tag="tests.summarizer.dirty").rows}
    assert (start // 1_000_000_000) // 60 * 60 in marked


def test_a_summary_whose_start_moved_retires_its_old_start(engine, project_with_key, settings):
    """The children arrive first (the summary starts at the first child), then the root, which starts
    earlier: ``traces_by_start`` keeps a row under each start, and the old one is retired (a row with
    no spans, one version below the summary that moved it), so the window reads see the trace once,
    at its new start. Moving back to the first start later makes that start live again."""
    from datetime import datetime, timezone

    from analytics import panel_selectors

    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    start = time.time_ns() - 3600 * 1_000_000_000
    spans = llm_trace(start_ns=start)
    tid, root, children = spans[0]["trace_id"], spans[0], spans[1:]
    root.update(start_time=start - 90_000 * MS, duration_ms=root["duration_ms"] + 90_000)  # 1.5 min earlier
    insert(project.pk, children)
    summarizer.traces_summarize(project_ids=[project.pk])
    partial = latest(project.pk)[tid]
    assert partial["start_ns"] == start and partial["has_root"] == 0
    time.sleep(0.01)
    insert(project.pk, [root])
    summarizer.traces_summarize(project_ids=[project.pk])
    full = latest(project.pk)[tid]
    assert full["start_ns"] == root["start_time"] and full["has_root"] == 1
    by_start = get_store().query(
        "SELECT toUnixTimestamp64Nano(start_time) AS start_ns, span_count, version FROM traces_by_start FINAL"
        " WHERE project_id = {p:UInt64} AND trace_id = {t:FixedString(32)} ORDER BY start_ns",
        {"p": project.pk, "t": tid}, tag="tests.summarizer.by_start").rows
    assert by_start == [(root["start_time"], 5, full["version"]), (start, 0, full["version"] - 1)]

    def requests(lo_ns: int, hi_ns: int) -> int:
        return panel_selectors.window_stats(project_id=project.pk, start=datetime.fromtimestamp(lo_ns / 1e9, tz=timezone.utc),
                                            end=datetime.fromtimestamp(hi_ns / 1e9, tz=timezone.utc)).requests
    live = ("SELECT count() FROM (" + panel_selectors.window_requests_sql("trace_id") + ")")
    window = {"project_id": project.pk, "service": "", "model": ""}

    def listed(lo_ns: int, hi_ns: int) -> int:
        return get_store().query(live, {**window, "start_ms": lo_ns // MS, "end_ms": hi_ns // MS}, tag="tests.summarizer.live").scalar()
    assert listed(start - 120_000 * MS, start + 60_000 * MS) == 1
    assert listed(start - 30_000 * MS, start + 60_000 * MS) == 0  # only the retired start is inside
    # The root is re-sent with the children's start: the summary moves back, the other start retires.
    time.sleep(0.01)
    insert(project.pk, [dict(root, start_time=start, duration_ms=1200.0)])
    summarizer.traces_summarize(project_ids=[project.pk])
    again = latest(project.pk)[tid]
    assert again["start_ns"] == start and again["version"] > full["version"]
    assert listed(start - 30_000 * MS, start + 60_000 * MS) == 1
    assert listed(start - 120_000 * MS, start - 60_000 * MS) == 0


def test_price_table_estimates_missing_cost(engine, project_with_key):
    project, _ = project_with_key()
    model_price_set(project_id=project.pk, model="llama-3-70b", input_usd_per_million="0.5", output_usd_per_million=2)
    assert prices_for_project(project_id=project.pk) == {"llama-3-70b": (0.5, 2.0)}
    spans = llm_trace(model="llama-3-70b")
    for s in spans:
        s.pop("cost_usd", None)
    insert(project.pk, spans)
    summarizer.traces_summarize(project_ids=[project.pk])
    row = latest(project.pk)[spans[0]["trace_id"]]
    assert row["cost_estimated"] == 1
    assert row["cost_usd"] == pytest.approx((812 * 0.5 + 164 * 2.0) / 1e6)


def test_price_validation_names_the_field(project_with_key):
    from django.core.exceptions import ValidationError

    project, _ = project_with_key()
    with pytest.raises(ValidationError) as err:
        model_price_set(project_id=project.pk, model="m", input_usd_per_million="-1", output_usd_per_million=1)
    assert "input_usd_per_million" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        model_price_set(project_id=project.pk, model=" ", input_usd_per_million=1, output_usd_per_million="x")
    assert "model" in err.value.message_dict


def test_live_event_names_the_summarised_traces(project_with_key):
    project, _ = project_with_key()
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(traces_group(project.pk), channel)
    spans = llm_trace()
    insert(project.pk, spans)
    summarizer.traces_summarize(project_ids=[project.pk])
    event = async_to_sync(layer.receive)(channel)
    assert event["type"] == "traces.summarized" and event["trace_ids"] == [spans[0]["trace_id"]]
    json.dumps(event)  # serialisable for a Redis channel layer


def test_rebuild_summarises_a_time_range(project_with_key):
    project, _ = project_with_key()
    base = time.time_ns() - 5 * 3600 * 1_000_000_000
    traces = [llm_trace(start_ns=base + i * 1800 * 1_000_000_000) for i in range(6)]
    insert(project.pk, [s for t in traces for s in t])
    seen = []
    n = summarizer.traces_rebuild(project_id=project.pk, from_ns=base, to_ns=base + 3 * 3600 * 1_000_000_000,
                                  progress=lambda done, total, count: seen.append((done, total, count)))
    assert n == 6 and seen[-1][0] == seen[-1][1]
    assert set(latest(project.pk)) == {t[0]["trace_id"] for t in traces}


def test_command_rebuilds_summaries_and_rollups(project_with_key, capsys):
    from django.core.management import call_command

    from analytics import rollups

    project, _ = project_with_key(name="bulk-loaded")
    base = time.time_ns() - 2 * 86400 * 1_000_000_000
    traces = [llm_trace(start_ns=base + i * 600 * 1_000_000_000) for i in range(12)]
    insert(project.pk, [s for t in traces for s in t])
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base / 1e9 - 60))
    call_command("summarize_traces", "--project", "bulk-loaded", "--since", since)
    out = capsys.readouterr()
    assert "summarised 12 traces" in out.out and "rollups" in out.err and "100.0%" in out.err
    assert len(latest(project.pk)) == 12
    from datetime import datetime, timezone

    stats = rollups.window_stats(project_id=project.pk, start=datetime.fromtimestamp(base / 1e9 - 60, tz=timezone.utc),
                                 end=datetime.now(timezone.utc))
    assert stats.requests == 12 and stats.e2e_ms[0.5] == pytest.approx(1200, rel=0.005)
    marks = get_store().query("SELECT count() FROM rollup_dirty WHERE project_id = {p:UInt64}", {"p": project.pk},
                              tag="tests.summarizer.marks").scalar()
    assert marks == 0  # its rollups are rebuilt by the command: nothing left for the task to redo


@pytest.mark.django_db
def test_command_names_bad_arguments():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="no project"):
        call_command("summarize_traces", "--project", "absent")


def test_a_backlog_is_worked_off_over_several_runs(project_with_key, settings):
    settings.TRACEDASH_SUMMARIZE_MAX_SPANS = 12
    project, _ = project_with_key()
    batches = [[llm_trace() for _ in range(2)] for _ in range(3)]  # three inserts of 10 spans
    for batch in batches:
        insert(project.pk, [s for t in batch for s in t])
        time.sleep(0.01)  # a later ingested_at
    wanted = {t[0]["trace_id"] for batch in batches for t in batch}
    first = summarizer.traces_summarize(project_ids=[project.pk])
    assert 0 < first.traces < 6  # capped: not the whole backlog at once
    for _ in range(4):
        summarizer.traces_summarize(project_ids=[project.pk])
    assert set(latest(project.pk)) == wanted
    # one insert larger than the limit is still taken whole
    settings.TRACEDASH_SUMMARIZE_MAX_SPANS = 1
    big = [llm_trace() for _ in range(3)]
    insert(project.pk, [s for t in big for s in t])
    for _ in range(2):
        summarizer.traces_summarize(project_ids=[project.pk])
    assert {t[0]["trace_id"] for t in big} <= set(latest(project.pk))


@pytest.mark.django_db(transaction=True)
def test_open_pages_receive_the_summarized_event(project_with_key, make_user):
    """Through the real consumer: a member's socket gets ``traces.summarized`` after a run."""
    from channels.testing import WebsocketCommunicator

    from config.asgi import application
    from tests.test_live import _session_headers

    async def scenario():
        alice = await sync_to_async(make_user)()
        project, _ = await sync_to_async(project_with_key)(members=[alice])
        member = WebsocketCommunicator(application, f"/ws/projects/{project.pk}/traces/",
                                       headers=await sync_to_async(_session_headers)(alice))
        assert (await member.connect())[0]
        spans = llm_trace()
        await sync_to_async(insert)(project.pk, spans)
        report = await sync_to_async(summarizer.traces_summarize)(project_ids=[project.pk])
        assert report.traces == 1
        assert await member.receive_json_from(timeout=5) == {
            "type": "traces.summarized", "count": 1, "trace_ids": [spans[0]["trace_id"]]}
        await member.disconnect()

    async_to_sync(scenario)()


def test_the_overlap_does_not_rewrite_unchanged_traces_but_any_change_does(engine, project_with_key, monkeypatch):
    # A server store cannot tell which inserts are still running (other processes write too): the
    # run re-reads an overlap before its watermark. Here the embedded store answers as a server does.
    monkeypatch.setattr(get_store(), "settled_until_ms", lambda table: None)
    project, _ = project_with_key()
    start = time.time_ns() - 60 * 1_000_000_000
    spans = llm_trace(start_ns=start)
    tid = spans[0]["trace_id"]
    insert(project.pk, spans)
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 1
    first = latest(project.pk)[tid]
    # The next runs re-read the trace (overlap) and find nothing new: nothing is summarised or written.
    again = summarizer.traces_summarize(project_ids=[project.pk])
    assert again.spans == 0 and again.traces == 0 and versions(project.pk) == 1
    # A span re-sent with other content (same id) changes the trace: summarised again.
    time.sleep(0.01)
    insert(project.pk, [{**spans[0], "name": "chat (renamed)"}])
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 1
    renamed = latest(project.pk)[tid]
    assert renamed["root_name"] == "chat (renamed)" and renamed["version"] > first["version"]
    # The summary row vanished (e.g. the table was emptied): the next run writes it again.
    get_store().command("TRUNCATE TABLE traces", tag="tests.summarizer.truncate")
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 1
    assert latest(project.pk)[tid]["root_name"] == "chat (renamed)"
    # A price change is a change too.
    model_price_set(project_id=project.pk, model=spans[0].get("model") or "gpt-4o-mini", input_usd_per_million="1",
                    output_usd_per_million="2")
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 1
    # A rebuild (manage.py summarize_traces) always writes.
    assert summarizer.traces_rebuild(project_id=project.pk, from_ns=start - 1, to_ns=start + 1) == 1


def test_the_digest_check_runs_only_where_an_overlap_is_re_read(project_with_key, monkeypatch):
    """Without an overlap (the embedded store) every touched trace has a span its latest summary has
    not seen, so the run does not read the spans' digests; with one (a server) it does."""
    from store.backends import EmbeddedBackend

    store = get_store()
    if not isinstance(store.backend, EmbeddedBackend):
        pytest.skip("a server store always re-reads the overlap")
    tags: list[str] = []
    real_timed = store._timed
    monkeypatch.setattr(store, "_timed", lambda kind, tag, started: (tags.append(tag), real_timed(kind, tag, started)))
    project, _ = project_with_key()
    insert(project.pk, llm_trace(start_ns=time.time_ns() - 30_000 * MS))
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 1
    assert "analytics.summarizer.write" in tags and "analytics.summarizer.changed" not in tags
    tags.clear()
    monkeypatch.setattr(store, "settled_until_ms", lambda table: None)  # as a server answers
    insert(project.pk, llm_trace(start_ns=time.time_ns() - 20_000 * MS))
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 1
    assert "analytics.summarizer.changed" in tags


def test_on_the_embedded_store_a_run_stops_before_an_insert_still_running(project_with_key):
    """No overlap is re-read on the embedded store: the run reads up to the oldest insert still
    running (its rows are stamped after it began and may become visible after the run), and the
    next run reads them from there."""
    import threading

    from store.backends import EmbeddedBackend

    store = get_store()
    if not isinstance(store.backend, EmbeddedBackend):
        pytest.skip("the embedded store's own bound; a server store re-reads the overlap (test above)")
    project, _ = project_with_key()
    now = time.time_ns()
    first, late = llm_trace(start_ns=now - 30_000 * MS), llm_trace(start_ns=now - 20_000 * MS)
    insert(project.pk, first)
    backend = store.backend
    real_insert, entered, release = backend._insert, threading.Event(), threading.Event()

    def held_insert(*args, **kwargs):  # the insert has begun (its start is registered) but is not done
        entered.set()
        assert release.wait(60)
        return real_insert(*args, **kwargs)

    backend._insert = held_insert
    try:
        began = time.time_ns() // 1_000_000
        sender = threading.Thread(target=insert, args=(project.pk, late))
        sender.start()
        assert entered.wait(60)
        backend._insert = real_insert  # only the held insert waits
        time.sleep(0.01)
        report = summarizer.traces_summarize(project_ids=[project.pk])
        assert report.traces == 1 and set(latest(project.pk)) == {first[0]["trace_id"]}
        held_start = store.settled_until_ms("spans")  # the running insert's start, while it runs
        assert began <= held_start < time.time_ns() // 1_000_000
        # The run stopped there, not at the clock.
        assert summarizer.watermark_get(project_id=project.pk, job=summarizer.JOB) == held_start
    finally:
        backend._insert = real_insert
        release.set()
        sender.join(60)
    report = summarizer.traces_summarize(project_ids=[project.pk])
    assert report.traces == 1 and set(latest(project.pk)) == {first[0]["trace_id"], late[0]["trace_id"]}
    assert summarizer.traces_summarize(project_ids=[project.pk]).traces == 0  # and nothing is re-read


@pytest.mark.parametrize("store_kind", ["embedded", "server"])
def test_one_insert_over_the_span_limit_after_a_quiet_spell_is_summarised(project_with_key, settings, monkeypatch,
                                                                            store_kind):
    """A run bounded by TRACEDASH_SUMMARIZE_MAX_SPANS stopped before the first insert past the
    limit; when that was the first arrival since the watermark (nothing in the overlap either),
    every run read nothing and the watermark never moved: the insert was never summarised."""
    if store_kind == "server":
        monkeypatch.setattr(get_store(), "settled_until_ms", lambda table: None)
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    settings.TRACEDASH_SUMMARIZE_MAX_SPANS = 3
    project, _ = project_with_key()
    insert(project.pk, llm_trace())
    summarizer.traces_summarize(project_ids=[project.pk])  # a watermark, then a quiet spell
    time.sleep(0.01)
    big = [llm_trace() for _ in range(2)]  # one insert of 10 spans
    insert(project.pk, [s for t in big for s in t])
    for _ in range(3):
        summarizer.traces_summarize(project_ids=[project.pk])
    assert {t[0]["trace_id"] for t in big} <= set(latest(project.pk))


def test_a_long_lived_trace_that_grows_is_read_apart(engine, project_with_key, settings, monkeypatch):
    """A trace whose earlier spans started long before the rest of the run's (an agent's session,
    ten minutes long, growing run after run) is read apart, by id, so that it does not widen the
    others' read to its whole lifetime. Every summary stays exact: spans that arrived late, re-sent
    copies (counted once), roots that came last."""
    settings.TRACEDASH_SUMMARIZE_OVERLAP_SECONDS = 0
    project, _ = project_with_key()
    now = time.time_ns()
    reads = []
    real_write = summarizer._write

    def kind(spans):
        return "memory" if isinstance(spans, pa.Table) else "apart" if spans == summarizer._FEW_SPANS_SQL else "range"

    def spy(store, batch_reads, **kwargs):
        reads.extend((sorted(t["trace_id"] for t in traces), kind(spans)) for traces, spans, _ in batch_reads)
        return real_write(store, batch_reads, **kwargs)

    monkeypatch.setattr(summarizer, "_write", spy)
    arrays = summarizer.summary_engine(get_store()) == "arrays"
    if arrays:
        fresh_spans.fresh_for(get_store())  # from the first insert on, the new traces' spans are in memory
    agent = llm_trace(start_ns=now - 600_000 * MS, name="agent-session")
    agent[0]["duration_ms"] = 660_000.0
    step = {**agent[1], "span_id": "a1" * 8, "start_time": now - 2_000 * MS}  # a step of the session, just now
    a, b, c = (llm_trace(start_ns=now - k * 3_000 * MS) for k in (3, 2, 1))
    tid = {name: spans[0]["trace_id"] for name, spans in (("agent", agent), ("a", a), ("b", b), ("c", c))}

    insert(project.pk, agent[:2] + a[1:])  # the session's start; a's children (its root ends last)
    summarizer.traces_summarize(project_ids=[project.pk])
    assert reads == [(sorted([tid["agent"], tid["a"]]), "range")], "the project's first run: one read"

    reads.clear()
    time.sleep(0.01)
    insert(project.pk, [step, a[0]] + b + b[2:3])  # the session grows; a's root; b, one span sent twice
    summarizer.traces_summarize(project_ids=[project.pk])
    if arrays:  # b is new, a was summarised without its root and its children kept: both from memory
        # the grown one alone, over ten minutes: by id (the bloom filter skips the rest of those minutes)
        assert reads == [(sorted([tid["a"], tid["b"]]), "memory"), ([tid["agent"]], "apart")], "the session by id"
    else:
        assert reads == [(sorted([tid["a"], tid["b"]]), "range"), ([tid["agent"]], "apart")], "the session is read apart"

    reads.clear()
    time.sleep(0.01)
    insert(project.pk, b[3:4] + c)  # a copy of b's span re-sent later (b has a summary, a recent one), c new
    summarizer.traces_summarize(project_ids=[project.pk])
    if arrays:
        assert reads == [([tid["c"]], "memory"), ([tid["b"]], "range")], "a trace with a summary is read"
    else:
        assert reads == [(sorted([tid["b"], tid["c"]]), "range")], "a recent trace with a summary is read with the rest"

    rows = latest(project.pk)
    assert rows[tid["agent"]]["span_count"] == 3 and rows[tid["agent"]]["has_root"] == 1
    assert rows[tid["agent"]]["e2e_ns"] == 660_000 * MS
    assert all(rows[tid[name]]["span_count"] == 5 and rows[tid[name]]["has_root"] == 1 for name in "abc")
    for name in tid:
        expected = summarizer.trace_row(project_id=project.pk, trace_id=tid[name], spans=_stored(project.pk, tid[name]),
                                        prices={}, version=1)
        for field in ("span_count", "has_root", "e2e_ns", "input_tokens", "output_tokens", "inference_ns",
                      "network_ns", "other_ns", "ttft_ns", "status", "error_spans"):
            assert rows[tid[name]][field] == expected[field], (name, field)
        assert rows[tid[name]]["start_ns"] == expected["start_time"], name


def _stored(project_id, trace_id):
    """The trace's spans as stored (one copy each), as the reference trace math reads them."""
    return get_store().query(
        "SELECT span_id, parent_span_id, name, phase, phase_fallback, service, model, status, "
        "toUnixTimestamp64Nano(start_time) AS start_ns, duration_ns, ttft_ns, input_tokens, output_tokens, cost_usd, cache "
        "FROM spans FINAL WHERE project_id = {p:UInt64} AND trace_id = {t:String}",
        {"p": project_id, "t": trace_id}, tag="tests.summarizer.stored").dicts()
