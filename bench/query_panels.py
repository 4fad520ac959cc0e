"""Panel-query scenarios for bench/query.py: the reads behind the overview, costs and compare
pages, served from the rollups (``analytics.rollups``), and the accuracy of the percentiles they
show against exact ones over the raw spans.

Before the first scenario the rollups of the loaded data are built once (bench/load_spans.py
writes spans and summaries; this runs ``rollups_rebuild`` over their whole range, with progress),
unless they already cover it. The accuracy check prints, for the last 24 hours and the last 30
days, P95/P99 of end-to-end latency and TTFT computed exactly from the raw spans (deduplicated;
the E2E of a trace is its root span's duration, its TTFT that of its first model call with one;
nearest-rank: the ⌈q·n⌉-th smallest) beside the value the rollups show, with the error in %.
The target is 1 %.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from bench.query_traces import PROJECT_ID, Scenario

NS = 1_000_000_000
ACCURACY_TARGET = 0.01
_built: dict = {}


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS, tz=timezone.utc)


def _ensure_rollups(store) -> dict:
    """Build the rollups once if they do not cover the loaded summaries; returns the data's range."""
    if _built:
        return _built
    lo, hi, traces_version = store.query(
        "SELECT toUnixTimestamp64Nano(min(start_time)), toUnixTimestamp64Nano(max(start_time)), max(version)"
        " FROM traces WHERE project_id = {p:UInt64}", {"p": PROJECT_ID}, tag="bench.panels.range").rows[0]
    lo, hi = int(lo), int(hi)
    rollup_version = min(int(store.query(f"SELECT max(version) FROM {table} WHERE project_id = {{p:UInt64}}",
                                         {"p": PROJECT_ID}, tag="bench.panels.rollups").scalar() or 0)
                         for table in ("rollup_day", "rollup_day_all"))
    if rollup_version < int(traces_version):
        from analytics.rollup_services import rollups_rebuild

        started = time.monotonic()

        def progress(done: int, total: int) -> None:
            width = 30
            sys.stderr.write(f"\rbuilding rollups [{'#' * (width * done // total)}{'.' * (width - width * done // total)}]"
                             f" day {done}/{total}  {time.monotonic() - started:5.1f} s")
            sys.stderr.flush()

        minutes = rollups_rebuild(project_id=PROJECT_ID, from_ns=lo, to_ns=hi + 1, progress=progress)
        sys.stderr.write("\n")
        built = time.monotonic() - started
        # As bench/load_spans.py does for the summaries: parts merged, as background merges leave
        # them minutes after a bulk load, so FINAL reads merge nothing.
        for table in ("rollup_minute", "rollup_hour", "rollup_day", "rollup_hour_all", "rollup_day_all"):
            store.command(f"OPTIMIZE TABLE {table} FINAL", tag="bench.panels.optimize")
        print(f"rollups built: {minutes:,} minutes (and their hours and days) in {built:.1f} s;"
              f" merged in {time.monotonic() - started - built:.1f} s")
    _built.update(lo=lo, hi=hi + 1)
    return _built


def _window(store, hours: float) -> dict:
    data = _ensure_rollups(store)
    return {"end": data["hi"], "start": data["hi"] - int(hours * 3600 * NS)}


GPU_HOSTS = 4  # the generator's llm-proxy-0..3 (its host.name: ``<service>-<n>``)


