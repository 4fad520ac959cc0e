"""Per-trace figures (DOMAIN.md) on hand-built traces whose answers are known."""

import random

import pytest

from analytics.trace_math import Tree, critical_path, phase_times, self_times, span_cost, trace_summarize

MS = 1_000_000


def span(span_id, parent="", phase="other", start=0, dur=0, **extra):
    row = {"span_id": span_id, "parent_span_id": parent, "phase": phase, "name": f"op-{span_id}",
           "service": "svc", "model": "", "start_ns": start * MS, "duration_ns": dur * MS,
           "status": "ok", "status_message": "", "ttft_ns": None, "input_tokens": 0, "output_tokens": 0,
           "cost_usd": None}
    row.update(extra)
    return row


def chat_trace():
    # root 0..1000: preprocess 0..100, network 100..300 containing inference 150..900?? no: keep nested
    return [
        span("r", start=0, dur=1000),
        span("pre", "r", "preprocess", 0, 100),
        span("net", "r", "network", 100, 800),          # HTTP client call …
        span("llm", "net", "inference", 150, 700,        # … whose server-side model call is inside it
             model="m1", ttft_ns=200 * MS, output_tokens=51, input_tokens=10, cost_usd=0.01),
        span("post", "r", "postprocess", 900, 50),
    ]


def test_phase_times_are_exclusive_and_sum_to_e2e():
    phases = phase_times(chat_trace())
    assert phases == {"preprocess": 100 * MS, "network": 100 * MS, "inference": 700 * MS,
                      "postprocess": 50 * MS, "other": 50 * MS}
    assert sum(phases.values()) == 1000 * MS


def test_overlapping_spans_of_one_phase_count_once():
    spans = [span("r", start=0, dur=100), span("a", "r", "network", 10, 50), span("b", "r", "network", 30, 50)]
    assert phase_times(spans)["network"] == 70 * MS  # 10..80
    assert phase_times(spans)["other"] == 30 * MS


def test_parallel_siblings_of_different_phases_never_exceed_e2e():
    spans = [span("r", start=0, dur=100), span("a", "r", "network", 0, 100), span("b", "r", "preprocess", 0, 100)]
    phases = phase_times(spans)
    assert sum(phases.values()) == 100 * MS
    assert phases["network"] == 100 * MS  # network outranks preprocess where they overlap


def test_child_outside_its_parent_is_clipped_to_the_root():
    spans = [span("r", start=0, dur=100), span("late", "r", "postprocess", 90, 50)]  # clock skew
    phases = phase_times(spans)
    assert phases["postprocess"] == 10 * MS and sum(phases.values()) == 100 * MS


def test_orphans_are_kept_and_root_phase_counts_for_its_own_time():
    spans = [span("r", phase="inference", start=0, dur=100), span("o", "missing", "network", 20, 10)]
    tree = Tree.build(spans)
    assert tree.orphans == ["o"]
    assert phase_times(spans) == {"network": 10 * MS, "preprocess": 0, "inference": 90 * MS, "postprocess": 0, "other": 0}


def test_self_times():
    times = self_times(chat_trace())
    assert times["r"] == 50 * MS  # 950..1000
    assert times["net"] == 100 * MS and times["llm"] == 700 * MS


def test_critical_path_follows_the_last_finishing_child():
    spans = [
        span("r", start=0, dur=100),
        span("a", "r", "network", 0, 60),
        span("b", "r", "inference", 10, 80),   # ends at 90: last to finish
        span("b1", "b", "network", 20, 30),
        span("c", "r", "postprocess", 0, 5),   # hidden under b's start? no: b starts at 10, c ends at 5
    ]
    path = critical_path(spans)
    owners = [seg[0] for seg in path]
    assert path[0] == ("c", 0, 5 * MS)
    assert ("b1", 20 * MS, 50 * MS) in path
    assert ("r", 90 * MS, 100 * MS) in path
    assert "a" not in owners  # a is parallel and finishes earlier than b: not on the path
    assert sum(end - start for _, start, end in path) == 100 * MS  # contiguous cover of the root
    assert ("r", 5 * MS, 10 * MS) in path


def test_critical_path_covers_the_root_exactly_on_random_trees():
    rng = random.Random(7)
    for _ in range(200):
        spans = [span("s0", start=0, dur=1000)]
        for i in range(1, 30):
            parent = spans[rng.randrange(len(spans))]
            p_start, p_dur = parent["start_ns"] // MS, parent["duration_ns"] // MS
            start = p_start + rng.randint(0, max(0, p_dur - 1))
            dur = rng.randint(0, max(1, p_start + p_dur - start + 20))  # sometimes past the parent (skew)
            spans.append(span(f"s{i}", parent["span_id"], rng.choice(["network", "inference", "other"]), start, dur))
        path = critical_path(spans)
        assert sum(end - start for _, start, end in path) == 1000 * MS
        for (_, _, end), (_, start, _) in zip(path, path[1:]):
            assert end == start  # contiguous, no overlap
        phases = phase_times(spans)
        assert sum(phases.values()) <= 1000 * MS
        assert sum(phases.values()) == 1000 * MS  # the root covers everything inside it


