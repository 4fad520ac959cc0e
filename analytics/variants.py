"""The Variants view's reads (docs/variants.md): two or more values of one span or resource
attribute (``llm.quantization``, ``service.version``, a prompt version…) side by side over one
window, each figure with its difference from the first value (the baseline) and a 95 % interval.

Which trace belongs to a value: a trace carrying the key on any span (span attribute, or resource
attribute such as ``service.version``) belongs to the value of its *earliest* span carrying it
(``argMin`` by start; ties on the same nanosecond by a hash of the value:
``grouping.earliest_key_sql``), so a trace whose spans carry two
values counts once, under the first. Requests are the window's traces with a root (DOMAIN.md), their status the root's.

Round trips: ``top_values`` (the default values, when none are given), ``key_suggestions``, then
the hosts with GPU samples in the window (a small read), then one read of the request figures with
their scores (a uniform sample of at most ``SAMPLE_CAP`` per-trace values per variant for the
bootstrap; each request's scores, FINAL, joined to it) and, when there are such hosts, each
variant's (host, minute) codes — the minutes its requests first ran on each of them — with the
window's GPU samples read beside it and matched in numpy. All scoped by project. The traces are
assigned once, with the grouped series' query (analytics.grouping.trace_value_sql).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from store import get_store

from . import attribute_index
from . import significance as sig
from .grouping import HOST_CODES, HOST_KEY, MAX_CODED_HOSTS, attribute_keys, host_list_sql, host_minute_code_sql, trace_value_sql
from .panel_selectors import _params, reads_concurrently, window_requests_sql

DEFAULT_KEY = "llm.quantization"
DEFAULT_TOP = 4
MAX_VALUES = 8
SAMPLE_CAP = 20_000  # per-trace values per variant read for a bootstrap (groupArraySample, seeded)
SAMPLE_SEED = 17

# The trace ids of the window's requests (from traces_by_start: panel_selectors.window_requests_sql),
# to prefilter the scores and spans the reads join to.
_WINDOW_TRACE_IDS = window_requests_sql("trace_id")


def _assigned(hosts: bool = False) -> str:
    """trace_id -> its variant (the value on its earliest span carrying the key; an empty value is
    no value): the grouped series' assignment (analytics.grouping): the attribute index, or a scan
    of the spans. ``hosts``: each trace also carries ``hm``, its (host, minute) codes among the
    hosts with GPU samples (parameter ``gpu_hosts``; grouping.trace_value_sql)."""
    if hosts:
        return f"SELECT trace_id, v AS variant, hm FROM ({trace_value_sql(hosts='gpu_hosts')})"
    return f"SELECT trace_id, v AS variant FROM ({trace_value_sql()})"


# The window's requests with their variant (only the chosen values).
_VARIANT_TRACES_TEMPLATE = """SELECT t.*, a.variant AS variant__HM__
    FROM (__REQUESTS__) AS t
    INNER JOIN (__ASSIGNED__) AS a ON t.trace_id = a.trace_id
    WHERE a.variant IN (__VALUES__)""".replace(
    "__REQUESTS__", window_requests_sql("trace_id, start_time, e2e_ns, status, ttft_ns, tpot_ns, output_tokens, cost_usd"))


def _values(n: int) -> str:
    """One ``{vI:String}`` parameter per chosen value (the count, never a value, is written into the SQL)."""
    return ", ".join(f"{{v{i}:String}}" for i in range(max(n, 1)))


def _variant_traces(n: int, hosts: bool = False) -> str:
    """The window's requests of the ``n`` chosen values, with their variant (and ``hm``, ``_assigned``)."""
    return (_VARIANT_TRACES_TEMPLATE.replace("__ASSIGNED__", _assigned(hosts)).replace("__VALUES__", _values(n))
            .replace("__HM__", ", a.hm AS hm" if hosts else ""))


def _p(project_id: int, start: datetime, end: datetime, service: str, model: str, key: str,
       values: list[str] | None = None, **extra) -> dict:
    values = list(values or [])
    return _params(project_id, start, end, service, model, attr_key=key, n_values=len(values),
                   **{f"v{i}": v for i, v in enumerate(values or [""])}, **extra)


def top_values(*, project_id: int, start: datetime, end: datetime, key: str, service: str = "", model: str = "",
               limit: int = DEFAULT_TOP) -> list[str]:
    """The key's values by requests in the window, most first (the default choice)."""
    attribute_index.key_declare(project_id=project_id, key=key)
    sql = (f"SELECT a.variant AS variant, count() AS n FROM ({_WINDOW_TRACE_IDS}) AS t"
           f" INNER JOIN ({_assigned()}) AS a ON t.trace_id = a.trace_id"
           " GROUP BY variant ORDER BY n DESC, variant LIMIT {limit:UInt32}")
    rows = get_store().query(sql, _p(project_id, start, end, service, model, key, limit=limit),
                             tag="analytics.variants.top_values").dicts()
    return [r["variant"] for r in rows]


