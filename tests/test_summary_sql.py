"""The per-trace summaries computed in ClickHouse equal the Python reference (analytics.trace_math)
for every figure, on random trees: nesting, overlapping siblings, orphans (parent never arrived),
clock skew (children outside their parent), missing or several roots, a span that is its own
parent, cycles, failed and retried calls, spans without phase or with an unknown one, ties in start
time, re-sent copies of spans, and prices that estimate missing costs."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from analytics import fresh_spans, summary_arrays, summary_sql
from analytics.trace_math import PHASES, trace_summarize
from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

PROJECT = 7
PRICES = {"m1": (0.5, 1.5), "": (2.0, 4.0)}
BASE_NS = None  # set per run: now - 1 h (rows older than the retention would be dropped)

_span_id = st.integers(min_value=1, max_value=2**64 - 1).map(lambda n: f"{n:016x}")


@st.composite
def a_trace(draw):
    ids = draw(st.lists(_span_id, min_size=1, max_size=14, unique=True))
    spans = []
    for i, span_id in enumerate(ids):
        kind = draw(st.sampled_from(["root", "child", "child", "child", "child", "orphan", "self"]))
        if kind == "root" or (kind == "child" and len(ids) == 1):
            parent = ""
        elif kind == "child":
            parent = draw(st.sampled_from(ids))  # any span: nesting, siblings, cycles
        elif kind == "orphan":
            parent = draw(_span_id.filter(lambda s: s not in ids))
        else:
            parent = span_id
        status = draw(st.sampled_from(["ok", "ok", "error"]))
        spans.append({
            "span_id": span_id,
            "parent_span_id": parent,
            "name": draw(st.sampled_from(["chat", "retrieve", "llm.call", "http"])),
            "phase": draw(st.sampled_from(["network", "preprocess", "inference", "inference", "postprocess", "other", "",
                                           "queue"])),
            # no stated phase: beneath a model call (through other such spans) it counts as inference
            "phase_fallback": draw(st.sampled_from([0, 0, 1])),
            # what it says of a cache: nothing, a miss, or the cache answered (a request is a hit when any span is)
            "cache": draw(st.sampled_from([0, 0, 0, 1, 2])),
            "service": draw(st.sampled_from(["api", "worker", ""])),
            "model": draw(st.sampled_from(["m1", "m2", ""])),
            # microsecond grid: ties and touching intervals happen often
            "start_ns": draw(st.integers(0, 400)) * 5_000,
            "duration_ns": draw(st.integers(0, 300)) * 5_000,
            "status": status,
            "status_message": draw(st.sampled_from(["", "timeout", "rate limited"])) if status == "error" else "",
            "ttft_ns": draw(st.one_of(st.none(), st.integers(0, 2_000_000))),
            "input_tokens": draw(st.sampled_from([None, 0, 0, 1, 17, 812])),
            "output_tokens": draw(st.sampled_from([None, 0, 1, 2, 164])),
            "cost_usd": draw(st.one_of(st.none(), st.none(), st.floats(0, 0.05, allow_nan=False))),
        })
    resend = draw(st.lists(st.sampled_from(ids), max_size=3))  # copies sent again, unchanged
    return spans, resend


def _row(project_id, trace_id, span, base_ns):
    return {
        "project_id": project_id, "trace_id": trace_id, "span_id": span["span_id"],
        "parent_span_id": span["parent_span_id"], "name": span["name"], "phase": span["phase"],
        "phase_fallback": span.get("phase_fallback", 0), "cache": span.get("cache", 0),
        "service": span["service"], "model": span["model"], "start_time": base_ns + span["start_ns"],
        "duration_ns": span["duration_ns"], "status": span["status"], "status_message": span["status_message"],
        "ttft_ns": span["ttft_ns"], "input_tokens": span["input_tokens"], "output_tokens": span["output_tokens"],
        "cost_usd": span["cost_usd"], "attributes": {}, "resource_attributes": {}, "event_times": [],
        "event_names": [], "event_attributes": [],
    }


def expected(spans, base_ns):
    """The reference's figures, as the ``traces`` row holds them."""
    shifted = [dict(s, start_ns=base_ns + s["start_ns"]) for s in spans]
    summary = trace_summarize(shifted, prices=PRICES)
    figures = {
        "start_ns": summary.start_ns, "e2e_ns": max(0, summary.e2e_ns), "has_root": int(summary.has_root),
        "spans_start_ns": min(s["start_ns"] for s in shifted),
        "spans_end_ns": max(s["start_ns"] + s["duration_ns"] for s in shifted),
        "root_name": summary.root_name, "service": summary.service, "model": summary.model,
        "services": sorted({s["service"] for s in spans if s["service"]}),
        "models": sorted({s["model"] for s in spans if s["model"]}),
        "phases": sorted({s["phase"] for s in spans if s["phase"]}),
        "status": summary.status, "error_message": summary.error_message, "ttft_ns": summary.ttft_ns,
        "tpot_ns": summary.tpot_ns, "input_tokens": summary.input_tokens, "output_tokens": summary.output_tokens,
        "cost_usd": summary.cost_usd, "cost_estimated": int(summary.cost_estimated),
        "span_count": summary.span_count, "error_spans": summary.error_spans,
        "model_input_tokens": {m: v[0] for m, v in summary.by_model.items() if v[0]},
        "model_output_tokens": {m: v[1] for m, v in summary.by_model.items() if v[1]},
        "model_cost_usd": {m: v[2] for m, v in summary.by_model.items() if v[2]},
        "cache": summary.cache,
    }
    figures.update({f"{phase}_ns": summary.phase_ns[phase] for phase in PHASES})
    return figures


