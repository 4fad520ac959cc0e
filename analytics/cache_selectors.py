"""What a cache in front of the model saved (DOMAIN.md "Cache"), over a window and per endpoint.

Read from the per-trace summaries: ``traces.cache`` is each request's outcome (2 a cache answered
one of its spans, 1 it consulted a cache and none hit, 0 none consulted), computed by the summary
SQL from ``spans.cache``, so nothing here reads span attributes. Each request's latest summary is
read by start (``traces_by_start FINAL``: only the window's granules; panel_selectors.latest_summaries_sql),
and a request counts in the window its root starts in.

An **endpoint** is the request's root span name within its service (the trace page's "same
service and root span name"). Per endpoint: the hit rate, the latency a hit saved (P50 E2E of its
misses − P50 E2E of its hits, nearest rank, only where both exist), and the mean cost and mean
input + output tokens of a miss, which price its hits (cost saved = hits × mean miss cost; tokens
likewise). The window's latency saved is the hit-weighted mean over endpoints that have both.
Series buckets price their hits with the window's per-endpoint means (so the buckets add up to the
window's cost and tokens saved) and take their latency from their own P50s.

The page's ``model`` filter is not applied: a request's model is its first model call's, and a hit
calls none, so filtering by model would drop every hit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from store import get_store

from .panel_selectors import latest_summaries_sql
from .selectors import bucket_seconds, bucket_times

CACHE_MISS, CACHE_HIT = 1, 2

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# The latest summary of each request of the window that consulted a cache, read by start.
_REQUESTS = latest_summaries_sql("start_time, has_root, service, root_name, cache, e2e_ns, cost_usd, input_tokens, "
                                 "output_tokens", [("start_ns", "end_ns")], unit="Nano", where="cache > 0")

_AGGREGATES = """count() AS consulted,
    countIf(cache = 2) AS hits,
    countIf(cache = 1) AS misses,
    quantileExactLowIf(0.5)(e2e_ns, cache = 2) AS hit_p50_ns,
    quantileExactLowIf(0.5)(e2e_ns, cache = 1) AS miss_p50_ns,
    sumIf(assumeNotNull(cost_usd), cache = 1 AND cost_usd IS NOT NULL) AS miss_cost_sum,
    countIf(cache = 1 AND cost_usd IS NOT NULL) AS miss_costed,
    sumIf(input_tokens + output_tokens, cache = 1 AND input_tokens + output_tokens > 0) AS miss_tokens_sum,
    countIf(cache = 1 AND input_tokens + output_tokens > 0) AS miss_tokened"""

_WHERE = """has_root = 1 AND cache > 0
  AND start_time >= fromUnixTimestamp64Nano({start_ns:Int64}) AND start_time < fromUnixTimestamp64Nano({end_ns:Int64})
  AND ({service:String} = '' OR service = {service:String})"""

_BY_ENDPOINT_SQL = (f"SELECT service, root_name, {_AGGREGATES} FROM ({_REQUESTS}) WHERE {_WHERE}"
                    " GROUP BY service, root_name ORDER BY service, root_name")
_BY_BUCKET_SQL = ("SELECT intDiv(toUnixTimestamp64Milli(start_time), {step_ms:UInt64}) * {step_ms:UInt64} AS bucket_ms,"
                  f" service, root_name, {_AGGREGATES} FROM ({_REQUESTS}) WHERE {_WHERE}"
                  " GROUP BY bucket_ms, service, root_name ORDER BY bucket_ms, service, root_name")
# Whether any span of the project (within its retention) ever consulted a cache: the pages say so
# in one line instead of drawing empty charts.
_EVER_SQL = ("SELECT count() FROM (SELECT 1 FROM traces_by_start WHERE project_id = {project_id:UInt64} AND cache > 0"
             " LIMIT 1)")


@dataclass(frozen=True)
class _Group:
    """The aggregates of one endpoint's requests that consulted a cache (in the window or a bucket)."""

    service: str
    root_name: str
    consulted: int
    hits: int
    misses: int
    hit_p50_ns: int | None
    miss_p50_ns: int | None
    miss_cost_mean: float | None  # over the misses that have a cost
    miss_tokens_mean: float | None  # over the misses that reported tokens

    @property
    def key(self) -> tuple[str, str]:
        return self.service, self.root_name

    @property
    def saved_ns(self) -> int | None:
        if self.hit_p50_ns is None or self.miss_p50_ns is None:
            return None
        return self.miss_p50_ns - self.hit_p50_ns


def _group(r: dict) -> _Group:
    hits, misses = int(r["hits"]), int(r["misses"])
    return _Group(
        service=r["service"], root_name=r["root_name"], consulted=int(r["consulted"]), hits=hits, misses=misses,
        hit_p50_ns=int(r["hit_p50_ns"]) if hits else None, miss_p50_ns=int(r["miss_p50_ns"]) if misses else None,
        miss_cost_mean=float(r["miss_cost_sum"]) / int(r["miss_costed"]) if int(r["miss_costed"]) else None,
        miss_tokens_mean=int(r["miss_tokens_sum"]) / int(r["miss_tokened"]) if int(r["miss_tokened"]) else None,
    )


@dataclass(frozen=True)
class CacheFigures:
    """The cache figures of a window or of one series bucket (DOMAIN.md "Cache")."""

    consulted: int  # requests that consulted a cache
    hits: int
    misses: int
    latency_saved_ms: float | None  # hit-weighted mean of (miss P50 − hit P50) over endpoints with both
    cost_saved_usd: float | None  # Σ hits × mean cost of a miss of the same endpoint (None: no miss priced any hit)
    tokens_saved: float | None  # Σ hits × mean input + output tokens of a miss of the same endpoint
    hits_unpriced: int = 0  # hits of endpoints without a miss that has a cost (not in cost_saved_usd)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.consulted if self.consulted else None


