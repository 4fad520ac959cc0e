"""The attribute index (analytics.attribute_index): a key is declared on first use, the summariser
indexes the traces it summarises from then on, the backfill the older ones, and the assignment of
traces to the key's values reads the index only once it is complete — with the same results as the
span scan."""

from __future__ import annotations

import random
import time

import pytest

from analytics import attribute_index, grouping, summarizer
from analytics.panel_selectors import _params
from datetime import datetime, timezone
from store import get_store
from tests.rollup_support import insert_spans, random_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
NS = 1_000_000_000
KEY = "user.tier"


def _window(start_ns: int, end_ns: int):
    return (datetime.fromtimestamp(start_ns / NS, tz=timezone.utc), datetime.fromtimestamp(end_ns / NS, tz=timezone.utc))


def _assignment(project_id: int, start_ns: int, end_ns: int, key: str = KEY) -> dict[str, str]:
    start, end = _window(start_ns, end_ns)
    rows = get_store().query(grouping.TRACE_VALUE_SQL, _params(project_id, start, end, "", "", attr_key=key),
                             tag="tests.attribute_index.assign").rows
    return dict(rows)


def _indexed_rows(project_id: int, key: str = KEY) -> int:
    return int(get_store().query("SELECT count() FROM span_key_values WHERE project_id = {p:UInt64} AND key = {k:String}",
                                 {"p": project_id, "k": key}, tag="tests.attribute_index.rows").scalar())


def _traces(rng: random.Random, start: int, end: int, n: int, *, late_values: bool = True) -> list[dict]:
    """``n`` traces: the tier on the inference span (span attribute) or on the resource, some with
    a later span carrying another value (the earliest wins), some with an empty value (no value),
    some with two spans on the same nanosecond carrying two values (the tie rule)."""
    spans = []
    for i in range(n):
        trace = random_trace(rng, start_ns=rng.randrange(start, end))
        tier = rng.choice(["free", "pro", "enterprise"])
        kind = i % 5
        if kind == 0:
            trace[3]["resource_attributes"] = {KEY: tier}
        elif kind == 1:
            trace[3]["attributes"] = {KEY: tier}
            if late_values:
                trace[4]["attributes"] = {KEY: "later"}
        elif kind == 2:
            trace[0]["attributes"] = {KEY: ""}
        elif kind == 3:
            trace[1]["attributes"] = {KEY: tier}
            trace[2]["attributes"] = {KEY: "tie"}
            trace[2]["start_time"] = trace[1]["start_time"]
        spans += trace
    return spans


@pytest.fixture
def seeded(project_with_key):
    project, _ = project_with_key()
    other, _ = project_with_key()
    rng = random.Random(11)
    end = time.time_ns() - 60 * NS
    start = end - 3600 * NS
    insert_spans(project.pk, _traces(rng, start, end, 60))
    insert_spans(other.pk, [dict(s, attributes={KEY: "elsewhere"}) for s in random_trace(rng, start_ns=start + NS)])
    summarizer.traces_summarize(project_ids=[project.pk, other.pk])  # before any key is declared
    return {"project": project.pk, "other": other.pk, "start": start, "end": end, "rng": rng}


def test_the_index_assigns_every_trace_as_the_span_scan_does(seeded):
    p, start, end, rng = seeded["project"], seeded["start"], seeded["end"], seeded["rng"]
    scanned = _assignment(p, start, end)
    assert len(scanned) == 36 and set(scanned.values()) <= {"free", "pro", "enterprise", "tie"}
    assert _indexed_rows(p) == 0  # nothing declared: the summariser indexed nothing
    assert attribute_index.key_declare(project_id=p, key=KEY)
    # New traces after the declaration (the summariser indexes them), a re-sent batch, and a late
    # span carrying an earlier value for a stored trace.
    fresh = _traces(rng, start, end, 20)
    insert_spans(p, fresh)
    summarizer.traces_summarize(project_ids=[p])
    assert _indexed_rows(p) == 20  # a row per trace and value: 3 traces of every 5 carry one or two
    insert_spans(p, fresh)
    some = next(t for t, v in scanned.items() if v == "pro")
    insert_spans(p, [{"trace_id": some, "span_id": "%016x" % 7, "parent_span_id": "%016x" % 8, "name": "late",
                      "service": "chat-api", "start_time": start - 60 * NS, "duration_ms": 1.0,
                      "attributes": {KEY: "enterprise"}}])
    summarizer.traces_summarize(project_ids=[p])
    assert _indexed_rows(p) == 20 + 20 + 3  # summarised again: indexed again (the late span's trace: 3 values)
    scanned_now = _assignment(p, start, end)  # not ready: still the scan
    assert scanned_now[some] == "enterprise" and len(scanned_now) == 48
    assert attribute_index.index_backfill(project_ids=[p], delay_seconds=0).keys == 1
    assert attribute_index.indexed_keys(project_id=p)[0].ready
    assert _assignment(p, start, end) == scanned_now
    # Nothing of the other project is indexed or assigned here.
    assert _indexed_rows(seeded["other"]) == 0
    assert "elsewhere" not in _assignment(p, start - 3600 * NS, end)