def computed(trace_ids):
    rows = get_store().query(
        "SELECT *, toUnixTimestamp64Nano(start_time) AS start_ns, toUnixTimestamp64Nano(spans_start) AS spans_start_ns,"
        " toUnixTimestamp64Nano(spans_end) AS spans_end_ns FROM traces FINAL"
        " WHERE project_id = {p:UInt64} AND trace_id IN (SELECT arrayJoin(splitByChar(',', {ids:String})))",
        {"p": PROJECT, "ids": ",".join(trace_ids)}, tag="tests.summary_sql.read").dicts()
    return {r["trace_id"]: r for r in rows}


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)  # sums in another order


def assert_same(want, got, trace_id):
    for name, value in want.items():
        have = got[name]
        if name in ("cost_usd", "tpot_ns"):
            assert _close(value, have), (trace_id, name, value, have)
        elif name == "model_cost_usd":
            assert set(value) == set(have) and all(_close(value[m], have[m]) for m in value), (trace_id, name, value, have)
        elif isinstance(value, dict):
            assert value == {k: int(v) for k, v in have.items()}, (trace_id, name, value, have)
        else:
            assert value == (int(have) if isinstance(value, int) and not isinstance(value, bool) and have is not None
                             else have), (trace_id, name, value, have)


def summarize_arrays(trace_ids, version=1):
    store = get_store()
    params = {"project_id": PROJECT, "prices": summary_sql.prices_json(PRICES), "ids": ",".join(trace_ids)}
    summary_arrays.summaries_write(store, [(summary_arrays.spans_sql(trace_filter=_IDS_FILTER), params)],
                                   project_id=PROJECT, version=version, prices=PRICES)


_IDS_FILTER = "trace_id IN (SELECT arrayJoin(splitByChar(',', {ids:String})))"


def summarize_sql(trace_ids, version=1, settings=""):
    store = get_store()
    sql = summary_sql.summary_insert_sql(trace_filter="trace_id IN (SELECT arrayJoin(splitByChar(',', {ids:String})))")
    if settings:
        sql = sql.replace("SETTINGS ", f"SETTINGS {settings}, ")
    store.command(sql, {"project_id": PROJECT, "version": version, "prices": summary_sql.prices_json(PRICES),
                        "ids": ",".join(trace_ids)}, tag="tests.summary_sql.summarize")


