"""Per-trace summaries computed in ClickHouse: one ``INSERT … SELECT`` turns the spans of a set of
traces into their ``traces`` rows, every figure of DOMAIN.md "Per trace" included.

``trace_math`` is the reference (tests/test_summary_sql.py requires this SQL to give the same figures on
random trees); the SQL follows it step by step:

1. **One copy per span.** The spans of the traces are grouped by (trace, span id); the newest copy
   (``argMax`` by ``ingested_at``) is the span, and a hash of every copy's (span id, ingested_at)
   adds up to the trace's ``spans_digest``: a trace whose digest equals its latest summary's has
   received nothing since and is not written again.
2. **Per-trace aggregates** (root, status, TTFT, tokens, cost with the price table's estimates,
   per-model maps, the cache outcome: the highest ``spans.cache``) are plain ``-If`` aggregates
   ordered by ``(start, span id)``, as trace_math orders spans.
3. **Exclusive phase time** works on the trace's spans as arrays, in O(n log n):
   - *parent links*: span ids and parent ids are sorted together; ``arrayFill`` carries the last
     span id forward, so a reference finds its parent when the id just before it is the same;
   - *self time*: each child's interval, clipped to its parent, becomes a +1/-1 pair keyed by the
     parent next to the parent's own start and end; sorted by (parent, time), a running sum that
     is zero between two of a parent's boundaries marks the parent's own (uncovered) time;
   - *one phase per instant*: self segments (clipped to the root) carry the span's priority
     (inference > network > preprocess > postprocess > other; the root's own time below all
     other spans'). With ``L(k)`` the time covered by segments of priority >= k, the time whose
     highest priority is k is ``L(k) - L(k+1)``; a phase gets its two priorities' share.
   - *beneath a model call*: a span whose phase came from the fallback rules and whose chain of
     such parents ends at an inference span takes inference's priority (``_effective_priorities``:
     pointer jumping over the parent indexes, as trace_math.phases_effective).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from analytics.trace_math import INHERIT_DEPTH

PHASES = ("network", "preprocess", "inference", "postprocess", "other")
PRIORITY = {"inference": 5, "network": 4, "preprocess": 3, "postprocess": 2, "other": 1}
ROOT_BONUS = 5  # every span but the root ranks 5 higher: priorities 1..10


def prices_json(prices: Mapping[str, tuple[float, float]] | None) -> str:
    """The price table as the statement's ``prices`` parameter: {model: [input, output] USD per 1M tokens}."""
    return json.dumps({str(m): [float(p[0]), float(p[1])] for m, p in (prices or {}).items()})


def _covered(k: int) -> str:
    """Time covered by self segments of priority >= k (``GE``: the sorted +1/-1 events)."""
    return (f"arraySum(arrayMap((c, l) -> if(c > 0, l, 0), "
            f"arrayCumSum(arrayMap(e -> if(e.3 >= {k}, toInt64(e.2), 0), GE)), glen))")


def _phase_expr(phase: str) -> str:
    p = PRIORITY[phase]
    terms = []
    for k in (p, p + ROOT_BONUS):
        upper = f"L{k + 1}" if k + 1 <= 10 else "0"
        terms.append(f"(L{k} - {upper})")
    return "toUInt64(greatest(0, " + " + ".join(terms) + "))"


_PRIORITY_SQL = "multiIf(" + ", ".join(f"ph = '{name}', {p}" for name, p in PRIORITY.items() if name != "other") + ", 1)"
_KNOWN_PHASES = ", ".join(f"'{name}'" for name in PHASES)


# The digest of a trace's stored span copies (``spans_digest``): it changes when a copy is added
# (a late or re-sent span) or merged away; the price table's hash is added to the trace's sum, so a
# new price table changes it too.
SPAN_HASH_SQL = "cityHash64(span_id, ingested_at)"  # one stored copy's part of the digest
DIGEST_SQL = f"sum({SPAN_HASH_SQL})"
_PRICES_HASH = "cityHash64({prices:String})"


