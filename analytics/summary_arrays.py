"""Per-trace summaries from one columnar read of the spans, computed in numpy.

``analytics.summary_sql`` computes every figure inside ClickHouse with one ``INSERT … SELECT``.
Its per-trace aggregates (``argMin`` of tuples, ``sumMap`` by model) and its array stages (a few
dozen lambdas per trace) cost about 13 µs of CPU a span on one thread, and its analysis ~140 ms a
statement, every summariser run (``bench/summary_engines.py``). Here ClickHouse only reads: every
stored copy of the batch's spans, a few columns, as Arrow (no aggregation and no sort, which cost it
more than numpy takes for the same work). numpy then keeps each span's newest copy (by
``ingested_at``; every copy adds to the trace's digest), puts each trace's spans in (start, span id)
order and computes the figures of all the traces of the batch at once, with sorts, cumulative sums
and per-trace reductions over flat arrays (no Python loop over spans), and the rows go back to
ClickHouse column by column in one insert.

It follows ``summary_sql`` (and so ``trace_math``, the reference) step by step; the property test
(tests/test_summary_sql.py) requires both engines to give the reference's figures on random trees:

1. **Per-trace figures**: the first span of a trace in (start, span id) order names it; the root is
   the parentless span of the longest duration (then the earliest, then the least id); the first
   error's message, the first model call's model and TTFT, sums of tokens and cost, per-model sums
   (``model_*`` maps: those with a non-zero value), the distinct services, models and phases.
2. **Exclusive phase time**: each span's children, clipped to it, leave its own (uncovered) time;
   that self time, clipped to the root, carries the span's priority (inference > network >
   preprocess > postprocess > other, the root's own time below every other span's); with ``L(k)``
   the time covered by self time of priority >= k, a phase gets ``L(k) - L(k+1)`` for its two
   priorities. A span whose phase came from the fallback rules and whose chain of such parents ends
   at a model call counts as inference (pointer jumping: ``a = a[a]``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics import summary_sql
from analytics.trace_math import INHERIT_DEPTH
from analytics.trace_presence import SUMMARY_WRITE_TAG
from store import Columns

PHASES = summary_sql.PHASES
_INFERENCE = summary_sql.PRIORITY["inference"]
_ROOT_BONUS = summary_sql.ROOT_BONUS
_JUMPS = INHERIT_DEPTH.bit_length() - 1  # a chain is followed at most INHERIT_DEPTH spans up


def spans_sql(*, trace_filter: str, span_filter: str = "1") -> str:
    """Every stored copy of the spans of the traces ``trace_filter`` selects, with the columns
    ``traces_from_spans`` reads: a plain read, no aggregation and no sort (both are cheaper in
    numpy over these columns than in ClickHouse over the rows: ``bench/summary_engines.py``).
    Parameters: ``project_id``, ``prices`` (``summary_sql.prices_json``, for the digest) and
    whatever the filters name."""
    return f"""
SELECT toString(trace_id) AS trace_id, toString(span_id) AS sid, toString(parent_span_id) AS parent,
    toString(name) AS name, toString(phase) AS raw_phase, toString(service) AS service, toString(model) AS model,
    toInt64(toUnixTimestamp64Nano(start_time)) AS st, toInt64(duration_ns) AS dur,
    toUInt8(status = 'error') AS error, toString(status_message) AS status_message,
    toUInt8(ttft_ns IS NOT NULL) AS has_ttft, toInt64(ifNull(ttft_ns, 0)) AS ttft,
    toUInt64(ifNull(input_tokens, 0)) AS input_tokens, toUInt64(ifNull(output_tokens, 0)) AS output_tokens,
    toUInt8(cost_usd IS NOT NULL) AS has_cost, toFloat64(ifNull(cost_usd, 0)) AS cost,
    toUInt8(loadtest_run_id != '') AS loadtest, toUInt8(phase_fallback) AS fallback, toUInt8(cache) AS cache_state,
    {summary_sql.SPAN_HASH_SQL} AS h, toInt64(toUnixTimestamp64Nano(ingested_at)) AS ingested,
    cityHash64({{prices:String}}) AS prices_hash
