"""Time series split by the values of a span or resource attribute (``group_by=user.tier``).

The rollups keep no attributes, so a grouped series is read from the per-trace summaries
(``traces``, latest version of each trace) joined to the value each trace carries, in one round
trip per chart. Requests and status follow DOMAIN.md: a bucket counts the requests whose root
starts in it, a request's status is its root's, P95 is exact over the bucket's requests.

Which value a trace belongs to: the value on the **earliest span** (by start time) of the trace
that carries the key with a non-empty value, as a span attribute, else as a resource attribute of
that span (an empty value does not carry the key, as in the Variants view). A trace
whose spans carry two values (a retried call routed elsewhere) therefore counts once, under its
first. Traces without the key form the ``(none)`` group.

The groups: the ``top`` values with the most requests in the window (ties by value), then
``other`` (every other value, pooled: its P95 is over those requests together), then ``(none)``.
Groups of kind ``other`` and ``none`` are returned only when they hold requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from store import get_store

from . import attribute_index
from .panel_selectors import _params, window_requests_sql
from .selectors import bucket_seconds, bucket_times

MAX_KEY = 256
DEFAULT_TOP = 5
MAX_TOP = 20
KIND_VALUE, KIND_OTHER, KIND_NONE = 0, 1, 2
KIND_NAMES = {KIND_VALUE: "value", KIND_OTHER: "other", KIND_NONE: "none"}
LABELS = {KIND_OTHER: "other", KIND_NONE: "(none)"}


@dataclass(frozen=True)
class GroupSeries:
    value: str  # the attribute's value; "other" / "(none)" for those kinds
    kind: str  # "value" | "other" | "none"
    requests: int  # in the whole window
    errors: int
    e2e_p95_ms: float | None
    cost_usd: float
    bucket_requests: list[int]
    bucket_errors: list[int]
    bucket_p95_ms: list[float | None]  # None: no request of the group started in the bucket
    bucket_cost_usd: list[float | None]

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def bucket_error_rate(self) -> list[float | None]:
        return [e / n if n else None for n, e in zip(self.bucket_requests, self.bucket_errors)]


@dataclass(frozen=True)
class GroupedSeries:
    key: str
    top: int
    step_seconds: int
    times: list[datetime]
    groups: list[GroupSeries]


# One row per (bucket, group) and one per group over the whole window (bucket_ms = -1), from
# GROUPING SETS, in one pass: ``tv`` is each trace's value (see the module docstring; spans read in
# the window's range widened for clock skew and late spans, as _ATTRIBUTE_TRACES does), joined to
# the window's requests and aggregated per (bucket, value) first — counts, sums and the exact P95's
# state (every value, merged exactly below) — so the ranking runs over those few rows, not over
# every request: ``vn`` counts each value's requests and ``rnk`` ranks the values by it (ties by
# value; traces without the key rank last), so the top N, other and (none) need no second read.

# The rule of the module docstring, shared with the Variants view (analytics.variants) and the
# grouped alert rules (alerts.latency): the query giving each trace carrying the key its value
# ``v`` (its earliest such span): one row per trace, from the attribute index when the key is
# indexed (analytics.attribute_index), else from one scan of the spans in the window's range
# widened for clock skew and late spans. Both come from ``spans.dims`` (the span's short values,
# span attribute over resource attribute, filled at insert), never the attribute maps with their
# prompts; a value over store.schema.DIM_VALUE_MAX bytes does not group.


def earliest_key_sql(value: str) -> str:
    """The order that finds a trace's earliest span carrying the key (``argMin(value, this)``): its
    start, ties (two such spans starting on the same nanosecond) broken by a hash of the value, so
    the pick never depends on read order. One 128-bit number, not a (start, tie) tuple: ~15 % off
    the assignment's scan over 7 days (tuples compare element by element)."""
    return f"bitShiftLeft(toUInt128(toUnixTimestamp64Nano(start_time)), 64) + cityHash64({value})"


HOST_KEY = "host.name"  # the attribute naming the host a span ran on (= resource_samples.host)
HOST_CODES = 65536  # a (host, minute) code: unix minute * HOST_CODES + the host's place (1-based) in its list
MAX_CODED_HOSTS = HOST_CODES - 1