def test_trace_summary():
    summary = trace_summarize(chat_trace() + [span("llm2", "r", "inference", 920, 20, model="m2", ttft_ns=5 * MS,
                                                      input_tokens=5, output_tokens=2, status="error",
                                                      status_message="boom")])
    assert summary.e2e_ns == 1000 * MS and summary.has_root
    assert summary.model == "m1"
    assert summary.ttft_ns == 200 * MS
    assert summary.tpot_ns == pytest.approx((700 - 200) * MS / 50)
    assert (summary.input_tokens, summary.output_tokens) == (15, 53)
    # The root succeeded although a model call below it failed: recovered, not an error request.
    assert summary.status == "recovered" and summary.error_message == "boom" and summary.error_spans == 1
    assert summary.cost_usd == pytest.approx(0.01) and not summary.cost_estimated
    assert summary.span_count == 6
    assert summary.phase_share("inference") == pytest.approx(0.72)


def test_cost_estimated_from_price_table_when_not_sent():
    prices = {"m2": (1.0, 2.0)}  # USD per million input / output tokens
    spans = [span("r", start=0, dur=10), span("x", "r", "inference", 0, 5, model="m2", input_tokens=1000, output_tokens=500)]
    summary = trace_summarize(spans, prices=prices)
    assert summary.cost_usd == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6) and summary.cost_estimated
    assert span_cost(spans[1], None) == (None, False)
    assert trace_summarize(spans).cost_usd is None  # unknown is unknown, never 0


def test_duplicates_and_missing_root():
    spans = [span("a", "gone", "network", 10, 10), span("a", "gone", "network", 10, 10), span("b", "gone", "inference", 30, 10)]
    summary = trace_summarize(spans)
    assert not summary.has_root and summary.span_count == 2
    assert summary.start_ns == 10 * MS and summary.e2e_ns == 30 * MS
    assert critical_path(spans) == []


def test_ten_thousand_spans_is_fast_enough_to_run_on_a_page_request():
    import time

    spans = [span("s0", start=0, dur=100_000)]
    for i in range(1, 10_000):
        spans.append(span(f"s{i}", f"s{(i - 1) // 4}", "inference" if i % 3 else "network", i, 50))
    began = time.perf_counter()
    summary = trace_summarize(spans)
    critical_path(spans)
    assert summary.span_count == 10_000
    assert time.perf_counter() - began < 5  # generous: measured ~0.1 s


def test_status_is_the_roots_a_retried_call_is_recovered():
    """DOMAIN.md "Status": a first model call answered 429 and its retry succeeded: the request
    is ok (recovered), one span with an error; the root failing makes it an error; without a root,
    any error span does."""
    retried = [span("r", start=0, dur=1000),
               span("c1", "r", "inference", 10, 50, model="m1", status="error", status_message="429 Too Many Requests"),
               span("c2", "r", "inference", 100, 800, model="m1", output_tokens=20)]
    summary = trace_summarize(retried)
    assert (summary.status, summary.error_spans, summary.error_message) == ("recovered", 1, "429 Too Many Requests")
    failed = [{**retried[0], "status": "error", "status_message": "gave up"}] + retried[1:]
    assert (trace_summarize(failed).status, trace_summarize(failed).error_spans) == ("error", 2)
    assert trace_summarize(retried[1:]).status == "error"  # no root yet: an error span is an error
    assert trace_summarize([retried[0], retried[2]]).status == "ok"
    assert trace_summarize([retried[2]]).status == "ok"


def test_each_call_is_priced_and_counted_under_its_own_model():
    prices = {"small": (1.0, 2.0), "large": (10.0, 30.0)}
    spans = [span("r", start=0, dur=1000),
             span("a", "r", "inference", 0, 100, model="small", input_tokens=1000, output_tokens=100),
             span("b", "r", "inference", 200, 700, model="large", input_tokens=2000, output_tokens=500),
             span("c", "r", "inference", 950, 10, model="large", cost_usd=0.5)]
    summary = trace_summarize(spans, prices=prices)
    assert summary.model == "small"  # the trace's model stays its first call's
    small = (1000 * 1.0 + 100 * 2.0) / 1e6
    large = (2000 * 10.0 + 500 * 30.0) / 1e6 + 0.5
    assert summary.by_model["small"] == (1000, 100, pytest.approx(small))
    assert summary.by_model["large"] == (2000, 500, pytest.approx(large))
    assert summary.cost_usd == pytest.approx(small + large)