FROM spans
WHERE project_id = {{project_id:UInt64}} AND ({trace_filter}) AND ({span_filter})
SETTINGS max_threads = 1
"""


# ``traces`` columns with a DEFAULT that the rows supply all the same (Store.insert's ``defaulted``)
DEFAULTED = ("spans_digest", "loadtest")


def _group_sum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per group sums of ``values`` (groups contiguous, every one non-empty, ``starts`` their first
    indexes)."""
    return np.add.reduceat(values, starts)


def _run_starts(values: np.ndarray) -> np.ndarray:
    """The index of the first element of each run of equal values (``values`` sorted, not empty)."""
    return np.flatnonzero(np.concatenate(([True], values[1:] != values[:-1])))


def _first_where(mask: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the index of its first row where ``mask`` holds, or -1 (rows sorted by group)."""
    first = np.full(n_groups, -1, dtype=np.int64)
    rows = np.flatnonzero(mask)
    if len(rows):
        groups = group[rows]
        at = _run_starts(groups)
        first[groups[at]] = rows[at]
    return first


def _pick(array: pa.Array, index: np.ndarray, default) -> pa.Array:
    """``array[index]``, ``default`` where the index is -1 (an Arrow array: the insert takes it as
    it is)."""
    return pc.fill_null(array.take(pa.array(np.maximum(index, 0), mask=index < 0)), default)


# ``_distinct_sorted`` marks (trace, word) pairs in a table of this many cells beyond 8 a span
# instead of sorting them
DENSE_PAIRS = 1 << 20


def _distinct_sorted(codes: np.ndarray, words: list[str], trace: np.ndarray, starts: np.ndarray) -> pa.ListArray:
    """Per trace, the sorted distinct non-empty strings of a column (``codes`` into ``words``; rows
    grouped by trace), as an Arrow list column."""
    n_traces, width = len(starts), max(1, len(words))
    ordered = sorted(range(len(words)), key=words.__getitem__)
    rank = np.empty(len(words), dtype=np.int64)
    rank[ordered] = np.arange(len(words))
    keep = np.array([w != "" for w in words] or [False], dtype=bool)[codes]
    pairs = trace[keep] * width + rank[codes[keep]]
    if n_traces * width <= 8 * len(codes) + DENSE_PAIRS:
        # a mark per (trace, word) and the marked ones in order: no sort (services, models and
        # phases are a few words each)
        present = np.zeros(n_traces * width, dtype=bool)
        present[pairs] = True
        pairs = np.flatnonzero(present)
    else:
        pairs = np.unique(pairs)  # sorted: by trace, then word
    offsets = np.zeros(n_traces + 1, dtype=np.int32)
    np.cumsum(np.bincount(pairs // width, minlength=n_traces), out=offsets[1:])
    flat = pa.array([words[i] for i in ordered] or [""], type=pa.string()).take(pa.array(pairs % width))
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


def _parents(trace: np.ndarray, sid: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each span's parent's index among the rows (-1: no parent in its trace, or itself). ``sid``
    and ``parent``: the ids as numbers, equal where the strings are."""
    n = len(trace)
    width = int(max(sid.max(), parent.max())) + 1
    own, wanted = trace * width + sid, trace * width + parent
    order = np.argsort(own, kind="stable")
    found = order[np.minimum(np.searchsorted(own[order], wanted), n - 1)]
    rows = np.arange(n)
    return np.where((own[found] == wanted) & (found != rows), found, -1)


def _effective_priorities(pris: np.ndarray, prio: np.ndarray, fallback: np.ndarray, par: np.ndarray) -> np.ndarray:
    """A fallback-phase span whose chain of fallback parents ends at a model call: inference's
    priority (summary_sql._effective_priorities, trace_math.phases_effective)."""
    rows = np.arange(len(pris))
    step = np.where((fallback == 1) & (par >= 0), par, rows)
    for _ in range(_JUMPS):
        nxt = step[step]
        if np.array_equal(nxt, step):
            break
        step = nxt
    end = step
    lifted = (fallback == 1) & (end != rows) & (prio[end] == _INFERENCE) & ((fallback[end] == 0) | (par[end] < 0))
    return np.where(lifted, pris - prio + _INFERENCE, pris)


def _order_by(group: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """The order of rows by (group, offset): one sort of one packed number where both fit in 63
    bits (offsets are non-negative ns), two passes otherwise. numpy's stable sort: the keys come in
    long sorted runs, which it takes as they are (2.5x faster than the default sort on them)."""
    if not len(group):
        return np.zeros(0, dtype=np.int64)
    bits = int(offset.max()).bit_length()
    if int(group.max()).bit_length() + bits <= 63:
        return np.argsort((group.astype(np.int64) << bits) | offset, kind="stable")
    return np.lexsort((offset, group))


def _phase_times(trace, n_traces, st, en, par, epris, lo, hi) -> dict[str, np.ndarray]:
    """Exclusive time per phase of every trace (rows sorted by trace)."""
    n = len(st)
    # children clipped to their parent
    child = np.flatnonzero(par >= 0)
    p = par[child]
    ks, ke = np.maximum(st[child], st[p]), np.minimum(en[child], en[p])
    live = ke > ks
    p, ks, ke = p[live], ks[live], ke[live]
    # A span without a (live) child is all self time: one segment, its whole interval. The others
    # (45 % of the spans of a json-1000 summariser run) are swept: per parent its children's +1/-1, its own start and
    # end (0), sorted by (parent, time); the order of boundaries at one instant changes nothing (a
    # segment between them is empty, and one that is not starts at the last boundary of its
    # instant, after every +1/-1 there)
    parent = np.zeros(n, dtype=bool)
    parent[p] = True
    rows, leaves = np.flatnonzero(parent), np.flatnonzero(~parent)
    ev_p = np.concatenate([p, p, rows, rows])
    ev_t = np.concatenate([ks, ke, st[rows], en[rows]])
    ev_d = np.concatenate([np.ones(len(p), np.int64), -np.ones(len(p), np.int64), np.zeros(2 * len(rows), np.int64)])
    order = _order_by(ev_p, ev_t - st[ev_p])
    ev_p, ev_t, ev_d = ev_p[order], ev_t[order], ev_d[order]
    cover = np.cumsum(ev_d)
    # a self segment: consecutive boundaries of one span with nothing of its children open between
    a, b = ev_p[:-1], ev_p[1:]
    own = (a == b) & (cover[:-1] == 0)
    sp = np.concatenate([a[own], leaves])
    sg = trace[sp]
    s0 = np.maximum(np.concatenate([ev_t[:-1][own], st[leaves]]), lo[sg])
    s1 = np.minimum(np.concatenate([ev_t[1:][own], en[leaves]]), hi[sg])
    pri = epris[sp]
    keep = (s1 > s0) & (pri > 0)
    sg, s0, s1, pri = sg[keep], s0[keep], s1[keep], pri[keep]
    # one phase per instant: L(k), the time covered by segments of priority >= k, per trace
    m = len(sg)
    g_g = np.concatenate([sg, sg])
    g_t = np.concatenate([s0, s1])
    g_d = np.concatenate([np.ones(m, np.int64), -np.ones(m, np.int64)])
    g_p = np.concatenate([pri, pri]).astype(np.int64)
    order = _order_by(g_g, g_t - lo[g_g])  # (trace, time): ties as above
    g_g, g_t, g_d, g_p = g_g[order], g_t[order], g_d[order], g_p[order]
    glen = np.zeros(len(g_t), dtype=np.int64)
    if len(g_t):
        same = g_g[1:] == g_g[:-1]
        glen[:-1] = np.where(same, g_t[1:] - g_t[:-1], 0)
    # open segments per priority after each boundary; the highest open one owns the time up to the
    # next boundary, and L(k) sums the time owned by priorities >= k
    top = np.zeros(len(g_p), dtype=np.int64)  # the highest open priority after each boundary (0: none)
    for k in np.unique(g_p).tolist():  # ascending: a higher priority open at a boundary overrides
        top[np.cumsum(np.where(g_p == k, g_d, 0)) > 0] = k
    owned = np.bincount(g_g * 11 + top, weights=glen, minlength=n_traces * 11).reshape(n_traces, 11)
    at_least = np.cumsum(owned[:, ::-1], axis=1)[:, ::-1].astype(np.int64)  # at_least[:, k]: priorities >= k
    covered = {k: at_least[:, k] for k in range(1, 11)}
    covered[11] = np.zeros(n_traces, dtype=np.int64)
    out = {}
    for phase in PHASES:
        k = summary_sql.PRIORITY[phase]
        share = (covered[k] - covered[k + 1]) + (covered[k + _ROOT_BONUS] - (covered[k + _ROOT_BONUS + 1]
                                                                           if k + _ROOT_BONUS + 1 <= 10 else 0))
        out[phase] = np.maximum(0, share)
    return out


def _codes(values: pa.ChunkedArray, as_list: bool = True) -> tuple[np.ndarray, list[str] | pa.Array]:
    """Integer codes of a string column and the strings they stand for (as an Arrow array unless
    ``as_list``: the span ids' are looked at only where spans tie)."""
    encoded = pc.dictionary_encode(values.combine_chunks())
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary.to_pylist() if as_list else encoded.dictionary


def _in_start_order(rows: np.ndarray, trace: np.ndarray, st: np.ndarray, sid: np.ndarray, words: pa.Array) -> np.ndarray:
    """``rows`` by trace, then start, then span id (``sid``: codes of the ``words``, in no order):
    sorted by trace and start first, then the few runs of spans that start on the same nanosecond
    in one trace are put in the ids' order."""
    if not len(rows):
        return rows
    starts = st[rows]
    rows = rows[_order_by(trace[rows], starts - starts.min())]
    tied = (trace[rows][1:] == trace[rows][:-1]) & (st[rows][1:] == st[rows][:-1])
    if tied.any():
        edges = np.diff(np.concatenate([[0], tied.astype(np.int8), [0]]))
        for first, end in zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) + 1).tolist()):
            run = rows[first:end]
            rows[first:end] = run[np.argsort(words.take(pa.array(sid[run])).to_pylist(), kind="stable")]
    return rows