def test_reads_use_the_index_only_once_its_backfill_is_done(seeded):
    """A row only the index holds (a value no span carries) shows whether a read used the index:
    not while the key is declared but not backfilled, and from the moment it is ready."""
    p, start, end = seeded["project"], seeded["start"], seeded["end"]
    scanned = _assignment(p, start, end)
    trace = sorted(scanned)[0]
    attribute_index.key_declare(project_id=p, key=KEY)
    get_store().insert("span_key_values", [{"project_id": p, "key": KEY, "start_time": start - 120 * NS,
                                            "trace_id": trace, "value": "index-only"}], tag="tests.attribute_index")
    assert _assignment(p, start, end)[trace] == scanned[trace]
    attribute_index.index_backfill(project_ids=[p], delay_seconds=0)
    assert _assignment(p, start, end)[trace] == "index-only"
    # Removed: the rows go, and reads scan the spans again.
    assert attribute_index.key_remove(project_id=p, key=KEY)
    assert _indexed_rows(p) == 0 and attribute_index.indexed_keys(project_id=p) == []
    assert _assignment(p, start, end) == scanned
    insert_spans(p, _traces(seeded["rng"], start, end, 5))
    summarizer.traces_summarize(project_ids=[p])
    assert _indexed_rows(p) == 0  # the summariser no longer indexes the key


def test_the_backfill_waits_for_inserts_that_began_before_the_declaration(seeded):
    p = seeded["project"]
    attribute_index.key_declare(project_id=p, key=KEY)
    report = attribute_index.index_backfill(project_ids=[p], delay_seconds=30)
    assert report.keys == 0 and not attribute_index.indexed_keys(project_id=p)[0].ready
    report = attribute_index.index_backfill(project_ids=[p], delay_seconds=0)
    assert report.keys == 1 and report.rows == 60  # a row per trace and non-empty value
    assert attribute_index.index_backfill(project_ids=[p], delay_seconds=0).keys == 0  # done once


def test_a_removal_made_while_the_backfill_ran_wins(seeded, monkeypatch):
    p = seeded["project"]
    attribute_index.key_declare(project_id=p, key=KEY)
    real = attribute_index._rows
    calls = []

    def remove_meanwhile(params):
        calls.append(1)
        if len(calls) == 2:  # after the backfill's copy, before it marks the key ready
            attribute_index.key_remove(project_id=p, key=KEY)
        return real(params)

    monkeypatch.setattr(attribute_index, "_rows", remove_meanwhile)
    attribute_index.index_backfill(project_ids=[p], delay_seconds=0)
    assert attribute_index.indexed_keys(project_id=p) == []


def test_keys_are_capped_per_project_and_must_be_keys_that_group(project_with_key, monkeypatch):
    project, _ = project_with_key()
    monkeypatch.setattr(attribute_index, "MAX_KEYS", 3)
    assert all(attribute_index.key_declare(project_id=project.pk, key=f"k{i}") for i in range(3))
    assert not attribute_index.key_declare(project_id=project.pk, key="k3")
    assert attribute_index.key_declare(project_id=project.pk, key="k1")  # already declared
    assert not attribute_index.key_declare(project_id=project.pk, key="")
    assert not attribute_index.key_declare(project_id=project.pk, key="x" * 257)
    assert [k.key for k in attribute_index.indexed_keys(project_id=project.pk)] == ["k0", "k1", "k2"]
    attribute_index.key_remove(project_id=project.pk, key="k0")
    assert attribute_index.key_declare(project_id=project.pk, key="k3")