@dataclass(frozen=True)
class EndpointSavings:
    """One endpoint (service and root span name) over the window."""

    service: str
    root_name: str
    consulted: int
    hits: int
    misses: int
    hit_p50_ms: float | None
    miss_p50_ms: float | None
    latency_saved_ms: float | None
    miss_cost_mean_usd: float | None
    cost_saved_usd: float | None
    miss_tokens_mean: float | None
    tokens_saved: float | None

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.consulted if self.consulted else None

    @property
    def label(self) -> str:
        return f"{self.service} · {self.root_name}"


@dataclass(frozen=True)
class CacheSavings:
    start: datetime
    end: datetime
    ever: bool  # a span of the project ever consulted a cache (False: the pages show one line)
    totals: CacheFigures
    endpoints: list[EndpointSavings]  # most cost saved first, then most hits
    step_seconds: int = 0
    times: list[datetime] = field(default_factory=list)
    buckets: list[CacheFigures | None] = field(default_factory=list)  # None: no request consulted a cache

    def values(self, getter) -> list:
        return [None if b is None else getter(b) for b in self.buckets]


def _ms(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e6


def _figures(groups: list[_Group], means: dict[tuple[str, str], _Group]) -> CacheFigures:
    """Totals of ``groups``, their hits priced by the window's per-endpoint means (``means``)."""
    hits = sum(g.hits for g in groups)
    weighted = [(g.hits, g.saved_ns) for g in groups if g.hits and g.saved_ns is not None]
    cost = [(g.hits, means[g.key].miss_cost_mean) for g in groups if g.hits and means[g.key].miss_cost_mean is not None]
    tokens = [(g.hits, means[g.key].miss_tokens_mean) for g in groups
              if g.hits and means[g.key].miss_tokens_mean is not None]
    return CacheFigures(
        consulted=sum(g.consulted for g in groups), hits=hits, misses=sum(g.misses for g in groups),
        latency_saved_ms=(_ms(sum(h * d for h, d in weighted) / sum(h for h, _ in weighted)) if weighted else None),
        cost_saved_usd=sum(h * c for h, c in cost) if cost else (0.0 if not hits else None),
        tokens_saved=sum(h * t for h, t in tokens) if tokens else (0.0 if not hits else None),
        hits_unpriced=hits - sum(h for h, _ in cost),
    )


def _endpoint(g: _Group) -> EndpointSavings:
    return EndpointSavings(
        service=g.service, root_name=g.root_name, consulted=g.consulted, hits=g.hits, misses=g.misses,
        hit_p50_ms=_ms(g.hit_p50_ns), miss_p50_ms=_ms(g.miss_p50_ns), latency_saved_ms=_ms(g.saved_ns),
        miss_cost_mean_usd=g.miss_cost_mean,
        cost_saved_usd=g.hits * g.miss_cost_mean if g.miss_cost_mean is not None else (0.0 if not g.hits else None),
        miss_tokens_mean=g.miss_tokens_mean,
        tokens_saved=g.hits * g.miss_tokens_mean if g.miss_tokens_mean is not None else (0.0 if not g.hits else None),
    )


def _ns(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1) * 1000


def cache_ever_consulted(*, project_id: int) -> bool:
    """Whether any request of the project (within its retention) consulted a cache."""
    return bool(get_store().query(_EVER_SQL, {"project_id": project_id},
                                  tag="analytics.cache_selectors.ever").scalar())


def cache_savings(*, project_id: int, start: datetime, end: datetime, service: str = "", points: int = 120,
                  series: bool = True) -> CacheSavings:
    """The cache figures of [start, end) (the requests whose root starts in it), per endpoint and,
    with ``series``, per bucket of the step the page's other series use (about ``points`` buckets)."""
    store = get_store()
    params = {"project_id": project_id, "start_ns": _ns(start), "end_ns": _ns(end), "service": service}
    groups = [_group(r) for r in store.query(_BY_ENDPOINT_SQL, params,
                                              tag="analytics.cache_selectors.by_endpoint").dicts()]
    means = {g.key: g for g in groups}
    endpoints = sorted((_endpoint(g) for g in groups),
                       key=lambda e: (-(e.cost_saved_usd or 0.0), -e.hits, e.service, e.root_name))
    ever = bool(groups) or cache_ever_consulted(project_id=project_id)
    savings = CacheSavings(start=start, end=end, ever=ever, totals=_figures(groups, means), endpoints=endpoints)
    if not series:
        return savings
    step = bucket_seconds(start=start, end=end, points=points)
    times = bucket_times(start=start, end=end, step=step)
    buckets: list[CacheFigures | None] = [None] * len(times)
    if groups:
        index = {int(t.timestamp() * 1000): i for i, t in enumerate(times)}
        per_bucket: dict[int, list[_Group]] = {}
        for r in store.query(_BY_BUCKET_SQL, {**params, "step_ms": step * 1000},
                             tag="analytics.cache_selectors.by_bucket").dicts():
            per_bucket.setdefault(int(r["bucket_ms"]), []).append(_group(r))
        for bucket_ms, bucket_groups in per_bucket.items():
            i = index.get(bucket_ms)
            if i is not None:
                buckets[i] = _figures(bucket_groups, means)
    return CacheSavings(start=start, end=end, ever=ever, totals=savings.totals, endpoints=endpoints,
                        step_seconds=step, times=times, buckets=buckets)