def host_list_sql(param: str) -> str:
    """The hosts of a (host, minute) code: a parameter holding a JSON array of host names (the same
    list, so the same places, in every read that codes or decodes them)."""
    return f"JSONExtract({{{param}:String}}, 'Array(String)')"


def host_minute_code_sql(place: str, minute: str) -> str:
    """The code of (a host, a unix minute): ``place`` is the host's place (1-based) in its list
    (host_list_sql), ``minute`` the unix minute: one number, cheap to carry, collect and compare
    (a tuple with the host's name is not)."""
    return f"toUInt64({minute}) * {HOST_CODES} + {place}"


def trace_value_sql(*, key: str = "attr_key", since: str = "start_ms", until: str = "end_ms",
                    unit: str = "Milli", lower: str = ">=", upper: str = "<", hosts: str | None = None) -> str:
    """The assignment query: ``key``/``since``/``until`` name the parameters (``unit``: Milli or
    Nano), ``lower``/``upper`` the window's bound operators.

    It reads the attribute index (``span_key_values``, analytics.attribute_index) when the project
    declared the key and its backfill is done, and otherwise scans the spans: two branches, each
    guarded by attribute_index.ready_sql. Both give the same rows.

    ``hosts`` (the Variants view's GPU read): the name of a parameter holding a JSON array of host
    names (host_list_sql). Each row then also carries ``hm``: the codes (host_minute_code_sql) of
    the listed hosts the trace ran on (their ``host.name``, read as any key's value), each at the
    minute of the trace's first span there: the trace's value and its hosts in one pass. The value
    comes from the index when the key is indexed, and then the hosts too once ``host.name`` is (an
    index row holds a trace's first start on a host; a late span that started earlier adds a row,
    and the least minute is kept), else from the spans; without the key indexed, both come from
    one scan of the spans."""
    value = f"dims[{{{key}:String}}]"
    bounds = (f"start_time {lower} fromUnixTimestamp64{unit}({{{since}:Int64}}) - toIntervalMinute(5)\n"
              f"      AND start_time {upper} fromUnixTimestamp64{unit}({{{until}:Int64}}) + toIntervalHour(1)")
    indexed = attribute_index.ready_sql(f"{{{key}:String}}")
    if hosts is None:
        return f"""SELECT trace_id, argMin(value, {earliest_key_sql("value")}) AS v
    FROM span_key_values
    WHERE project_id = {{project_id:UInt64}} AND key = {{{key}:String}}
      AND {bounds}
      AND {indexed} > 0
    GROUP BY trace_id
    UNION ALL
    SELECT trace_id, argMin({value}, {earliest_key_sql(value)}) AS v
    FROM spans
    WHERE project_id = {{project_id:UInt64}}
      AND {bounds}
      AND mapContains(dims, {{{key}:String}})
      AND {indexed} = 0
    GROUP BY trace_id"""
    listed = host_list_sql(hosts)
    host_indexed = attribute_index.ready_sql(f"'{HOST_KEY}'")

    def code(host: str) -> str:
        return host_minute_code_sql(f"indexOf({listed}, {host})", "intDiv(toUnixTimestamp(start_time), 60)")

    span_host = f"dims['{HOST_KEY}']"
    # Of each host its first code (the codes sorted by host, then minute): a sort of a few numbers a
    # trace, ~40 ms less at 7 days of 10 M spans than minMap's map per trace. With the key indexed,
    # its rows come from the index and the hosts' from the index too once ``host.name`` is ready
    # (else from the spans: a project at its key cap, or before the backfill), each sub-select
    # computing only its own columns before one GROUP BY (~12 ms less than both on every row).
    # Without the key indexed, one scan of the spans gives both.
    place = f"% {HOST_CODES}"
    return f"""SELECT trace_id, v, arrayFilter((c, before) -> c {place} != before {place},
        arraySort(c -> (c {place}, c), codes) AS sorted, arrayPopBack(arrayPushFront(sorted, 0))) AS hm
    FROM (
    SELECT trace_id, argMinIf(key_value, earliest, is_key) AS v, groupArrayIf(code, NOT is_key) AS codes
    FROM (
        SELECT trace_id, value AS key_value, {earliest_key_sql("value")} AS earliest, toUInt64(0) AS code, 1 AS is_key
        FROM span_key_values
        WHERE project_id = {{project_id:UInt64}} AND key = {{{key}:String}} AND {bounds} AND {indexed} > 0
        UNION ALL
        SELECT trace_id, '' AS key_value, toUInt128(0) AS earliest, {code("value")} AS code, 0 AS is_key
        FROM span_key_values
        WHERE project_id = {{project_id:UInt64}} AND key = '{HOST_KEY}' AND value IN {listed} AND {bounds}
          AND {indexed} > 0 AND {host_indexed} > 0
        UNION ALL
        SELECT trace_id, '' AS key_value, toUInt128(0) AS earliest, {code(span_host)} AS code, 0 AS is_key
        FROM spans
        WHERE project_id = {{project_id:UInt64}} AND {span_host} IN {listed} AND {bounds}
          AND {indexed} > 0 AND {host_indexed} = 0)
    GROUP BY trace_id
    HAVING countIf(is_key) > 0
    UNION ALL
    SELECT trace_id, argMinIf({value}, {earliest_key_sql(value)}, mapContains(dims, {{{key}:String}})) AS v,
           groupArrayIf({code(span_host)}, {span_host} IN {listed}) AS codes
    FROM spans
    WHERE project_id = {{project_id:UInt64}}
      AND {bounds}
      AND (mapContains(dims, {{{key}:String}}) OR {span_host} IN {listed})
      AND {indexed} = 0
    GROUP BY trace_id
    HAVING countIf(mapContains(dims, {{{key}:String}})) > 0)"""