def _keyed(hours: float, *, indexed: bool, gpu: bool = False):
    """The window, with the attribute keys read from the attribute index (``indexed``: each
    backfilled once, then marked ready) or by the span scan (marked not ready: what a key gets
    before its backfill, or beyond a project's MAX_KEYS). Each scenario pair runs the same reads
    both ways. ``gpu``: the window holds a GPU sample a minute for each model-serving host
    (``llm-proxy-0..3``), so the Variants view's GPU read runs (with ``host.name`` indexed or
    scanned as the variant key); without it, those samples are removed (the loaded data has none)."""

    def setup(store) -> dict:
        from analytics import attribute_index

        state = _window(store, hours)
        store.command("DELETE FROM resource_samples WHERE project_id = {p:UInt64} AND host LIKE 'llm-proxy-%'",
                      {"p": PROJECT_ID}, tag="bench.panels.gpu")
        if gpu:
            minutes = int(hours * 60) + 70  # the window, widened as the reads widen it
            store.command(
                "INSERT INTO resource_samples (project_id, time, host, gpu_index, gpu_utilization, gpu_memory_used,"
                " gpu_memory_total) SELECT {p:UInt64}, fromUnixTimestamp64Nano({t:Int64}) + toIntervalMinute(intDiv(number, {h:UInt32})),"
                " concat('llm-proxy-', toString(number % {h:UInt32})), 0, 40 + number % 50, 30 + number % 40, 80"
                " FROM numbers({n:UInt64})", {"p": PROJECT_ID, "t": state["start"] - 5 * 60 * NS, "h": GPU_HOSTS,
                                            "n": GPU_HOSTS * minutes}, tag="bench.panels.gpu")
        for key in ("user.tier", "host.name"):
            params = {"project_id": PROJECT_ID, "key": key}
            if indexed and not _built.get(("indexed", key)):
                store.command("DELETE FROM span_key_values WHERE project_id = {project_id:UInt64} AND key = {key:String}",
                              params, tag="bench.panels.index")
                started = time.monotonic()
                attribute_index._backfill(params)  # what index_backfill runs, without the declaration's wait
                store.command("OPTIMIZE TABLE span_key_values FINAL", tag="bench.panels.index")
                rows = attribute_index._rows(params)
                _built[("indexed", key)] = True
                print(f"attribute index: {key} backfilled, {rows:,} rows in {time.monotonic() - started:.1f} s")
            stamp = time.time_ns()
            store.insert("dim_keys", [{**params, "declared_at": stamp, "ready": int(indexed), "removed": 0,
                                       "version": stamp}], tag="bench.panels.index")
        attribute_index.forget_known()
        return state

    return setup


def _shift(state: dict, i: int) -> tuple[datetime, datetime]:
    """The window moved back by i minutes, so runs do not repeat one query exactly."""
    delta = i * 60 * NS
    return _utc(state["start"] - delta), _utc(state["end"] - delta)


def _overview(state: dict, i: int) -> int:
    """What the overview page reads: KPIs of the window and the previous one, series, heatmap."""
    from analytics import rollups

    start, end = _shift(state, i)
    args = {"project_id": PROJECT_ID, "start": start, "end": end}
    now = rollups.window_stats(**args)
    rollups.window_stats(project_id=PROJECT_ID, start=start - (end - start), end=start)
    series = rollups.window_series(**args)
    rollups.latency_heatmap(**args)
    return now.requests + len(series.times)


def _page(name: str):
    """The page's own reads as its view makes them (concurrently, with its figures): server time."""
    def call(state: dict, i: int) -> int:
        from dashboard import views
        from dashboard.timewindow import TimeWindow

        start, end = _shift(state, i)
        data = getattr(views, name)(PROJECT_ID, TimeWindow(start=start, end=end, preset=""), {"service": "", "model": ""})
        return data["stats"].requests
    return call


def _compare_windows(state: dict, i: int) -> int:
    """This 7 days against the 7 before (before/after an optimisation)."""
    from analytics import rollups

    start, end = _shift(state, i)
    week = end - start
    result = rollups.compare_windows(project_id=PROJECT_ID, a=(start - week, start), b=(start, end))
    return result.a.requests + result.b.requests


def _compare_models(state: dict, i: int) -> int:
    from analytics import rollups

    start, end = _shift(state, i)
    result = rollups.compare_models(project_id=PROJECT_ID, start=start, end=end, model_a="gpt-4o-mini", model_b="gpt-4o")
    return result.a.requests + result.b.requests


def _compare_attribute(state: dict, i: int) -> int:
    """Two values of a root attribute (user.tier free vs pro): traces joined with their spans."""
    from analytics import rollups

    start, end = _shift(state, i)
    result = rollups.compare_attribute(project_id=PROJECT_ID, start=start, end=end, key="user.tier",
                                       value_a="free", value_b="pro")
    return result.a.requests + result.b.requests