def key_suggestions(*, project_id: int, start: datetime, end: datetime, limit: int = 5000) -> list[str]:
    """Attribute keys (span and resource) that can name a variant, up to 200 of them, seen on up to
    ``limit`` of the window's spans: cheap hints (the group-by suggestions' read,
    analytics.grouping.attribute_keys)."""
    return attribute_keys(project_id=project_id, start=start, end=end, limit=200, sample=limit)


# Each request's scores (latest version of each), as parallel arrays: (name, type, label) and value.
# The window's trace ids select them (scores are ordered by trace); building that set is ~30 ms at
# 7 days of 10 M spans (274k ids), so a project that has no score at all skips it: the count is a
# scalar subquery, folded to a constant before the set would be built (as the GPU read's guard).
_TRACE_SCORES = f"""SELECT trace_id, groupArray((name, data_type, label)) AS score_keys, groupArray(value) AS score_values
    FROM (SELECT trace_id, name, data_type, value,
                 if(data_type = 'categorical', string_value,
                    if(data_type = 'boolean', toString(value), toString(round(value, 2)))) AS label
          FROM scores FINAL WHERE project_id = {{project_id:UInt64}}
            AND (SELECT count() FROM scores WHERE project_id = {{project_id:UInt64}}) > 0
            AND trace_id IN ({_WINDOW_TRACE_IDS}))
    GROUP BY trace_id"""


def _figures_read(params: dict, hosts: bool = False) -> tuple[dict[str, dict], list[dict]]:
    """Each variant's request figures, and its scores per (name, type, label): count, sum, sum of
    squares — one read, so the traces are assigned once (the scores join the requests they belong to).
    ``hosts``: each variant's figures also hold ``gpu_codes``, the (host, minute) codes its requests
    ran in on the hosts with GPU samples (``_gpu_figures`` matches them to the samples)."""
    sql = f"""SELECT variant, count() AS requests, countIf(status = 'error') AS errors,
        sum(output_tokens) AS output_total, sum(ifNull(cost_usd, 0)) AS cost_total,
        varSamp(ifNull(cost_usd, 0)) AS cost_var,
        quantilesExact(0.5, 0.95, 0.99)(e2e_ns) AS e2e_q,
        countIf(ttft_ns IS NOT NULL) AS ttft_n, quantileExact(0.95)(ttft_ns) AS ttft_p95,
        countIf(tpot_ns IS NOT NULL) AS tpot_n, quantileExact(0.95)(tpot_ns) AS tpot_p95,
        groupArraySample({SAMPLE_CAP}, {SAMPLE_SEED})(e2e_ns) AS e2e_sample,
        groupArraySampleIf({SAMPLE_CAP}, {SAMPLE_SEED})(assumeNotNull(ttft_ns), ttft_ns IS NOT NULL) AS ttft_sample,
        groupArraySampleIf({SAMPLE_CAP}, {SAMPLE_SEED})(assumeNotNull(tpot_ns), tpot_ns IS NOT NULL) AS tpot_sample,
        sumMap(s.score_keys, arrayMap(x -> toUInt64(1), s.score_values), s.score_values,
               arrayMap(x -> x * x, s.score_values)) AS score_stats{", groupUniqArrayArray(hm) AS gpu_codes" if hosts else ""}
        FROM ({_variant_traces(params["n_values"], hosts)}) AS vt
        LEFT JOIN ({_TRACE_SCORES}) AS s ON vt.trace_id = s.trace_id
        GROUP BY variant"""
    figures, scores = {}, []
    for r in get_store().query(sql, params, tag="analytics.variants.figures").dicts():
        figures[r["variant"]] = r
        keys, counts, totals, squares = r.pop("score_stats")
        scores += [{"variant": r["variant"], "name": name, "data_type": data_type, "label": label, "n": n,
                    "total": total, "total_sq": total_sq}
                   for (name, data_type, label), n, total, total_sq in zip(keys, counts, totals, squares)]
    return figures, sorted(scores, key=lambda x: (x["name"], x["variant"], x["label"]))