TRACE_VALUE_SQL = trace_value_sql()


_SQL = """
WITH tv AS (SELECT trace_id, v, 1 AS has FROM ({{trace_value}}))
SELECT if(grouping(bucket_ms) = 1, toInt64(-1), bucket_ms) AS bucket, kind, label,
       sum(n) AS requests, sum(e) AS errors, quantileExactMerge(0.95)(q) AS p95_ns, sum(c) AS cost
FROM (
    SELECT bucket_ms, n, e, q, c,
           multiIf(has = 0, {none}, rnk <= {{top:UInt32}}, {value}, {other}) AS kind,
           if(kind = {value}, v, '') AS label
    FROM (
        SELECT *, dense_rank() OVER (ORDER BY has DESC, vn DESC, v) AS rnk
        FROM (
            SELECT *, sum(n) OVER (PARTITION BY has, v) AS vn
            FROM (
                SELECT toInt64(intDiv(toUnixTimestamp64Milli(t.start_time), {{step_ms:UInt64}}) * {{step_ms:UInt64}}) AS bucket_ms,
                       tv.has AS has, tv.v AS v, count() AS n, countIf(t.status = 'error') AS e,
                       quantileExactState(0.95)(t.e2e_ns) AS q, sum(ifNull(t.cost_usd, 0)) AS c
                FROM ({requests}) AS t
                LEFT JOIN tv ON t.trace_id = tv.trace_id
                GROUP BY bucket_ms, has, v
            )
        )
    )
)
GROUP BY GROUPING SETS ((bucket_ms, kind, label), (kind, label))
""".format(requests=window_requests_sql("trace_id, start_time, e2e_ns, status, cost_usd"),
           none=KIND_NONE, value=KIND_VALUE, other=KIND_OTHER).replace(
    "{trace_value}", TRACE_VALUE_SQL)