def _variants(state: dict, i: int) -> int:
    """The Variants view's figures of two values (user.tier free vs pro, the bench's variant-like
    attribute): request figures with their bootstrap samples, scores and hosts' GPU, side by side,
    then the statistics (analytics.variants.variants_compare: the page's whole read)."""
    from analytics import variants

    start, end = _shift(state, i)
    result = variants.variants_compare(project_id=PROJECT_ID, start=start, end=end, key="user.tier",
                                       values=["free", "pro"])
    return sum(result.figures[0].values)


def _grouped(state: dict, i: int) -> int:
    """The grouped latency series (``group_by=user.tier``, top 5 + other + (none), 120 points):
    traces of the window joined to the value on their earliest span that carries the key."""
    from analytics import grouping

    start, end = _shift(state, i)
    series = grouping.grouped_series(project_id=PROJECT_ID, start=start, end=end, key="user.tier", top=5)
    return sum(g.requests for g in series.groups)


# --- accuracy: exact over raw spans vs shown ---------------------------------------------------
_EXACT_SQL = """
SELECT
    arraySort(groupArray(e2e)) AS e2e_sorted,
    arraySort(groupArrayIf(assumeNotNull(ttft), ttft IS NOT NULL)) AS ttft_sorted
FROM (
    SELECT trace_id,
        countIf(parent_span_id = '') > 0 AS has_root,
        argMaxIf(toUnixTimestamp64Nano(start_time), duration_ns, parent_span_id = '') AS root_start,
        maxIf(duration_ns, parent_span_id = '') AS e2e,
        argMinIf(ttft_ns, (start_time, span_id), phase = 'inference' AND ttft_ns IS NOT NULL) AS ttft
    FROM (SELECT trace_id, span_id, parent_span_id, phase, start_time, duration_ns, ttft_ns FROM spans WHERE project_id = {p:UInt64}
            AND start_time >= fromUnixTimestamp64Nano({lo:Int64}) - toIntervalHour(1)
            AND start_time < fromUnixTimestamp64Nano({hi:Int64}) + toIntervalHour(1)
          ORDER BY ingested_at DESC LIMIT 1 BY trace_id, span_id)
    GROUP BY trace_id
    HAVING has_root AND root_start >= {lo:Int64} AND root_start < {hi:Int64}
)
"""


def _nearest_rank(ordered: list, q: float) -> float | None:
    if not ordered:
        return None
    import math

    return float(ordered[max(1, math.ceil(q * len(ordered) - 1e-9)) - 1]) / 1e6


def accuracy(store, *, hours: float) -> list[dict]:
    """Exact P95/P99 of E2E and TTFT over the raw spans of the last ``hours`` against the
    rollups' values; one row per figure with the error in %."""
    from analytics import rollups

    state = _window(store, hours)
    started = time.perf_counter()
    row = store.query(_EXACT_SQL, {"p": PROJECT_ID, "lo": state["start"], "hi": state["end"]},
                      tag="bench.panels.exact").dicts()[0]
    exact_seconds = time.perf_counter() - started
    shown = rollups.window_stats(project_id=PROJECT_ID, start=_utc(state["start"]), end=_utc(state["end"]))
    out = []
    for name, ordered, values in (("E2E", row["e2e_sorted"], shown.e2e_ms), ("TTFT", row["ttft_sorted"], shown.ttft_ms)):
        for q in (0.95, 0.99):
            exact = _nearest_rank(ordered, q)
            error = None if not exact or values[q] is None else abs(values[q] - exact) / exact
            out.append({"window": f"{hours:g} h" if hours < 48 else f"{hours / 24:g} d", "figure": f"{name} P{int(q * 100)}",
                        "requests": len(row["e2e_sorted"]), "exact_ms": exact, "shown_ms": values[q],
                        "error": error, "pass": error is not None and error <= ACCURACY_TARGET,
                        "exact_query_s": exact_seconds})
    return out