def summaries_write(store, reads: list[tuple[str | pa.Table, dict]], *, project_id: int, version: int,
                    prices=None) -> Columns:
    """Read the spans each ``(statement, params)`` of ``reads`` selects (``spans_sql``, or the spans
    themselves, with its columns, where they are at hand: analytics.fresh_spans; each read holds
    whole traces, and no trace is in two), compute their traces' rows and insert them into
    ``traces`` in one insert; returns the rows written."""
    parts = [traces_from_spans(spans if isinstance(spans, pa.Table) else
                               store.query_arrow(spans, params, tag="analytics.summarizer.spans"),
                               project_id=project_id, version=version, prices=prices) for spans, params in reads]
    rows = parts[0] if len(parts) == 1 else Columns.concat([p for p in parts if len(p)] or parts[:1])
    store.insert("traces", rows, tag=SUMMARY_WRITE_TAG, defaulted=DEFAULTED)
    return rows


def traces_from_spans(raw: pa.Table, *, project_id: int, version: int, prices=None) -> Columns:
    """The ``traces`` rows (every column of ``summary_sql.COLUMNS``) of the span copies read by
    ``spans_sql``, one per trace, column by column (``Store.insert`` takes them as they are).
    ``prices``: {model: (input, output) USD per 1M tokens}, which estimate the cost of a span that
    states tokens and no cost."""
    prices = prices or {}
    if raw.num_rows == 0:
        return Columns({}, 0)
    # One copy per span, the newest (by ingested_at); every copy adds to its trace's digest. Span
    # and parent ids are coded together: equal strings, equal codes.
    count = raw.num_rows
    tcode, _ = _codes(raw.column("trace_id"), as_list=False)
    id_codes, id_words = _codes(pa.chunked_array(raw.column("sid").chunks + raw.column("parent").chunks), as_list=False)
    sid_code, parent_code = id_codes[:count], id_codes[count:]
    order = np.lexsort((raw.column("ingested").to_numpy(), sid_code, tcode))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (tcode[order][1:] != tcode[order][:-1]) | (sid_code[order][1:] != sid_code[order][:-1])
    kept = order[last]
    digest_by_code = np.zeros(int(tcode.max()) + 1, dtype=np.uint64)
    np.add.at(digest_by_code, tcode, raw.column("h").to_numpy().astype(np.uint64))
    # Traces together, each in (start, span id) order, as trace_math orders spans; from here on
    # every per-span array is in that order (``kept[i]``: the row of span i in ``raw``).
    st_all = raw.column("st").to_numpy()
    kept = _in_start_order(kept, tcode, st_all, sid_code, id_words)

    def num(name: str) -> np.ndarray:
        return raw.column(name).to_numpy()[kept]

    def coded(name: str) -> tuple[np.ndarray, list[str]]:
        codes, words = _codes(raw.column(name))
        return codes[kept], words

    def pick(name: str, index: np.ndarray, default=""):
        return _pick(raw.column(name).combine_chunks(), np.where(index >= 0, kept[np.maximum(index, 0)], -1), default)

    n = len(kept)
    tcode = tcode[kept]
    starts = _run_starts(tcode)
    n_traces = len(starts)
    trace = np.repeat(np.arange(n_traces), np.diff(np.append(starts, n)))
    st, dur = st_all[kept], num("dur")
    en = st + dur
    phase_code, phase_words = coded("raw_phase")
    prio = np.array([summary_sql.PRIORITY.get(w, 1) for w in phase_words] or [1], dtype=np.int64)[phase_code]
    error = num("error").astype(bool)
    fallback = num("fallback").astype(np.int64)
    has_ttft = num("has_ttft").astype(bool)
    tin, tout = num("input_tokens"), num("output_tokens")
    # the price table's estimate where a span states tokens and no cost (ClickHouse's arithmetic)
    model_code, model_words = coded("model")
    price_in = np.array([float(prices[m][0]) if m in prices else 0.0 for m in model_words] or [0.0])[model_code]
    price_out = np.array([float(prices[m][1]) if m in prices else 0.0 for m in model_words] or [0.0])[model_code]
    listed = np.array([m in prices for m in model_words] or [False])[model_code]
    stated = num("has_cost").astype(bool)
    priced = listed & ((tin > 0) | (tout > 0))
    has_cost = stated | priced
    estimate = (tin.astype(np.float64) * price_in + tout.astype(np.float64) * price_out) / 1000000
    cost = np.where(stated, num("cost"), np.where(priced, estimate, 0.0))
    estimated = (~stated & priced).astype(np.int64)
    parentless = pc.equal(raw.column("parent"), "").combine_chunks().to_numpy(zero_copy_only=False)[kept]
    inference = prio == _INFERENCE

    # the root: parentless, longest, then earliest (rows are in (start, span id) order)
    cand = np.flatnonzero(parentless)
    root = np.full(n_traces, -1, dtype=np.int64)
    if len(cand):
        order = np.lexsort((cand, -dur[cand], trace[cand]))
        groups = trace[cand][order]
        at = _run_starts(groups)
        root[groups[at]] = cand[order][at]
    has_root = root >= 0
    min_st = np.minimum.reduceat(st, starts)
    max_en = np.maximum.reduceat(en, starts)
    lo = np.where(has_root, st[np.maximum(root, 0)], min_st)
    hi = np.where(has_root, en[np.maximum(root, 0)], max_en)

    # priorities: every span but the root 5 higher; beneath a model call, inference
    is_root = np.zeros(n, dtype=bool)
    is_root[root[has_root]] = True
    pris = prio + np.where(is_root, 0, _ROOT_BONUS)
    par = _parents(trace, sid_code[kept], parent_code[kept])
    epris = _effective_priorities(pris, prio, fallback, par)
    phase_ns = _phase_times(trace, n_traces, st, en, par, epris, lo, hi)

    span_count = np.diff(np.append(starts, n))
    error_spans = _group_sum(error.astype(np.int64), starts)
    calls = _group_sum(inference.astype(np.int64), starts)
    calls_have_tokens = _group_sum((inference & ((tin > 0) | (tout > 0))).astype(np.int64), starts) > 0
    call_in = _group_sum(np.where(inference, tin, 0).astype(np.uint64), starts)
    call_out = _group_sum(np.where(inference, tout, 0).astype(np.uint64), starts)
    all_in = _group_sum(tin.astype(np.uint64), starts)
    all_out = _group_sum(tout.astype(np.uint64), starts)
    cost_spans = _group_sum(has_cost.astype(np.int64), starts)
    cost_sum = _group_sum(np.where(has_cost, cost, 0.0), starts)
    estimated = np.maximum.reduceat(estimated, starts)
    loadtest = np.maximum.reduceat(num("loadtest"), starts)
    cache = np.maximum.reduceat(num("cache_state"), starts)
    digest = digest_by_code[tcode[starts]] + np.uint64(raw.column("prices_hash")[0].as_py())

    first_error = _first_where(error, trace, n_traces)
    first_call = _first_where(inference, trace, n_traces)
    first_model = _first_where(np.array([m != "" for m in model_words] or [False])[model_code],
                               trace, n_traces)
    first_ttft = _first_where(inference & has_ttft, trace, n_traces)

    root_or_first = np.where(has_root, root, starts)
    root_name = pick("name", root_or_first)
    service = pick("service", root_or_first)
    call_model = pick("model", first_call)
    any_model = pick("model", first_model)
    error_message = pick("status_message", first_error)
    trace_id_list = pick("trace_id", starts).to_pylist()  # a list: the summariser and TracePresence read it
    root_error = np.where(has_root, error[np.maximum(root, 0)], False)

    # per model: (trace, model) sums of the five token figures and the cost
    width = max(1, len(model_words))
    key = trace * width + model_code
    keys, slot = np.unique(key, return_inverse=True)
    by = {name: np.bincount(slot, weights=w, minlength=len(keys)) for name, w in (
        ("call_in", np.where(inference, tin, 0)), ("call_out", np.where(inference, tout, 0)),
        ("all_in", tin), ("all_out", tout), ("cost", np.where(has_cost, cost, 0.0)))}
    key_trace, key_code = keys // width, keys % width
    by_call = calls_have_tokens[key_trace]
    model_names = pa.array(model_words, type=pa.string())

    def by_model(values: np.ndarray, arrow_type) -> pa.MapArray:
        """A ``Map`` column: each trace's models with a non-zero value."""
        entries = np.flatnonzero(values != 0)
        offsets = np.zeros(n_traces + 1, dtype=np.int32)
        np.cumsum(np.bincount(key_trace[entries], minlength=n_traces), out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), model_names.take(pa.array(key_code[entries])),
                                       pa.array(values[entries], type=arrow_type))

    maps_in = by_model(np.where(by_call, by["call_in"], by["all_in"]).astype(np.uint64), pa.uint64())
    maps_out = by_model(np.where(by_call, by["call_out"], by["all_out"]).astype(np.uint64), pa.uint64())
    maps_cost = by_model(by["cost"], pa.float64())

    ttft_at = np.maximum(first_ttft, 0)
    ttft_v, ttft_dur, ttft_out = num("ttft")[ttft_at], dur[ttft_at], tout[ttft_at].astype(np.int64)
    has_t = first_ttft >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.maximum(0, ttft_dur - ttft_v) / (ttft_out - 1)
    status = np.where(has_root & root_error, "error", np.where(has_root & (error_spans > 0), "recovered",
                      np.where(has_root, "ok", np.where(error_spans > 0, "error", "ok"))))
    columns = {
        "project_id": np.full(n_traces, project_id, dtype=np.uint64), "trace_id": trace_id_list,
        "start_time": lo, "e2e_ns": np.maximum(0, hi - lo), "has_root": has_root.astype(np.uint8),
        "spans_start": min_st, "spans_end": max_en, "root_name": root_name, "service": service,
        "model": pc.if_else(pa.array(calls > 0), call_model, any_model),
        "services": _distinct_sorted(*coded("service"), trace, starts),
        "models": _distinct_sorted(model_code, model_words, trace, starts),
        "phases": _distinct_sorted(phase_code, phase_words, trace, starts),
        "status": pa.array(status, type=pa.string()), "error_message": error_message,
        "ttft_ns": _nullable(ttft_v, has_t, pa.uint64()), "tpot_ns": _nullable(tpot, has_t & (ttft_out >= 2), pa.float64()),
        "input_tokens": np.where(calls_have_tokens, call_in, all_in),
        "output_tokens": np.where(calls_have_tokens, call_out, all_out),
        "cost_usd": _nullable(cost_sum, cost_spans > 0, pa.float64()), "cost_estimated": estimated.astype(np.uint8),
        "span_count": span_count, "version": np.full(n_traces, version, dtype=np.uint64), "error_spans": error_spans,
        "model_input_tokens": maps_in, "model_output_tokens": maps_out, "model_cost_usd": maps_cost,
        "spans_digest": digest, "loadtest": loadtest.astype(np.uint8), "cache": cache.astype(np.uint8),
    }
    for phase in PHASES:
        columns[f"{phase}_ns"] = phase_ns[phase]
    return Columns(columns, n_traces)


def _nullable(values: np.ndarray, present: np.ndarray, arrow_type) -> pa.Array:
    """A Nullable column: the value where ``present``, null elsewhere."""
    return pa.array(np.where(present, values, 0).astype(arrow_type.to_pandas_dtype()), type=arrow_type, mask=~present)
