"""Reads of inference engines' metrics (``engine_samples``: vLLM, TGI, SGLang, TensorRT-LLM, scraped by the
agent or sent over OTLP) — the figures the Engines page draws and the engine alert rules compare.

One engine instance is one (engine, target, model): a vLLM server serving one model at one URL.

- Gauges (running / waiting requests, KV-cache usage %) over a window or a chart bucket: the
  latest, average, highest and lowest sample.
- Counters (preemptions, tokens, requests): the **increase** over the window or bucket — the sum
  of the differences between consecutive samples, a drop (the engine restarted, its counter began
  again at 0) counting the new value, as Prometheus' ``increase`` does without extrapolation.
  The difference between two samples is counted in the bucket of the later one.
- Histograms (engine-side TTFT, end-to-end, queue time, inter-token latency): the increase of each
  cumulative bucket over the window, then ``histogram_quantile``: the quantile's rank found in the
  buckets and interpolated linearly inside its bucket (Prometheus' method); a quantile landing in the
  ``+Inf`` bucket is the highest finite bound. No request finished in the window: no percentile (None).

The first sample of a series in a window has no predecessor there, so the read looks back
``LOOKBACK_SECONDS`` before the window for it: a window shorter than one scrape interval still
measures the increase across it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from agent.engines import COUNTER, GAUGE, HISTOGRAM, METRICS, SUM_SUFFIX
from store import get_store

from . import rollups
from .panel_selectors import reads_concurrently
from .selectors import bucket_seconds, bucket_times

LOOKBACK_SECONDS = 300  # the agent scrapes every 5 s by default: a window's first increase needs one sample before it
QUANTILES = (0.5, 0.95, 0.99)
GAUGES = tuple(m for m, (kind, _) in METRICS.items() if kind == GAUGE)
COUNTERS = tuple(m for m, (kind, _) in METRICS.items() if kind == COUNTER)
HISTOGRAMS = tuple(m for m, (kind, _) in METRICS.items() if kind == HISTOGRAM)

# Per series (engine instance, metric, bucket bound) and bucket: the sum of the increases between
# consecutive samples, each counted in the bucket of the later sample — added up in ClickHouse, so a
# day of 5-second scrapes returns one row per series and chart bucket, not one per scrape. Gauges
# are read apart (their values, not differences).
_INCREASES_SQL = """
SELECT engine, target, model, metric, le, le_inf, bucket_ms, sum(increase) AS increase
FROM (
    SELECT engine, target, model, metric, le, isInfinite(le) AS le_inf,
           arrayJoin(arrayMap((cur, prev) -> (cur.1, if(cur.2 >= prev.2, cur.2 - prev.2, cur.2)),
                              arrayPopFront(points), arrayPopBack(points))) AS step,
           intDiv(step.1, greatest({step_ms:Int64}, 1)) * {step_ms:Int64} AS bucket_ms,
           step.2 AS increase
    FROM (
        SELECT engine, target, model, metric, le,
               arraySort(x -> x.1, groupArray((toUnixTimestamp64Milli(time), value))) AS points
        FROM engine_samples
        WHERE project_id = {project_id:UInt64}
          AND has(splitByChar(',', {metrics:String}), metric)
          AND time > fromUnixTimestamp64Milli({lookback_ms:Int64})
          AND time <= fromUnixTimestamp64Milli({end_ms:Int64})
          AND ({engine:String} = '' OR engine = {engine:String})
        GROUP BY engine, target, model, metric, le
    )
    WHERE step.1 > {start_ms:Int64}
)
GROUP BY engine, target, model, metric, le, le_inf, bucket_ms
"""

_GAUGES_SQL = """
SELECT engine, target, model, metric,
       intDiv(toUnixTimestamp64Milli(time), greatest({step_ms:Int64}, 1)) * {step_ms:Int64} AS bucket_ms,
       argMax(value, time) AS last, avg(value) AS mean, max(value) AS high, min(value) AS low,
       max(toUnixTimestamp64Milli(time)) AS last_ms, any(host) AS host