def test_grouped_reads_declare_their_key(seeded, make_user, project_with_key):
    from alerts.latency import latency_fetch

    user = make_user()
    project, _ = project_with_key(members=[user])
    start, end = _window(seeded["start"], seeded["end"])
    before = grouping.grouped_series(project_id=seeded["project"], start=start, end=end, key=KEY)
    assert [k.key for k in attribute_index.indexed_keys(project_id=seeded["project"])] == [KEY]
    attribute_index.index_backfill(project_ids=[seeded["project"]], delay_seconds=0)
    after = grouping.grouped_series(project_id=seeded["project"], start=start, end=end, key=KEY)
    assert after == before  # the same figures from the index
    latency_fetch(project_id=project.pk, window_seconds=300, now=end, group_by="llm.quantization")
    assert [k.key for k in attribute_index.indexed_keys(project_id=project.pk)] == ["llm.quantization"]


def test_the_beat_runs_the_backfill():
    from django.conf import settings

    entry = settings.CELERY_BEAT_SCHEDULE["attribute-index"]
    assert entry["task"] == "analytics.tasks.index_attributes"
    from server import tasks

    assert tasks.index_attributes.name == entry["task"]


def test_the_management_command_lists_adds_backfills_and_removes(seeded):
    from io import StringIO

    from django.core.management import CommandError, call_command

    p = seeded["project"]

    def run(*args) -> str:
        out = StringIO()
        call_command("attribute_index", "--project", str(p), *args, stdout=out)
        return out.getvalue()

    assert "0 of 20 keys indexed" in run()
    assert "backfilling" in run("--add", KEY)
    text = run("--backfill")
    assert "backfilled 1 key(s): 60 rows" in text and f"  {KEY}\tready" in text
    assert "0 of 20 keys indexed" in run("--remove", KEY)
    with pytest.raises(CommandError, match="not indexed"):
        run("--remove", KEY)
    with pytest.raises(CommandError, match="1 to 256 characters"):
        run("--add", "x" * 300)


def test_a_declaration_the_store_refuses_leaves_the_read_to_the_scan(seeded, monkeypatch):
    from store.errors import StoreError

    store = get_store()
    real = store.insert

    def refuse(table, rows, **kwargs):
        if table == "dim_keys":
            raise StoreError("Code: 497. DB::Exception: readonly user", tag="tests")
        return real(table, rows, **kwargs)

    monkeypatch.setattr(store, "insert", refuse)
    start, end = _window(seeded["start"], seeded["end"])
    series = grouping.grouped_series(project_id=seeded["project"], start=start, end=end, key=KEY)
    assert sum(g.requests for g in series.groups) == 60 and attribute_index.indexed_keys(project_id=seeded["project"]) == []