# The window's GPU samples (widened as the spans are), per host and minute.
_GPU_SAMPLES = """SELECT host, toStartOfMinute(time) AS minute, toNullable(toFloat64(gpu_utilization)) AS util,
                     if(ifNull(gpu_memory_total, 0) > 0, 100.0 * gpu_memory_used / gpu_memory_total, NULL) AS mem_pct
              FROM resource_samples WHERE project_id = {project_id:UInt64} AND gpu_index >= 0
                AND time >= fromUnixTimestamp64Milli({start_ms:Int64}) - toIntervalMinute(5)
                AND time < fromUnixTimestamp64Milli({end_ms:Int64}) + toIntervalHour(1)"""


def _gpu_hosts(params: dict) -> list[str]:
    """The hosts with GPU samples in the window (sorted; at most MAX_CODED_HOSTS): a first small read.
    An empty list: no GPU read at all (the assignment then carries no hosts)."""
    rows = get_store().query(f"SELECT groupUniqArray({MAX_CODED_HOSTS})(host) AS hosts FROM ({_GPU_SAMPLES}) WHERE host != ''",
                             params, tag="analytics.variants.gpu_hosts").dicts()
    return sorted(rows[0]["hosts"]) if rows else []


# The window's GPU samples as columns, each with its (host, minute) code (grouping.host_minute_code_sql).
_GPU_CODED = f"""SELECT groupArray({host_minute_code_sql(f"indexOf({host_list_sql('gpu_hosts')}, host)",
                                                       "intDiv(toUnixTimestamp(minute), 60)")}) AS codes,
                        groupArray(util) AS util, groupArray(mem_pct) AS mem
                 FROM ({_GPU_SAMPLES}) WHERE host IN {host_list_sql('gpu_hosts')}"""


def _gpu_samples(params: dict) -> dict:
    return get_store().query(_GPU_CODED, params, tag="analytics.variants.gpu").dicts()[0]