def _effective_priorities() -> tuple[str, str, str]:
    """``epris``: each span's priority with a fallback-phase span beneath a model call counted as
    inference (trace_math.phases_effective). Three expressions, each a column of its own level, so
    that ClickHouse analyses every part once (the statement's analysis is a fixed cost of every
    summariser run, ``bench/summary_threads.py``):

    - ``pent``: the parent links with a (span, 0) for every span, sorted by span; empty unless the
      trace has a model call and a fallback span with a parent (only those traces pay for it);
    - ``parents``: the last entry of each span in ``pent``: its parent's index (0: none);
    - ``epris``: chain ends: a fallback span points at its parent, any other span at itself (where
      a chain stops); each step of the fold, ``a = a[a]``, doubles the links followed, so a span
      ends up at the end of its chain. A chain is shorter than the trace, so ceil(log2(spans + 1))
      steps cover it, and never more than ``INHERIT_DEPTH`` (a fold, not an alias per step:
      ClickHouse inlines aliases, and ``a[a]`` would double each time); the end counts only where
      the chain stops (on a cycle of fallback spans the jumps stop on a span of the cycle, which
      ends nothing: no model call is above them). Traces without ``pent`` keep ``pris`` (``if``
      evaluates the other branch only for the rows that take it; where a server evaluates both,
      ``arrayResize`` keeps the arrays of those rows the same length, and their result is unused)."""
    steps = INHERIT_DEPTH.bit_length() - 1
    assert 2 ** steps == INHERIT_DEPTH
    inference = PRIORITY["inference"]
    pent = ("if(fallback_children AND calls > 0, arraySort(arrayConcat(arrayMap(l -> (toUInt64(l.1), toUInt64(l.2)), links),"
            " arrayMap(i -> (toUInt64(i), toUInt64(0)), idxs))), CAST([], 'Array(Tuple(UInt64, UInt64))')) AS pent")
    parents = ("arrayMap(t -> t.2, arrayFilter((t, k) -> k = length(pent) OR pent[k + 1].1 != t.1, pent,"
               " arrayEnumerate(pent))) AS parents")
    chain_ends = (f"arrayFold((a, step) -> arrayMap(x -> a[x], a), range(least({steps}, toUInt64(ceil(log2(length(sp) + 1))))),"
                  f" arrayMap((i, p) -> if(sp[i].6 = 1 AND p > 0, p, toUInt64(i)), idxs, arrayResize(parents, length(idxs))))")
    epris = (f"if(notEmpty(pent), arrayMap((i, e) -> if(sp[i].6 = 1 AND e != i AND sp[e].5 = {inference}"
             f" AND (sp[e].6 = 0 OR parents[e] = 0), pris[i] - sp[i].5 + {inference}, pris[i]), idxs, {chain_ends}), pris)"
             f" AS epris")
    return pent, parents, epris


PARENT_ENTRIES_SQL, PARENTS_SQL, EFFECTIVE_PRIORITIES_SQL = _effective_priorities()


def _spans_where(trace_filter: str, span_filter: str) -> str:
    return f"project_id = {{project_id:UInt64}} AND ({trace_filter}) AND ({span_filter})"


def span_digests_sql(*, trace_filter: str, span_filter: str = "1") -> str:
    """Each trace's (of those ``trace_filter`` selects) digest of its stored spans, as the summary
    written now would carry it (``spans_digest``): a trace whose digest equals its latest summary's
    has received nothing since. Reads three columns of the spans; the caller compares (the latest
    summaries are looked up by id once per batch, ``analytics.summarizer``)."""
    return f"""
SELECT trace_id, {DIGEST_SQL} + {_PRICES_HASH} AS digest FROM spans
WHERE project_id = {{project_id:UInt64}} AND ({trace_filter}) AND ({span_filter})
GROUP BY trace_id
"""