def _hosts_of_traces(project_id: int, start_ns: int, end_ns: int, hosts: list[str]) -> dict[str, tuple[str, list]]:
    """The Variants view's assignment with hosts: trace -> (value, [(host, minute), …]) decoded."""
    import json

    start, end = _window(start_ns, end_ns)
    sql = grouping.trace_value_sql(hosts="gpu_hosts")
    rows = get_store().query(sql, _params(project_id, start, end, "", "", attr_key=KEY, gpu_hosts=json.dumps(hosts)),
                             tag="tests.attribute_index.hosts").rows
    return {t: (v, sorted((hosts[c % grouping.HOST_CODES - 1], c // grouping.HOST_CODES) for c in codes))
            for t, v, codes in rows}


def test_each_traces_hosts_and_first_minutes_come_from_the_index_as_from_the_spans(seeded):
    """The Variants view's GPU read: each trace's value and, of the listed hosts (those with GPU
    samples), the minute of its first span on each, from the index as from the span scan — a host
    not listed is left out, and a late span that started earlier on a host (a second index row for
    it) moves that host's minute to its own."""
    p, start, end, rng = seeded["project"], seeded["start"], seeded["end"], seeded["rng"]
    listed = ["gpu-a", "gpu-b"]
    spans = []
    for i in range(12):
        trace = random_trace(rng, start_ns=rng.randrange(start, end - 600 * NS))
        trace[3]["attributes"] = {KEY: rng.choice(["free", "pro"])}
        for j, span in enumerate(trace):
            span["resource_attributes"] = {"host.name": ["gpu-a", "gpu-b", "cpu-1"][(i + j) % 3]}
            span["start_time"] += j * 61 * NS  # spans a minute apart: a host's first minute matters
        spans += trace
    insert_spans(p, spans)
    summarizer.traces_summarize(project_ids=[p])
    for key in (KEY, "host.name"):
        assert attribute_index.key_declare(project_id=p, key=key)
    attribute_index.index_backfill(project_ids=[p], delay_seconds=0)
    # A late span of one trace on gpu-b, two minutes before any of its spans: summarised again,
    # the trace gets a second index row for gpu-b, with the earlier start.
    late_trace = spans[0]["trace_id"]
    first = min(s["start_time"] for s in spans if s["trace_id"] == late_trace)
    insert_spans(p, [{"trace_id": late_trace, "span_id": "%016x" % 9, "parent_span_id": spans[0]["span_id"],
                      "name": "late", "service": "chat-api", "start_time": first - 120 * NS, "duration_ms": 1.0,
                      "resource_attributes": {"host.name": "gpu-b"}}])
    summarizer.traces_summarize(project_ids=[p])
    assert int(get_store().query(
        "SELECT count() FROM span_key_values WHERE project_id = {p:UInt64} AND key = 'host.name' AND trace_id = {t:String}",
        {"p": p, "t": late_trace}, tag="tests.attribute_index.rows").scalar()) > 3
    expected: dict[str, dict[str, int]] = {}
    for span in spans + [{"trace_id": late_trace, "start_time": first - 120 * NS, "resource_attributes": {"host.name": "gpu-b"}}]:
        host = span["resource_attributes"]["host.name"]
        if host in listed:
            minutes = expected.setdefault(span["trace_id"], {})
            minutes[host] = min(minutes.get(host, 1 << 62), span["start_time"] // NS // 60)
    indexed = _hosts_of_traces(p, start, end, listed)
    assert all(k.ready for k in attribute_index.indexed_keys(project_id=p))
    ours = {t: hm for t, (v, hm) in indexed.items() if t in expected}
    assert len(ours) == 12 and ours == {t: sorted(m.items()) for t, m in expected.items()}
    assert dict(ours[late_trace])["gpu-b"] == (first - 120 * NS) // NS // 60
    # ``host.name`` not indexed: the value from the index, the hosts from the spans; neither key: both
    # from the spans. A row only the index holds (another value, earlier) shows where the value comes from.
    attribute_index.key_remove(project_id=p, key="host.name")
    assert _hosts_of_traces(p, start, end, listed) == indexed
    get_store().insert("span_key_values", [{"project_id": p, "key": KEY, "value": "index-only", "trace_id": late_trace,
                                            "start_time": first - NS}], tag="tests.attribute_index.rows")
    assert _hosts_of_traces(p, start, end, listed)[late_trace] == ("index-only", indexed[late_trace][1])
    attribute_index.key_remove(project_id=p, key=KEY)
    assert _hosts_of_traces(p, start, end, listed) == indexed


def test_the_declared_keys_are_read_once_and_again_after_each_write(project_with_key, monkeypatch):
    """On the embedded store the declared keys come from memory (``KnownKeys``) until ``dim_keys`` is
    written: by a declaration, a backfill marking a key ready, a removal, or any other statement."""
    project, _ = project_with_key()
    p = project.pk
    store = get_store()
    reads = []
    real_query = store.query
    monkeypatch.setattr(store, "query", lambda sql, *a, **kw: (
        reads.append(kw.get("tag")), real_query(sql, *a, **kw))[1])
    latest_reads = lambda: reads.count("analytics.attribute_index.latest")  # noqa: E731

    assert attribute_index.declared_keys(project_id=p) == []
    assert attribute_index.declared_keys(project_id=p) == [] and latest_reads() == 1, "the second from memory"
    assert attribute_index.key_add(project_id=p, key=KEY)  # reads (memory), then writes: read again
    assert attribute_index.declared_keys(project_id=p) == [KEY] and latest_reads() == 2
    assert not attribute_index.indexed_keys(project_id=p)[0].ready and latest_reads() == 2
    attribute_index.index_backfill(project_ids=[p], delay_seconds=0)
    assert attribute_index.indexed_keys(project_id=p)[0].ready and latest_reads() == 3
    store.command("DELETE FROM dim_keys WHERE project_id = {p:UInt64}", {"p": p},  # not through Store.insert
                  tag="tests.attribute_index.delete")
    assert attribute_index.declared_keys(project_id=p) == [] and latest_reads() == 4
