"""Latency metrics of a window, per root service, straight from raw spans.

The window's spans are read once per (project, window, model) per round, deduplicated per
(trace_id, span_id) (a re-sent span counts once even before ClickHouse merges it), and every trace
is summarised by ``dashboard.trace_math.trace_summarize`` (DOMAIN.md "Per trace"). A request is a
trace whose ROOT span starts in the window (DOMAIN.md "Over a time window"); traces whose root has
not arrived are not counted yet.

Per service (the root span's), over the window's requests:
- ``e2e_p50_ms`` / ``e2e_p95_ms`` / ``e2e_p99_ms``: exact percentiles (linear interpolation
  between closest ranks) of the roots' durations;
- ``ttft_p95_ms``: over the requests that report a TTFT;
- ``phase_share_percent:<phase>``: that phase's exclusive time summed over the requests / their
  summed E2E (time-weighted, so one long request weighs what it cost);
- ``network_p95_ms``: over the requests that spent any time on the network;
- ``error_rate_percent``: error requests / requests, a request's status being its root's
  (DOMAIN.md "Status": one whose failed model call was retried successfully is recovered, not an
  error); ``request_rate``: requests / window seconds.
A service without a request in the window has no series this round (missing, never 0).
Load-test traffic (traces whose spans carry ``loadtest.run_id``) is left out: a load test measures
the service on purpose and must not page anyone (its report shows what it measured). Each
series' ``sample_at`` is the start of its newest request.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone

from dashboard.trace_math import PHASES, SPAN_FIELDS_SQL, trace_summarize
from store import get_store

from .metrics import Series, series_key

_SPANS_SQL = f"""
SELECT trace_id, {SPAN_FIELDS_SQL}, attributes['loadtest.run_id'] != '' AS loadtest
FROM spans
WHERE project_id = {{project_id:UInt64}}
  AND start_time > fromUnixTimestamp64Milli({{since_ms:Int64}})
  AND start_time <= fromUnixTimestamp64Milli({{until_ms:Int64}})
ORDER BY ingested_at DESC
LIMIT 1 BY trace_id, span_id
"""


def percentile(values: list[float], q: float) -> float | None:
    """Exact percentile of ``values`` (0 <= q <= 1), linear between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def latency_fetch(*, project_id: int, window_seconds: int, now: datetime, model: str = "") -> list[Series]:
    until = _ms(now)
    since = until - window_seconds * 1000
    rows = get_store().query(_SPANS_SQL, {"project_id": project_id, "since_ms": since, "until_ms": until},
                             tag="alerts.latency.latency_fetch").dicts()
    return latency_series(rows, since_ns=since * 1_000_000, window_seconds=window_seconds, model=model)


def latency_series(rows: list[dict], *, since_ns: int, window_seconds: float, model: str = "") -> list[Series]:
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_trace[row["trace_id"]].append(row)
    per_service: dict[str, list] = defaultdict(list)
    for spans in by_trace.values():
        if model and not any(s.get("model") == model for s in spans):
            continue
        if any(s.get("loadtest") for s in spans):
            continue
        summary = trace_summarize(spans)
        if not summary.has_root or summary.start_ns <= since_ns:
            continue
        per_service[summary.service].append(summary)
    out = []
    for service, traces in sorted(per_service.items()):
        e2e = [t.e2e_ns / 1e6 for t in traces]
        ttft = [t.ttft_ns / 1e6 for t in traces if t.ttft_ns is not None]
        network = [t.phase_ns.get("network", 0) / 1e6 for t in traces if t.phase_ns.get("network", 0) > 0]
        total = sum(t.e2e_ns for t in traces)
        values = {
            "e2e_p50_ms": percentile(e2e, 0.50),
            "e2e_p95_ms": percentile(e2e, 0.95),
            "e2e_p99_ms": percentile(e2e, 0.99),
            "ttft_p95_ms": percentile(ttft, 0.95),
            "network_p95_ms": percentile(network, 0.95),
            "error_rate_percent": 100.0 * sum(t.status == "error" for t in traces) / len(traces),
            "request_rate": len(traces) / window_seconds,
        }
        for phase in PHASES:
            values[f"phase_share_percent:{phase}"] = (100.0 * sum(t.phase_ns.get(phase, 0) for t in traces) / total
                                                      if total > 0 else None)
        labels = {"service": service}
        newest = max(t.start_ns for t in traces)
        out.append(Series(series_key(labels), labels, values, datetime.fromtimestamp(newest / 1e9, tz=timezone.utc)))
    return out