# Every column of ``traces`` but the phase times, from the per-trace aggregates (the innermost
# ``GROUP BY trace_id`` of ``summary_insert_sql``) and ``lo``/``hi`` (the trace's bounds), in order.
_SCALARS = (
    ("project_id", "{project_id:UInt64}"),
    ("trace_id", "trace_id"),
    ("start_time", "fromUnixTimestamp64Nano(lo)"),
    ("e2e_ns", "toUInt64(greatest(0, hi - lo))"),
    ("has_root", "toUInt8(has_root)"),
    ("spans_start", "fromUnixTimestamp64Nano(min_st)"),
    ("spans_end", "fromUnixTimestamp64Nano(max_en)"),
    ("root_name", "if(has_root, root_t.4, first_t.1)"),
    ("service", "if(has_root, root_t.5, first_t.2)"),
    ("model", "if(calls > 0, call_model, any_model)"),
    ("services", "services"),
    ("models", "models"),
    ("phases", "phases"),
    ("status", "multiIf(has_root AND root_t.6 = 'error', 'error', has_root AND error_spans > 0, 'recovered', has_root, 'ok',"
               " error_spans > 0, 'error', 'ok')"),
    ("error_message", "error_message"),
    ("ttft_ns", "if(has_ttft, toUInt64(ttft_t.1), NULL)"),
    ("tpot_ns", "if(has_ttft AND ttft_t.3 >= 2, greatest(0, ttft_t.2 - ttft_t.1) / (ttft_t.3 - 1), NULL)"),
    ("input_tokens", "if(calls_have_tokens, call_in, all_in)"),
    ("output_tokens", "if(calls_have_tokens, call_out, all_out)"),
    ("cost_usd", "if(cost_spans > 0, cost_sum, NULL)"),
    ("cost_estimated", "toUInt8(cost_estimated)"),
    ("span_count", "span_count"),
    ("version", "{version:UInt64}"),
    ("error_spans", "error_spans"),
    ("model_input_tokens", "mapFilter((k, v) -> v != 0, mapFromArrays(by_model.1, if(calls_have_tokens, by_model.2, by_model.4)))"),
    ("model_output_tokens", "mapFilter((k, v) -> v != 0, mapFromArrays(by_model.1, if(calls_have_tokens, by_model.3, by_model.5)))"),
    ("model_cost_usd", "mapFilter((k, v) -> v != 0, mapFromArrays(by_model.1, by_model.6))"),
    ("spans_digest", f"digest + {_PRICES_HASH}"),
    ("loadtest", "toUInt8(loadtest)"),
    ("cache", "toUInt8(cache_max)"),
)
# The columns of ``traces`` the statement writes, in order: those, then the phase times.
COLUMNS = tuple(c for c, _ in _SCALARS) + tuple(f"{p}_ns" for p in PHASES)