def summarize_memory(trace_ids, version=1):
    """``arrays`` over the spans as the inserts stored them, held in memory (analytics.fresh_spans):
    every column ``spans_sql`` reads, the digest's hashes of ``span_id`` and ``ingested_at`` included."""
    import time

    store = get_store()
    fresh = fresh_spans.fresh_for(store)
    time.sleep(0.002)  # the inserts' stamp lies before this ms
    window = fresh.window(PROJECT, fresh.since_ms, store.settled_until_ms("spans"), 10**9)
    assert window is not None, "every insert since the listener started is held"
    params = {"project_id": PROJECT, "prices": summary_sql.prices_json(PRICES), "ids": ",".join(trace_ids)}
    summary_arrays.summaries_write(store, [(window.spans_of(trace_ids, params["prices"]), params)],
                                   project_id=PROJECT, version=version, prices=PRICES)


ENGINES = {"sql": summarize_sql, "arrays": summarize_arrays, "memory": summarize_memory}

_counter = iter(range(1, 10**9))


def _span(k, parent, phase, duration_ns):
    return {"span_id": f"{k:016x}", "parent_span_id": f"{parent:016x}", "name": "chat", "phase": phase,
            "phase_fallback": 1, "cache": 0, "service": "api", "model": "m1", "start_ns": 0,
            "duration_ns": duration_ns, "status": "ok", "status_message": "", "ttft_ns": None,
            "input_tokens": None, "output_tokens": None, "cost_usd": None}


# Found by a clean-clone run: no root, a parent cycle (1 <-> 3) of zero-length spans, and a
# 5 us child of one of them; the reference counts the child's time as network.
_CYCLE = [_span(1, 3, "network", 0), _span(2, 1, "network", 5000), _span(3, 1, "inference", 0)]