FROM engine_samples
WHERE project_id = {project_id:UInt64}
  AND has(splitByChar(',', {metrics:String}), metric)
  AND time > fromUnixTimestamp64Milli({start_ms:Int64})
  AND time <= fromUnixTimestamp64Milli({end_ms:Int64})
  AND ({engine:String} = '' OR engine = {engine:String})
GROUP BY engine, target, model, metric, bucket_ms
"""


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: ``buckets`` as (upper bound, cumulative count) with the
    ``+Inf`` one; None when nothing was observed. Counts that fall with a rising bound (increases of
    buckets scraped at slightly different moments) are evened out first."""
    if not buckets:
        return None
    buckets = sorted(buckets)
    counts, high = [], 0.0
    for _, count in buckets:
        high = max(high, count)
        counts.append(high)
    total = counts[-1]
    if total <= 0 or not math.isinf(buckets[-1][0]):
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for (bound, _), count in zip(buckets, counts):
        if count >= rank:
            if math.isinf(bound):
                finite = [b for b, _ in buckets if not math.isinf(b)]
                return finite[-1] if finite else None
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return None


@dataclass(frozen=True)
class Instance:
    engine: str
    target: str
    model: str

    @property
    def key(self) -> str:
        return f"engine={self.engine},target={self.target}" + (f",model={self.model}" if self.model else "")

    @property
    def label(self) -> str:
        return " · ".join(part for part in (self.engine, self.target, self.model) if part)


@dataclass
class InstanceFigures:
    """One engine instance over one window (or one chart bucket)."""

    instance: Instance
    host: str = ""
    last_ms: int | None = None  # the newest gauge sample
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)  # metric -> last/mean/high/low
    increases: dict[str, float] = field(default_factory=dict)  # counter -> increase
    percentiles_ms: dict[str, dict[float, float | None]] = field(default_factory=dict)  # histogram -> q -> ms
    observed: dict[str, float] = field(default_factory=dict)  # histogram -> requests observed (the +Inf increase)
    mean_ms: dict[str, float | None] = field(default_factory=dict)  # histogram -> mean (sum / count)


def _params(project_id: int, start_ms: int, end_ms: int, step_ms: int, metrics, engine: str) -> dict:
    return {"project_id": project_id, "start_ms": start_ms, "end_ms": end_ms, "step_ms": step_ms,
            "lookback_ms": start_ms - LOOKBACK_SECONDS * 1000, "metrics": ",".join(metrics), "engine": engine}