def summary_insert_sql(*, trace_filter: str, span_filter: str = "1", threads: int | None = None) -> str:
    """``INSERT INTO traces … SELECT``: the summaries of the traces ``trace_filter`` (a condition on
    ``trace_id``) selects, from their spans that ``span_filter`` selects (a bound on ``start_time``
    that every span of those traces meets). Parameters: ``project_id``, ``version``, ``prices``
    (``prices_json``) and whatever the filters name. ``threads``: ``max_threads`` for the statement
    (None: the server's). A batch of a few thousand traces costs about half the CPU on one thread
    (``bench/summary_threads.py``): split over many, each thread's blocks are small and the
    per-block work of the array stages and the merge of the partial aggregations dominate.

    Every level names the columns it passes on, and the columns of the row that need no array
    stage travel as one tuple (``keep``): ClickHouse's analysis of a ``SELECT *`` level grows with
    the columns it carries, and the statement's analysis is a fixed cost of every summariser run
    (``bench/summary_threads.py`` prints it: "no traces"). For the same reason the plan's
    expression steps are not merged into one (``query_plan_merge_expressions = 0``): merging the
    levels' expressions cost more than it saved (the statement over no traces 125 -> 92 ms CPU,
    over 14,000 spans 211 -> 172 ms)."""
    levels = ",\n        ".join(f"{_covered(k)} AS L{k}" for k in range(1, 11))
    phases = ",\n    ".join(f"{_phase_expr(name)} AS {name}_ns" for name in PHASES)
    keep = ",\n            ".join(expr for _, expr in _SCALARS)
    return f"""
INSERT INTO traces ({", ".join(COLUMNS)})
SELECT untuple(keep),
    {phases}
FROM (
    SELECT keep, {levels}
    FROM (
    SELECT keep, GE,
        arrayPopFront(arrayPushBack(arrayDifference(GE.1), 0)) AS glen
    FROM (
    SELECT keep,
        arraySort(arrayConcat(arrayMap(s -> (s.1, toInt8(1), s.3), own), arrayMap(s -> (s.2, toInt8(-1), s.3), own))) AS GE
    FROM (
    SELECT keep,
        -- each span's own time, clipped to the root: (start, end, priority)
        -- (consecutive boundaries of one span with nothing open between them: a self segment)
        arrayFilter(s -> s.2 > s.1 AND s.3 > 0, arrayMap((p, pn, t, tn, c) -> (greatest(t, lo), least(tn, hi),
            if(p = pn AND c = 0, epris[p], 0)), arrayPopBack(CE.1), arrayPopFront(CE.1), arrayPopBack(CE.2),
            arrayPopFront(CE.2), arrayPopBack(cover))) AS own
    FROM (
    SELECT keep, lo, hi, CE,
        arrayCumSum(arrayMap(e -> toInt64(e.3), CE)) AS cover,
        {EFFECTIVE_PRIORITIES_SQL}
    FROM (
    SELECT keep, lo, hi, sp, idxs, pris, pent,
        -- children clipped to their parent, as (parent, start, end); each span's own start and end
        arraySort(arrayConcat(
            arrayMap(t -> (t.1, t.2, toInt8(1)), kids), arrayMap(t -> (t.1, t.3, toInt8(-1)), kids),
            arrayMap(i -> (i, sts[i], toInt8(0)), idxs), arrayMap(i -> (i, ens[i], toInt8(0)), idxs))) AS CE,
        {PARENTS_SQL}
    FROM (
    SELECT keep, lo, hi, sp, idxs, sts, ens, pris,
        arrayFilter(t -> t.3 > t.2, arrayMap(l -> (l.2, greatest(sts[l.1], sts[l.2]), least(ens[l.1], ens[l.2])), links)) AS kids,
        {PARENT_ENTRIES_SQL}
    FROM (
    SELECT keep, lo, hi, sp, idxs, sts, ens, pris, calls, fallback_children,
        -- parent links: (child index, parent index) for spans whose parent is in the trace
        arrayFilter(l -> l.2 > 0, arrayMap((e, f) -> (e.3, if(e.2 = 1 AND f.2 = 0 AND f.1 = e.1 AND f.3 != e.3, f.3, 0)),
                                           E, arrayFill(e -> e.2 = 0, E))) AS links
    FROM (
    SELECT
        tuple(
            {keep}) AS keep,
        if(has_root, root_t.1, min_st) AS lo,
        if(has_root, root_t.2, max_en) AS hi,
        sp, calls, fallback_children,
        arrayEnumerate(sp) AS idxs,
        arrayMap(x -> x.3, sp) AS sts,
        arrayMap(x -> x.4, sp) AS ens,
        arrayMap(x -> x.5 + if(has_root AND x.1 = root_id, 0, {ROOT_BONUS}), sp) AS pris,
        arraySort(arrayConcat(arrayMap(i -> (sp[i].1, 0, i), idxs), arrayMap(i -> (sp[i].2, 1, i), idxs))) AS E
    FROM (
        SELECT trace_id,
            count() AS span_count,
            countIf(parent = '') > 0 AS has_root,
            argMinIf(sid, (-dur, st, sid), parent = '') AS root_id,
            argMinIf((st, en, dur, name, service, status), (-dur, st, sid), parent = '') AS root_t,
            argMin((name, service), (st, sid)) AS first_t,
            min(st) AS min_st, max(en) AS max_en,
            countIf(status = 'error') AS error_spans,
            argMinIf(status_message, (st, sid), status = 'error') AS error_message,
            countIf(ph = 'inference') AS calls,
            countIf(ph = 'inference' AND (input_tokens > 0 OR output_tokens > 0)) > 0 AS calls_have_tokens,
            sumIf(toUInt64(input_tokens), ph = 'inference') AS call_in, sum(toUInt64(input_tokens)) AS all_in,
            sumIf(toUInt64(output_tokens), ph = 'inference') AS call_out, sum(toUInt64(output_tokens)) AS all_out,
            sumMap([toString(model)], [if(ph = 'inference', toUInt64(input_tokens), 0)],
                   [if(ph = 'inference', toUInt64(output_tokens), 0)], [toUInt64(input_tokens)],
                   [toUInt64(output_tokens)], [ifNull(cost, 0)]) AS by_model,
            argMinIf(model, (st, sid), ph = 'inference') AS call_model,
            argMinIf(model, (st, sid), model != '') AS any_model,
            countIf(ph = 'inference' AND ttft IS NOT NULL) > 0 AS has_ttft,
            argMinIf((toInt64(assumeNotNull(ttft)), dur, toInt64(output_tokens)), (st, sid),
                     ph = 'inference' AND ttft IS NOT NULL) AS ttft_t,
            countIf(cost IS NOT NULL) AS cost_spans,
            sumIf(assumeNotNull(cost), cost IS NOT NULL) AS cost_sum,
            max(estimated) AS cost_estimated,
            arraySort(groupUniqArrayIf(toString(service), service != '')) AS services,
            arraySort(groupUniqArrayIf(toString(model), model != '')) AS models,
            arraySort(groupUniqArrayIf(toString(raw_phase), raw_phase != '')) AS phases,
            groupArray((sid, parent, st, en, {_PRIORITY_SQL}, fallback)) AS sp,
            countIf(fallback = 1 AND parent != '') > 0 AS fallback_children,
            sum(h) AS digest,
            max(loadtest_run_id != '') AS loadtest,
            max(cache_state) AS cache_max
        FROM (
            SELECT trace_id, toString(span_id) AS sid, v.1 AS parent, v.2 AS name, v.3 AS raw_phase,
                if(raw_phase IN ({_KNOWN_PHASES}), raw_phase, 'other') AS ph, v.4 AS service, v.5 AS model,
                toInt64(toUnixTimestamp64Nano(v.6)) AS st, toInt64(v.7) AS dur, st + dur AS en,
                v.8 AS status, v.9 AS status_message, v.10 AS ttft, ifNull(v.11, 0) AS input_tokens, ifNull(v.12, 0) AS output_tokens, v.14 AS loadtest_run_id,
                v.15 AS fallback, v.16 AS cache_state,
                JSONExtract({{prices:String}}, 'Map(String, Array(Float64))') AS price_map,
                mapContains(price_map, toString(model)) AND (input_tokens > 0 OR output_tokens > 0) AS priced,
                if(v.13 IS NOT NULL, v.13,
                   if(priced, (input_tokens * price_map[toString(model)][1] + output_tokens * price_map[toString(model)][2]) / 1000000,
                      NULL)) AS cost,
                v.13 IS NULL AND priced AS estimated,
                h
            FROM (
                SELECT trace_id, span_id,
                    argMax((parent_span_id, name, phase, service, model, start_time, duration_ns, status, status_message,
                            ttft_ns, input_tokens, output_tokens, cost_usd, loadtest_run_id, phase_fallback, cache), ingested_at) AS v,
                    {DIGEST_SQL} AS h
                FROM spans
                WHERE {_spans_where(trace_filter, span_filter)}
                GROUP BY trace_id, span_id
            )
        )
        GROUP BY trace_id
    )))))))))
)
SETTINGS parallel_view_processing = 1, query_plan_merge_expressions = 0{f", max_threads = {int(threads)}" if threads else ""}
"""