def grouped_series(*, project_id: int, start: datetime, end: datetime, key: str, top: int = DEFAULT_TOP,
                   service: str = "", model: str = "", points: int = 120) -> GroupedSeries:
    """Requests, errors, E2E P95 and cost per time bucket for each group of ``key`` (see the
    module docstring), ordered: the top values by requests, then other, then (none)."""
    if not key or len(key) > MAX_KEY:
        raise ValueError(f"group_by must be 1 to {MAX_KEY} characters")
    if not 1 <= top <= MAX_TOP:
        raise ValueError(f"group_top must be from 1 to {MAX_TOP}")
    attribute_index.key_declare(project_id=project_id, key=key)
    step = bucket_seconds(start=start, end=end, points=points)
    times = bucket_times(start=start, end=end, step=step)
    index = {int(t.timestamp() * 1000): i for i, t in enumerate(times)}
    n = len(times)
    acc: dict[tuple[int, str], dict] = {}
    params = _params(project_id, start, end, service, model, step_ms=step * 1000, attr_key=key, top=top)
    for r in get_store().query(_SQL, params, tag="analytics.grouping.grouped_series").dicts():
        g = acc.setdefault((int(r["kind"]), r["label"]), {
            "requests": 0, "errors": 0, "p95": None, "cost": 0.0, "b_req": [0] * n, "b_err": [0] * n,
            "b_p95": [None] * n, "b_cost": [None] * n})
        p95 = round(float(r["p95_ns"]) / 1e6, 3) if r["requests"] else None
        if r["bucket"] == -1:
            g.update(requests=int(r["requests"]), errors=int(r["errors"]), p95=p95, cost=float(r["cost"]))
            continue
        i = index.get(r["bucket"])
        if i is not None:
            g["b_req"][i], g["b_err"][i] = int(r["requests"]), int(r["errors"])
            g["b_p95"][i], g["b_cost"][i] = p95, float(r["cost"])
    order = sorted(acc, key=lambda k: (k[0], -acc[k]["requests"], k[1]))
    groups = [GroupSeries(value=LABELS.get(kind, label), kind=KIND_NAMES[kind], requests=acc[(kind, label)]["requests"],
                          errors=acc[(kind, label)]["errors"], e2e_p95_ms=acc[(kind, label)]["p95"],
                          cost_usd=acc[(kind, label)]["cost"], bucket_requests=acc[(kind, label)]["b_req"],
                          bucket_errors=acc[(kind, label)]["b_err"], bucket_p95_ms=acc[(kind, label)]["b_p95"],
                          bucket_cost_usd=acc[(kind, label)]["b_cost"])
              for kind, label in order]
    return GroupedSeries(key=key, top=top, step_seconds=step, times=times, groups=groups)


def grouped_json(series: GroupedSeries) -> dict:
    """The JSON of a grouped series (the overview, costs and series API answers share it)."""
    return {"key": series.key, "top": series.top, "step_seconds": series.step_seconds,
            "times": [t.isoformat() for t in series.times],
            "groups": [{"value": g.value, "kind": g.kind, "requests": g.requests, "errors": g.errors,
                        "error_rate": g.error_rate, "e2e_p95_ms": g.e2e_p95_ms, "cost_usd": g.cost_usd,
                        "series": {"requests": g.bucket_requests, "errors": g.bucket_errors,
                                   "error_rate": g.bucket_error_rate(), "e2e_p95_ms": g.bucket_p95_ms,
                                   "cost_usd": g.bucket_cost_usd}}
                       for g in series.groups]}


KEY_SAMPLE_SPANS = 20_000  # the key suggestions read this many spans of the window at most


def attribute_keys(*, project_id: int, start: datetime, end: datetime, limit: int = 100,
                   sample: int = KEY_SAMPLE_SPANS) -> list[str]:
    """Up to ``limit`` span and resource attribute keys seen in the window that can group (a value of
    at most store.schema.DIM_VALUE_MAX bytes: the keys of ``spans.dims``; a prompt's key cannot), from
    at most ``sample`` of its spans: the filter bar's suggestions for ``group_by`` (and the Variants
    view's, analytics.variants.key_suggestions). Only the keys are read, never the values (prompts):
    at 8 M spans in the window ~83 MiB and 95 ms less than reading the attribute maps."""
    r = get_store().query(
        "SELECT groupUniqArray({limit:UInt32})(k) AS keys FROM ("
        " SELECT arrayJoin(ks) AS k FROM ("
        "  SELECT mapKeys(dims) AS ks FROM spans WHERE project_id = {project_id:UInt64}"
        "  AND start_time >= fromUnixTimestamp64Milli({start_ms:Int64}) AND start_time < fromUnixTimestamp64Milli({end_ms:Int64})"
        "  LIMIT {sample:UInt32}))",
        _params(project_id, start, end, "", "", limit=limit, sample=sample),
        tag="analytics.grouping.attribute_keys").dicts()[0]
    return sorted(k for k in r["keys"] if k)