def _accuracy_setup(store) -> dict:
    rows = accuracy(store, hours=24) + accuracy(store, hours=24 * 30)
    print("exact (raw spans) vs shown (rollups), target error ≤ 1 %:")
    print(f"  {'window':<7} {'figure':<9} {'requests':>9} {'exact ms':>10} {'shown ms':>10} {'error':>8}  ")
    for r in rows:
        print(f"  {r['window']:<7} {r['figure']:<9} {r['requests']:>9,} {r['exact_ms']:>10.2f} {r['shown_ms']:>10.2f}"
              f" {r['error']:>8.3%}  {'pass' if r['pass'] else 'FAIL'}")
    print(f"  (the exact figures took {rows[0]['exact_query_s']:.2f} s and {rows[-1]['exact_query_s']:.2f} s to compute from raw spans)")
    ACCURACY.extend(rows)
    return _window(store, 24)


ACCURACY: list[dict] = []


def _shown_24h(state: dict, i: int) -> int:
    from analytics import rollups

    start, end = _shift(state, i)
    return rollups.window_stats(project_id=PROJECT_ID, start=start, end=end).requests


SCENARIOS = [
    Scenario("panels: KPIs 24 h (exact vs shown printed above)", None, None, _accuracy_setup, _shown_24h),
    Scenario("panels: overview page 24 h", 150, None, lambda s: _window(s, 24), _page("_overview"),
             note="dashboard.views._overview: KPIs ×2, series, heatmap, facets (concurrent) and its figures"),
    Scenario("panels: overview page 30 d", 150, None, lambda s: _window(s, 24 * 30), _page("_overview")),
    Scenario("panels: overview reads 30 d, one after another", None, None, lambda s: _window(s, 24 * 30), _overview,
             note="rollups: KPIs of the window and the previous one, series, heatmap; sequential"),
    Scenario("panels: costs page 30 d", 150, None, lambda s: _window(s, 24 * 30), _page("_costs")),
    Scenario("panels: compare 7 d vs 7 d before", 300, None, lambda s: _window(s, 24 * 7), _compare_windows),
    Scenario("panels: compare 2 models, 7 d", 300, None, lambda s: _window(s, 24 * 7), _compare_models),
    Scenario("panels: compare user.tier free/pro, 7 d", 300, None, lambda s: _window(s, 24 * 7), _compare_attribute,
             note="traces joined with the spans that carry the attribute (rollups keep no attributes)"),
    Scenario("panels: variants user.tier free/pro, 24 h", 300, None, _keyed(24, indexed=True), _variants,
             note="analytics.variants.variants_compare: 3 reads side by side + bootstrap of ≤ 20k per variant; "
                  "user.tier from the attribute index"),
    Scenario("panels: variants user.tier free/pro, 7 d", 300, None, _keyed(24 * 7, indexed=True), _variants),
    Scenario("panels: variants user.tier free/pro, 7 d, span scan", None, None, _keyed(24 * 7, indexed=False), _variants,
             note="the same, the key not indexed (before its backfill)"),
    Scenario("panels: variants user.tier free/pro, 7 d, GPU samples", 300, None, _keyed(24 * 7, indexed=True, gpu=True),
             _variants, note="the same, with a GPU sample a minute of each of 4 serving hosts: the GPU read runs"),
    Scenario("panels: variants user.tier free/pro, 7 d, GPU samples, span scan", None, None,
             _keyed(24 * 7, indexed=False, gpu=True), _variants),
    Scenario("grouping: latency series by user.tier, 24 h", 300, None, _keyed(24, indexed=True), _grouped,
             note="analytics.grouping.grouped_series: requests, errors, P95, cost per bucket per value, one query"),
    Scenario("grouping: latency series by user.tier, 7 d", 300, None, _keyed(24 * 7, indexed=True), _grouped),
    Scenario("grouping: latency series by user.tier, 7 d, span scan", None, None, _keyed(24 * 7, indexed=False), _grouped),
]