def _members(values: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in ``of``: a sorted lookup (np.isin sorts both: 3x slower here)."""
    if not len(of):
        return np.zeros(len(values), dtype=bool)
    of = np.sort(of)
    at = np.minimum(np.searchsorted(of, values), len(of) - 1)
    return of[at] == values


def _gpu_figures(samples: dict, figures: dict[str, dict], hosts: list[str]) -> dict[str, dict]:
    """Each variant's GPU figures: the samples of the minutes its requests first ran on each host
    (``gpu_codes`` of the figures read; a sample counts once for a variant however many of its
    requests ran in that minute), their mean and sample variance, and the hosts (at most 20)."""
    codes = np.asarray(samples["codes"], dtype=np.uint64)
    columns = {name: np.array(samples[name], dtype=float) for name in ("util", "mem")}  # None (no value): NaN
    out = {}
    for variant, row in figures.items():
        served = _members(codes, np.asarray(row.pop("gpu_codes", []), dtype=np.uint64))
        if not served.any():
            continue
        places = np.unique(codes[served] % HOST_CODES)
        g = {"hosts": [hosts[int(p) - 1] for p in places[:20]]}
        for name, column in columns.items():
            x = column[served]
            x = x[~np.isnan(x)]
            g[f"{name}_n"] = len(x)
            g[f"{name}_mean"] = float(x.mean()) if len(x) else None
            g[f"{name}_var"] = float(x.var(ddof=1)) if len(x) > 1 else None
        out[variant] = g
    return out


@dataclass(frozen=True)
class Figure:
    """One row of the table: each variant's value and its difference from the baseline."""

    group: str
    label: str
    unit: str
    lower_is_better: bool | None  # None: no better/worse (traffic)
    values: list[float | None]
    diffs: list[sig.Diff | None]  # [None (the baseline), variant 2 − baseline, …]
    digits: int = 1

    def cells(self) -> list[dict]:
        out = []
        for i, (v, d) in enumerate(zip(self.values, self.diffs)):
            tone = ""
            if d is not None and d.significant and self.lower_is_better is not None and d.estimate:
                tone = "better" if (d.estimate < 0) == self.lower_is_better else "worse"
            out.append({"value": v, "diff": d, "tone": tone, "baseline": i == 0})
        return out

    def as_dict(self) -> dict:
        return {"group": self.group, "metric": self.label, "unit": self.unit, "lower_is_better": self.lower_is_better,
                "values": self.values,
                "differences": [None if d is None else {**d.as_dict(), "tone": c["tone"]}
                                for d, c in zip(self.diffs, self.cells())]}


@dataclass
class VariantsResult:
    key: str
    values: list[str]
    seconds: float
    figures: list[Figure] = field(default_factory=list)
    scores: list[dict] = field(default_factory=list)  # per score name: figures + distributions
    hosts: dict[str, list[str]] = field(default_factory=dict)
    e2e_samples_ms: dict[str, list[float]] = field(default_factory=dict)  # for the distribution chart
    corrected: bool = False  # Holm over (variants − 1) comparisons per figure

    @property
    def empty(self) -> bool:
        return not self.values

    @property
    def any_significant(self) -> bool:
        return any(d is not None and d.significant for f in self.figures for d in f.diffs) or any(
            d is not None and d.significant for s in self.scores for f in s["figures"] for d in f.diffs)


def _family(diffs: list[sig.Diff]) -> list[sig.Diff | None]:
    return [None, *sig.holm(diffs)]


def _welch_from_sums(n, total, total_sq):
    if n < 1:
        return None, None
    mean = total / n
    var = (total_sq - total * total / n) / (n - 1) if n > 1 else 0.0
    return mean, max(var, 0.0)


def variants_compare(*, project_id: int, start: datetime, end: datetime, key: str, values: list[str],
                     service: str = "", model: str = "") -> VariantsResult:
    seconds = (end - start).total_seconds()
    result = VariantsResult(key=key, values=list(values), seconds=seconds, corrected=len(values) > 2)
    if not values:
        return result
    attribute_index.key_declare(project_id=project_id, key=key)
    params = _p(project_id, start, end, service, model, key, values)
    # The GPU figures: the window's hosts with GPU samples first (none: nothing more is read for
    # them), then the figures read collects each variant's (host, minute) codes beside its figures
    # (one assignment), while the samples are read beside it, and numpy matches the two.
    hosts = _gpu_hosts(params)
    if hosts:
        params["gpu_hosts"] = json.dumps(hosts)
        r = reads_concurrently(figures=lambda: _figures_read(params, hosts=True), gpu=lambda: _gpu_samples(params))
        (fig_rows, score_rows) = r["figures"]
        gpu_rows = _gpu_figures(r["gpu"], fig_rows, hosts)
        # The window has GPU samples: index the hosts too. The hosts come from the index only once
        # ``host.name`` is ready, so a project whose spans never name a host still needs it declared
        # (its backfill writes no row), or every such read would scan the spans for them.
        attribute_index.key_declare(project_id=project_id, key=HOST_KEY)
    else:
        (fig_rows, score_rows), gpu_rows = _figures_read(params), {}
    empty = {"requests": 0, "errors": 0, "output_total": 0, "cost_total": 0.0, "cost_var": 0.0, "e2e_q": [0, 0, 0],
             "ttft_n": 0, "ttft_p95": 0, "tpot_n": 0, "tpot_p95": 0, "e2e_sample": [], "ttft_sample": [], "tpot_sample": []}
    rows = [fig_rows.get(v, empty) for v in values]
    base = rows[0]
    ns_ms = 1e-6

    def ms(x, n):
        return round(float(x) * ns_ms, 3) if n else None

    samples = {name: [np.asarray(row[f"{name}_sample"], dtype=float) * ns_ms for row in rows]
               for name in ("e2e", "ttft", "tpot")}
    result.e2e_samples_ms = {v: [round(x, 3) for x in s.tolist()[:5000]] for v, s in zip(values, samples["e2e"])}
    # One bootstrap per comparison for E2E P50/P95/P99 together (the same resamples).
    e2e_boot = [sig.bootstrap_quantiles(samples["e2e"][0], s, (0.5, 0.95, 0.99)) for s in samples["e2e"][1:]]

    def add(group, label, unit, lower, vals, diffs, digits=1):
        result.figures.append(Figure(group, label, unit, lower, vals, _family(diffs), digits))

    add("Traffic", "Requests", "", None, [row["requests"] for row in rows],
        [sig.NONE for _ in rows[1:]], 0)
    for i, (q, name) in enumerate(((0.5, "P50"), (0.95, "P95"), (0.99, "P99"))):
        add("Latency", f"E2E {name}", "ms", True, [ms(row["e2e_q"][i], row["requests"]) for row in rows],
            [b[i] for b in e2e_boot])
    add("Latency", "TTFT P95", "ms", True, [ms(row["ttft_p95"], row["ttft_n"]) for row in rows],
        [sig.bootstrap_quantiles(samples["ttft"][0], s, (0.95,))[0] for s in samples["ttft"][1:]])
    add("Latency", "TPOT P95", "ms", True, [ms(row["tpot_p95"], row["tpot_n"]) for row in rows],
        [sig.bootstrap_quantiles(samples["tpot"][0], s, (0.95,))[0] for s in samples["tpot"][1:]], 2)
    add("Traffic", "Output tokens/s", "/s", False,
        [row["output_total"] / seconds if seconds else None for row in rows], [sig.NONE for _ in rows[1:]], 2)
    add("Quality", "Error rate", "%", True,
        [100.0 * row["errors"] / row["requests"] if row["requests"] else None for row in rows],
        [_scaled(sig.proportion_diff(base["errors"], base["requests"], row["errors"], row["requests"]), 100)
         for row in rows[1:]], 2)

    def cost_mean(row):
        return row["cost_total"] / row["requests"] if row["requests"] else None

    add("Cost", "Cost per request", "USD", True, [cost_mean(row) for row in rows],
        [sig.welch_diff(base["requests"], cost_mean(base), base["cost_var"], row["requests"], cost_mean(row),
                        row["cost_var"]) for row in rows[1:]], 6)
    gpus = [gpu_rows.get(v) or {"util_n": 0, "util_mean": None, "util_var": None, "mem_n": 0, "mem_mean": None,
                                "mem_var": None, "hosts": []} for v in values]
    result.hosts = {v: sorted(g["hosts"]) for v, g in zip(values, gpus)}
    # Less GPU memory is better (room for KV cache, a smaller card); utilisation has no direction.
    for prefix, label, lower in (("mem", "GPU memory", True), ("util", "GPU utilisation", None)):
        vals = [g[f"{prefix}_mean"] if g[f"{prefix}_n"] else None for g in gpus]
        g0 = gpus[0]
        add("GPU (hosts serving it)", label, "%", lower, vals,
            [sig.welch_diff(g0[f"{prefix}_n"], vals[0], g0[f"{prefix}_var"], g[f"{prefix}_n"], v, g[f"{prefix}_var"])
             for g, v in zip(gpus[1:], vals[1:])])
    result.scores = _score_figures(score_rows, values)
    return result


def _scaled(d: sig.Diff, k: float) -> sig.Diff:
    if d.estimate is None:
        return d
    return sig.Diff(d.estimate * k, d.low * k, d.high * k, d.p_value, d.method)


def _score_figures(rows: list[dict], values: list[str]) -> list[dict]:
    by_name: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for row in rows:
        by_name.setdefault((row["name"], row["data_type"]), {}).setdefault(row["variant"], []).append(row)
    out = []
    for (name, data_type), per_variant in sorted(by_name.items()):
        counts = [sum(x["n"] for x in per_variant.get(v, [])) for v in values]
        totals = [sum(x["total"] for x in per_variant.get(v, [])) for v in values]
        distributions = [{x["label"]: int(x["n"]) for x in per_variant.get(v, [])} for v in values]
        figures = []
        means: list[float | None] = [None] * len(values)
        half: list[float | None] = [None] * len(values)
        if data_type == "numeric":
            sq = [sum(x["total_sq"] for x in per_variant.get(v, [])) for v in values]
            stats = [_welch_from_sums(n, t, s) for n, t, s in zip(counts, totals, sq)]
            means = [m for m, _ in stats]
            half = [sig.Z95 * (var / n) ** 0.5 if n > 1 else None for n, (_, var) in zip(counts, stats)]
            figures.append(Figure("Scores", f"{name} mean", "", False, [m for m, _ in stats], _family(
                [sig.welch_diff(counts[0], stats[0][0], stats[0][1], n, m, var)
                 for n, (m, var) in zip(counts[1:], stats[1:])]), 3))
        elif data_type == "boolean":
            shares = [100.0 * t / n if n else None for t, n in zip(totals, counts)]
            means = shares
            half = [100 * sig.Z95 * ((t / n) * (1 - t / n) / n) ** 0.5 if n else None for t, n in zip(totals, counts)]
            figures.append(Figure("Scores", f"{name} share true", "%", False, shares, _family(
                [_scaled(sig.proportion_diff(int(totals[0]), counts[0], int(t), n), 100)
                 for t, n in zip(totals[1:], counts[1:])]), 1))
        else:
            categories = sorted({c for d in distributions for c in d})
            for c in categories[:20]:
                xs = [d.get(c, 0) for d in distributions]
                shares = [100.0 * x / n if n else None for x, n in zip(xs, counts)]
                figures.append(Figure("Scores", f"{name} = {c}", "%", None, shares, _family(
                    [_scaled(sig.proportion_diff(xs[0], counts[0], x, n), 100) for x, n in zip(xs[1:], counts[1:])]), 1))
        out.append({"name": name, "data_type": data_type, "counts": counts, "distributions": distributions,
                    "figures": figures, "means": means, "half_widths": half})
    return out