def _read(project_id: int, start_ms: int, end_ms: int, step_ms: int, engine: str = "") -> dict[tuple, InstanceFigures]:
    """(instance, bucket_ms) -> figures; one query for gauges, one for counters and histograms."""
    store = get_store()
    out: dict[tuple, InstanceFigures] = {}

    def figures(row) -> InstanceFigures:
        instance = Instance(row["engine"], row["target"], row["model"])
        key = (instance, int(row["bucket_ms"]))
        if key not in out:
            out[key] = InstanceFigures(instance)
        return out[key]

    for row in store.query(_GAUGES_SQL, _params(project_id, start_ms, end_ms, step_ms, GAUGES, engine),
                           tag="analytics.engines.gauges").dicts():
        f = figures(row)
        f.gauges[row["metric"]] = {"last": float(row["last"]), "mean": float(row["mean"]),
                                   "high": float(row["high"]), "low": float(row["low"])}
        f.host = f.host or row["host"]
        f.last_ms = max(f.last_ms or 0, int(row["last_ms"]))
    metrics = COUNTERS + HISTOGRAMS + tuple(h + SUM_SUFFIX for h in HISTOGRAMS)
    buckets: dict[tuple, dict[str, dict[float, float]]] = {}
    sums: dict[tuple, dict[str, float]] = {}
    for row in store.query(_INCREASES_SQL, _params(project_id, start_ms, end_ms, step_ms, metrics, engine),
                           tag="analytics.engines.increases").dicts():
        f = figures(row)
        key = (f.instance, int(row["bucket_ms"]))
        metric, increase = row["metric"], float(row["increase"])
        if metric in COUNTERS:
            f.increases[metric] = f.increases.get(metric, 0.0) + increase
        elif metric.endswith(SUM_SUFFIX):
            per = sums.setdefault(key, {})
            per[metric[: -len(SUM_SUFFIX)]] = per.get(metric[: -len(SUM_SUFFIX)], 0.0) + increase
        else:
            le = math.inf if row["le_inf"] else float(row["le"])
            per_le = buckets.setdefault(key, {}).setdefault(metric, {})
            per_le[le] = per_le.get(le, 0.0) + increase
    for key, per_metric in buckets.items():
        f = out[key]
        for metric, per_le in per_metric.items():
            observed = per_le.get(math.inf, 0.0)
            f.observed[metric] = observed
            points = sorted(per_le.items())
            f.percentiles_ms[metric] = {q: _ms(histogram_quantile(q, points)) for q in QUANTILES}
            total = sums.get(key, {}).get(metric)
            f.mean_ms[metric] = _ms(total / observed) if observed and total is not None else None
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _ms_of(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def window_figures(*, project_id: int, start: datetime, end: datetime, engine: str = "") -> list[InstanceFigures]:
    """Each engine instance's figures over (start, end] — what an alert rule compares (step 0:
    the whole window is one bucket)."""
    figures = _read(project_id, _ms_of(start), _ms_of(end), 0, engine)
    return sorted(figures.values(), key=lambda f: f.instance.label)


@dataclass(frozen=True)
class InstanceSeries:
    instance: Instance
    host: str
    buckets: list[InstanceFigures | None]  # one per time of EngineSeries.times; None: no sample


@dataclass(frozen=True)
class EngineSeries:
    start: datetime
    end: datetime
    step_seconds: int
    times: list[datetime]
    instances: list[InstanceSeries]

    def values(self, instance: InstanceSeries, pick) -> list[float | None]:
        """``pick(figures)`` per bucket (None where the bucket has no sample or the figure is absent)."""
        return [None if f is None else pick(f) for f in instance.buckets]

    def rate(self, instance: InstanceSeries, counter: str, *, per_seconds: float = 1.0) -> list[float | None]:
        """A counter's increase per bucket as a rate per ``per_seconds`` (1: per second, 60: per
        minute) over the bucket's width; None where the bucket has no sample of that counter. The
        last bucket of a window ending now is still filling: it reads low until it is complete."""
        return self.values(instance, lambda f: None if counter not in f.increases
                           else round(f.increases[counter] * per_seconds / self.step_seconds, 6))

    def gauge(self, instance: InstanceSeries, metric: str, stat: str = "high") -> list[float | None]:
        """A gauge per bucket: its ``last``, ``mean``, ``high`` or ``low`` sample (None: no sample)."""
        return self.values(instance, lambda f: f.gauges.get(metric, {}).get(stat))

    def percentile_ms(self, instance: InstanceSeries, histogram: str, q: float = 0.95) -> list[float | None]:
        """A histogram's percentile per bucket, in ms (None: no request observed in the bucket)."""
        return self.values(instance, lambda f: f.percentiles_ms.get(histogram, {}).get(q))


def engine_series(*, project_id: int, start: datetime, end: datetime, engine: str = "",
                  step_seconds: int | None = None) -> EngineSeries:
    """Per engine instance and chart bucket, over [start, end]: gauges, counter increases and
    histogram percentiles — the Engines page's charts."""
    step = step_seconds or bucket_seconds(start=start, end=end)
    times = bucket_times(start=start, end=end, step=step)
    figures = _read(project_id, _ms_of(times[0]) - 1, _ms_of(end), step * 1000, engine)
    by_instance: dict[Instance, dict[int, InstanceFigures]] = {}
    for (instance, bucket_ms), f in figures.items():
        by_instance.setdefault(instance, {})[bucket_ms] = f
    instances = []
    for instance in sorted(by_instance, key=lambda i: i.label):
        per_bucket = by_instance[instance]
        host = next((f.host for f in per_bucket.values() if f.host), "")
        instances.append(InstanceSeries(instance, host, [per_bucket.get(_ms_of(t)) for t in times]))
    return EngineSeries(start=start, end=end, step_seconds=step, times=times, instances=instances)


MAX_MODEL_SERIES = 8  # app-side series read per served model at most (the rest compare with all traces)


def app_side_series(*, project_id: int, start: datetime, end: datetime, models, points: int) -> dict:
    """The app-side latency of each served model whose name the traces use: ``rollups.window_series``
    (the overview's read, same buckets for the same ``points``) filtered to that model, for the models
    with requests in the window only: a model the traces call otherwise has no entry (its engine is
    compared with every trace). ``{model: WindowSeries}``."""
    models = sorted({m for m in models if m})[:MAX_MODEL_SERIES]
    if not models:
        return {}
    reads = reads_concurrently(**{f"m{i}": (lambda m=m: rollups.window_series(
        project_id=project_id, start=start, end=end, model=m, points=points)) for i, m in enumerate(models)})
    out = {}
    for i, model in enumerate(models):
        series = reads[f"m{i}"]
        if any(b is not None and b.requests for b in series.buckets):
            out[model] = series
    return out


@dataclass(frozen=True)
class InstanceLatest:
    """An engine instance's newest gauges (the Engines page's table)."""

    instance: Instance
    host: str
    last_seen: datetime | None
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None


def instances_latest(*, project_id: int, end: datetime, seconds: int = 3600, engine: str = "") -> list[InstanceLatest]:
    """Each instance that sent a gauge in the ``seconds`` before ``end``: its last running, waiting
    and KV-cache figures, when and from which host."""
    start = end - timedelta(seconds=seconds)
    rows = []
    for f in window_figures(project_id=project_id, start=start, end=end, engine=engine):
        if f.last_ms is None:
            continue
        last = {m: f.gauges.get(m, {}).get("last") for m in ("requests_running", "requests_waiting", "kv_cache_usage")}
        rows.append(InstanceLatest(f.instance, f.host, datetime.fromtimestamp(f.last_ms / 1000, tz=timezone.utc),
                                   last["requests_running"], last["requests_waiting"], last["kv_cache_usage"]))
    return rows


def engine_names(*, project_id: int, start: datetime, end: datetime, limit: int = 50) -> list[str]:
    """The engines (vllm, tgi, sglang, a ``--scrape`` label) that sent samples in (start, end]:
    the Engines page's engine choices."""
    rows = get_store().query(
        "SELECT DISTINCT engine FROM engine_samples WHERE project_id = {project_id:UInt64}"
        " AND time > fromUnixTimestamp64Milli({start_ms:Int64}) AND time <= fromUnixTimestamp64Milli({end_ms:Int64})"
        " ORDER BY engine LIMIT {limit:UInt32}",
        {"project_id": project_id, "start_ms": _ms_of(start), "end_ms": _ms_of(end), "limit": limit},
        tag="analytics.engines.names").rows
    return [r[0] for r in rows]


def first_sample_since(*, project_id: int, since: datetime) -> datetime | None:
    """When the project's first engine sample at or after ``since`` was taken, or None: what the
    Engines page's default range is fitted to (``dashboard.timewindow.fit_preset``)."""
    row = get_store().query(
        "SELECT min(time) AS first, count() AS n FROM engine_samples WHERE project_id = {project_id:UInt64}"
        " AND time >= fromUnixTimestamp64Milli({since_ms:Int64})",
        {"project_id": project_id, "since_ms": _ms_of(since)}, tag="analytics.engines.first_sample_since").dicts()[0]
    if not row["n"]:
        return None
    return _utc(row["first"])


def _utc(value) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(str(value)).replace(tzinfo=timezone.utc)


def latest_sample_time(*, project_id: int) -> datetime | None:
    """When the newest engine sample of the project was taken (None: never) — the page's empty state."""
    rows = get_store().query(
        "SELECT max(time) AS newest, count() AS n FROM engine_samples WHERE project_id = {project_id:UInt64}",
        {"project_id": project_id}, tag="analytics.engines.latest").dicts()
    if not rows or not rows[0]["n"]:
        return None
    return _utc(rows[0]["newest"])