@pytest.mark.parametrize("engine", ["sql", "arrays", "memory"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
@given(traces=st.lists(a_trace(), min_size=1, max_size=4))
@example(traces=[(_CYCLE, [])])
def test_summaries_equal_the_reference(engine, traces):
    """Each engine (ClickHouse's statement, numpy over the columns read back or held in memory) over
    the same random trees."""
    _summaries_equal_the_reference(traces, ENGINES[engine])


def _summaries_equal_the_reference(traces, summarize):
    import time

    base_ns = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    store = get_store()
    # A merge may fold a re-sent copy into the first between the summary and the digest read below
    # (which would change the digest): no merges while this example runs.
    store.command("SYSTEM STOP MERGES spans", tag="tests.summary_sql.merges")
    try:
        _summarise_and_compare(traces, summarize, base_ns)
    finally:
        store.command("SYSTEM START MERGES spans", tag="tests.summary_sql.merges")


def _summarise_and_compare(traces, summarize, base_ns):
    store = get_store()
    fresh_spans.fresh_for(store)  # holds the inserts below (the ``memory`` engine reads them)
    ids, first, again = [], [], []
    for spans, resend in traces:
        trace_id = f"{next(_counter):032x}"
        ids.append(trace_id)
        first += [_row(PROJECT, trace_id, s, base_ns) for s in spans]
        again += [_row(PROJECT, trace_id, s, base_ns) for s in spans if s["span_id"] in resend]
    store.insert("spans", first, tag="tests.summary_sql.spans")
    if again:
        store.insert("spans", again, tag="tests.summary_sql.resend")  # a second copy, counted once
    summarize(ids)
    got = computed(ids)
    assert set(got) == set(ids)
    for trace_id, (spans, _) in zip(ids, traces):
        assert_same(expected(spans, base_ns), got[trace_id], trace_id)
    digests = store.query(summary_sql.span_digests_sql(trace_filter=_IDS_FILTER),
                          {"project_id": PROJECT, "prices": summary_sql.prices_json(PRICES), "ids": ",".join(ids)},
                          tag="tests.summary_sql.digests").dicts()
    assert {d["digest"] for d in digests} and {d["trace_id"]: int(d["digest"]) for d in digests} == {
        t: int(got[t]["spans_digest"]) for t in ids}  # what the next run compares to skip an unchanged trace



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
@given(traces=st.lists(a_trace(), min_size=1, max_size=4), data=st.data())
def test_a_trace_summarised_as_its_spans_arrive_equals_the_reference(traces, data):
    """Spans sent as they end (the children first, the roots last): a run summarises the first
    arrivals from memory, and the next one finds the traces left without a root whole in memory
    (``Window.grown``: the copies kept add up to their summary's digest) and summarises them again
    from memory, the re-sent copies included. Every figure equals the reference over all the
    spans stored."""
    import time

    base_ns = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    store = get_store()
    fresh = fresh_spans.fresh_for(store)
    prices = summary_sql.prices_json(PRICES)
    ids, first, second = [], [], []
    for spans, resend in traces:
        trace_id = f"{next(_counter):032x}"
        ids.append(trace_id)
        later = [s for s in spans if not s["parent_span_id"]]
        children = [s for s in spans if s["parent_span_id"]]
        cut = data.draw(st.integers(0, len(children)))
        first += [_row(PROJECT, trace_id, s, base_ns) for s in children[:cut]]
        second += [_row(PROJECT, trace_id, s, base_ns) for s in children[cut:] + later]
        second += [_row(PROJECT, trace_id, s, base_ns) for s in spans if s["span_id"] in resend]

    def window(since_ms):
        time.sleep(0.003)  # the inserts' stamps lie before the ms the window stops at
        got = fresh.window(PROJECT, since_ms, store.settled_until_ms("spans"), 10**9)
        assert got is not None, "every insert since the listener started is held"
        return got

    def write(got, trace_ids, version):
        params = {"project_id": PROJECT, "prices": prices, "ids": ",".join(trace_ids)}
        return summary_arrays.summaries_write(store, [(got.spans_of(trace_ids, prices), params)],
                                              project_id=PROJECT, version=version, prices=PRICES)

    store.command("SYSTEM STOP MERGES spans", tag="tests.summary_sql.merges")  # see _summaries_equal_the_reference
    try:
        time.sleep(0.002)
        since = max(fresh.since_ms, store.settled_until_ms("spans"))
        store.insert("spans", first, tag="tests.summary_sql.children") if first else None
        early = window(since)
        before = sorted({r["trace_id"] for r in first})
        rootless = []
        if before:
            rows = write(early, before, 1)
            rootless = [t for t, r in zip(rows.column("trace_id"), rows.column("has_root").tolist()) if not r]
        fresh.consumed(PROJECT, early.until_ms, keep=rootless)
        store.insert("spans", second, tag="tests.summary_sql.roots")
        late = window(early.until_ms)
        digests = {t: int(computed([t])[t]["spans_digest"]) for t in before}
        grown = late.grown(digests, prices)
        assert sorted(grown) == sorted(rootless), "a trace left without a root is held whole"
        from_memory = sorted(set(ids) - set(before) | set(grown))
        write(late, from_memory, 2)
        if set(ids) - set(from_memory):
            summarize_arrays(sorted(set(ids) - set(from_memory)), version=2)
        got = computed(ids)
        for trace_id, (spans, _) in zip(ids, traces):
            assert_same(expected(spans, base_ns), got[trace_id], trace_id)
        digests = store.query(summary_sql.span_digests_sql(trace_filter=_IDS_FILTER),
                              {"project_id": PROJECT, "prices": prices, "ids": ",".join(ids)},
                              tag="tests.summary_sql.digests").dicts()
        assert {d["trace_id"]: int(d["digest"]) for d in digests} == {t: int(got[t]["spans_digest"]) for t in ids}
    finally:
        store.command("SYSTEM START MERGES spans", tag="tests.summary_sql.merges")


def test_a_trace_that_grows_is_summarised_again_and_an_unchanged_one_is_not():
    import time

    base_ns = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    store = get_store()
    root = {"span_id": "a" * 16, "parent_span_id": "", "name": "chat", "phase": "", "service": "api", "model": "",
            "start_ns": 0, "duration_ns": 1_000_000, "status": "ok", "status_message": "", "ttft_ns": None,
            "input_tokens": 0, "output_tokens": 0, "cost_usd": None}
    call = dict(root, span_id="b" * 16, parent_span_id="a" * 16, name="llm", phase="inference", model="m1",
                start_ns=100_000, duration_ns=600_000, ttft_ns=50_000, input_tokens=10, output_tokens=20)
    trace_id = "c" * 32
    store.insert("spans", [_row(PROJECT, trace_id, root, base_ns)], tag="tests.summary_sql.spans")
    where = "trace_id = {trace_id:String}"
    params = {"project_id": PROJECT, "prices": summary_sql.prices_json(PRICES), "trace_id": trace_id}

    def run(version):
        digests = store.query(summary_sql.span_digests_sql(trace_filter=where), params,
                              tag="tests.summary_sql.digests").dicts()
        latest = store.query("SELECT spans_digest FROM traces WHERE project_id = {p:UInt64} ORDER BY version DESC LIMIT 1",
                             {"p": PROJECT}, tag="tests.summary_sql.latest").dicts()
        if [d["digest"] for d in digests] != [r["spans_digest"] for r in latest]:
            store.command(summary_sql.summary_insert_sql(trace_filter=where), dict(params, version=version),
                          tag="tests.summary_sql.run")
        return store.query("SELECT version FROM traces WHERE project_id = {p:UInt64} ORDER BY version",
                           {"p": PROJECT}, tag="tests.summary_sql.versions").dicts()

    assert [r["version"] for r in run(1)] == [1]
    assert [r["version"] for r in run(2)] == [1], "nothing arrived: not written again"
    store.insert("spans", [_row(PROJECT, trace_id, call, base_ns)], tag="tests.summary_sql.late")
    assert [r["version"] for r in run(3)] == [1, 3], "a late span: summarised again"
    assert_same(expected([root, call], base_ns), computed([trace_id])[trace_id], trace_id)
    store.insert("spans", [_row(PROJECT, trace_id, call, base_ns)], tag="tests.summary_sql.resend")
    assert [r["version"] for r in run(4)] == [1, 3, 4], "a re-sent copy: summarised again (same figures)"
    assert_same(expected([root, call], base_ns), computed([trace_id])[trace_id], trace_id)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_load_test_traffic_is_marked_on_the_summary(engine):
    import time

    base_ns = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    span = {"span_id": "d" * 16, "parent_span_id": "", "name": "loadtest request", "phase": "", "service": "api",
            "model": "", "start_ns": 0, "duration_ns": 1_000, "status": "ok", "status_message": "", "ttft_ns": None,
            "input_tokens": 0, "output_tokens": 0, "cost_usd": None}
    tagged = dict(_row(PROJECT, "e" * 32, span, base_ns), attributes={"loadtest.run_id": "r1", "loadtest.step": "2"})
    plain = _row(PROJECT, "f" * 32, span, base_ns)
    get_store().insert("spans", [tagged, plain], tag="tests.summary_sql.spans")
    ENGINES[engine](["e" * 32, "f" * 32])
    rows = computed(["e" * 32, "f" * 32])
    assert rows["e" * 32]["loadtest"] == 1 and rows["f" * 32]["loadtest"] == 0


# A request (root, no stated phase), its model call, and the HTTP span beneath the call that states
# no phase either (the HTTP client rule makes it network; beneath the call it is inference).
_CHAT_ROOT = {"span_id": "1" * 16, "parent_span_id": "", "name": "POST /chat", "phase": "other", "phase_fallback": 1,
              "service": "api", "model": "", "start_ns": 0, "duration_ns": 1_000_000, "status": "ok",
              "status_message": "", "ttft_ns": None, "input_tokens": None, "output_tokens": None, "cost_usd": None}
_CHAT_CALL = dict(_CHAT_ROOT, span_id="2" * 16, parent_span_id="1" * 16, name="chat sim-gpt", phase="inference",
                  phase_fallback=0, model="m1", start_ns=100_000, duration_ns=800_000)
_CHAT_HTTP = dict(_CHAT_ROOT, span_id="3" * 16, parent_span_id="2" * 16, name="POST", phase="network",
                  phase_fallback=1, start_ns=150_000, duration_ns=700_000)


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_fallback_span_beneath_a_model_call_is_inference_even_when_it_arrives_first(engine):
    """OpenLIT's (and httpx auto-instrumentation's) HTTP span beneath an LLM span says nothing of its
    phase: the HTTP client rule makes it network, but it is the model call's time. It is exported
    before its parent (it ends first), so the summary decides, not the ingest; a span that states
    ``network`` beneath the call stays network."""
    import time

    base_ns = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    root, call, http = _CHAT_ROOT, _CHAT_CALL, _CHAT_HTTP
    connect = dict(http, span_id="4" * 16, parent_span_id="3" * 16, name="connect", phase="other",
                   start_ns=150_000, duration_ns=100_000)
    stated = dict(http, span_id="5" * 16, parent_span_id="2" * 16, name="upload", phase="network", phase_fallback=0,
                  start_ns=860_000, duration_ns=30_000)
    trace_id = "9" * 32
    store = get_store()
    store.insert("spans", [_row(PROJECT, trace_id, s, base_ns) for s in (http, connect)], tag="tests.summary_sql.first")
    ENGINES[engine]([trace_id])
    early = computed([trace_id])[trace_id]
    assert early["network_ns"] == 600_000 and early["inference_ns"] == 0, "no model call above yet: network"
    store.insert("spans", [_row(PROJECT, trace_id, s, base_ns) for s in (root, call, stated)], tag="tests.summary_sql.later")
    ENGINES[engine]([trace_id])
    row = computed([trace_id])[trace_id]
    assert_same(expected([root, call, http, connect, stated], base_ns), row, trace_id)
    assert row["inference_ns"] == 800_000 - 30_000 and row["network_ns"] == 30_000 and row["other_ns"] == 200_000


def test_the_same_figures_where_a_server_evaluates_both_branches_of_if():
    """A server may be configured to evaluate every branch of ``if`` (short-circuit evaluation off):
    the effective priorities of traces without a model call above a fallback span then run on
    arrays built for the others only, and must neither fail nor change any figure."""
    import time

    base_ns = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    root, call, http = _CHAT_ROOT, _CHAT_CALL, _CHAT_HTTP
    plain = dict(root, span_id="4" * 16, parent_span_id="1" * 16, name="retrieve", phase="preprocess",
                 phase_fallback=0, start_ns=50_000, duration_ns=200_000)
    traces = {"a" * 32: [root, call, http], "b" * 32: [root, plain], "c" * 32: [dict(http, parent_span_id="")]}
    get_store().insert("spans", [_row(PROJECT, t, s, base_ns) for t, spans in traces.items() for s in spans],
                       tag="tests.summary_sql.eager")
    summarize_sql(list(traces), settings="short_circuit_function_evaluation = 'disable'")
    got = computed(list(traces))
    for trace_id, spans in traces.items():
        assert_same(expected(spans, base_ns), got[trace_id], trace_id)
    assert got["a" * 32]["inference_ns"] == 800_000
