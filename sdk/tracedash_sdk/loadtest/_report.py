"""From per-request results to the run report: per-step figures, the knee, burst recovery, a timeline.

Definitions (docs/loadtest.md, after DOMAIN.md "Load tests"):

- A request belongs to the step (segment) in which it was *planned*; its latency (E2E) runs from
  the moment it was sent to its last byte; TTFT to the first content chunk; TPOT =
  (E2E - TTFT) / (output tokens - 1) for streamed answers of >= 2 tokens.
- **Offered** QPS of a step = requests planned in it / its duration. **Achieved** RPS = successful
  answers that *completed* within the step, after its first quarter (answers lag arrivals by a
  latency, so a change of rate takes a moment to show) / those seconds: what the target delivered.
- Percentiles are exact (every sample is kept), by linear interpolation between closest ranks.
- **Knee** (step test): the first step k >= 1 where achieved throughput stops rising with offered
  load (achieved < (1 - lag tolerance) x offered, or achieved did not rise above step k-1), or P95
  exceeds its limit (``p95_limit_ms``, else ``p95_factor`` x the first step's P95), or the error
  rate exceeds ``max_error_rate``. The capacity estimate is the highest achieved RPS up to the knee.
- **Recovery time** (burst test): from the end of the burst until the P95 of the requests sent in
  a window is back within 10 % of the baseline P95 and stays there for the following windows.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence

REPORT_VERSION = 1


class Result:
    """One request: times are seconds from the run start (``sent``/``first``/``end`` None until known)."""

    __slots__ = ("step", "planned", "sent", "first", "end", "status", "error", "output_tokens", "input_tokens",
                 "scenario", "model", "stream", "timed_out")

    def __init__(self, step: int, planned: float, scenario: str, model: str, stream: bool = True):
        self.step, self.planned, self.scenario, self.model, self.stream = step, planned, scenario, model, stream
        self.sent: Optional[float] = None
        self.first: Optional[float] = None
        self.end: Optional[float] = None
        self.status = 0
        self.error: Optional[str] = None
        self.output_tokens = 0
        self.input_tokens: Optional[int] = None
        self.timed_out = False

    @property
    def ok(self) -> bool:
        return self.end is not None and self.error is None

    @property
    def latency(self) -> Optional[float]:
        return None if self.end is None or self.sent is None else self.end - self.sent

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first is None or self.sent is None else self.first - self.sent

    @property
    def tpot(self) -> Optional[float]:
        if not self.ok or self.first is None or not self.stream or self.output_tokens < 2:
            return None
        return (self.end - self.first) / (self.output_tokens - 1)

    @property
    def lag(self) -> Optional[float]:
        return None if self.sent is None else self.sent - self.planned


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of an already sorted sequence."""
    n = len(sorted_values)
    if n == 1:
        return sorted_values[0]
    rank = (n - 1) * p / 100.0
    lo = int(math.floor(rank))
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def distribution_ms(values: Iterable[float]) -> Optional[Dict[str, float]]:
    """p50/p90/p95/p99/mean/max in milliseconds of ``values`` (seconds); None when empty."""
    data = sorted(values)
    if not data:
        return None
    out = {f"p{p}": round(percentile(data, p) * 1000.0, 3) for p in (50, 90, 95, 99)}
    out["mean"] = round(sum(data) / len(data) * 1000.0, 3)
    out["max"] = round(data[-1] * 1000.0, 3)
    out["count"] = len(data)
    return out


def _rate(n: float, seconds: float) -> float:
    return round(n / seconds, 3) if seconds > 0 else 0.0


def summarize(results: Sequence[Result], start: float, end: float, *, completions: Optional[Sequence[Result]] = None,
              now: Optional[float] = None, settle: float = 0.0) -> Dict[str, Any]:
    """Figures of the requests planned in [start, end). ``completions`` (default: ``results``) are
    the requests whose completions count toward achieved RPS, over [start + settle, end): after a
    change of rate, answers lag the arrivals by a latency, so the first ``settle`` seconds are left
    out. With ``now`` (a live view), unfinished requests count with their age so far as a lower
    bound of latency."""
    duration = end - start
    settle = min(max(settle, 0.0), duration / 2)
    counted_from, counted = start + settle, duration - settle
    latencies, ttfts, tpots, lags = [], [], [], []
    ok = errors = unfinished = out_tokens = 0
    error_kinds: Dict[str, int] = {}
    for r in results:
        if r.sent is not None:
            lags.append(r.sent - r.planned)
        if r.end is None:
            unfinished += 1
            if now is not None and r.sent is not None:
                latencies.append(now - r.sent)
            continue
        if r.error is None:
            ok += 1
            latencies.append(r.end - r.sent)
            out_tokens += r.output_tokens
            if r.first is not None:
                ttfts.append(r.first - r.sent)
            tpot = r.tpot
            if tpot is not None:
                tpots.append(tpot)
        else:
            errors += 1
            key = r.error if len(r.error) <= 80 else r.error[:77] + "..."
            error_kinds[key] = error_kinds.get(key, 0) + 1
    done = ok + errors
    achieved = out_counted = 0
    for r in (results if completions is None else completions):
        if r.end is not None and r.error is None and counted_from <= r.end < end:
            achieved += 1
            out_counted += r.output_tokens
    return {
        "planned": len(results),
        "sent": sum(1 for r in results if r.sent is not None),
        "ok": ok,
        "errors": errors,
        "unfinished": unfinished,
        "error_rate": round(errors / done, 6) if done else 0.0,
        "offered_qps": _rate(len(results), duration),
        "achieved_rps": _rate(achieved, counted),
        "output_tokens": out_tokens,
        "output_tps": _rate(out_counted, counted),
        "e2e_ms": distribution_ms(latencies),
        "ttft_ms": distribution_ms(ttfts),
        "tpot_ms": distribution_ms(tpots),
        "schedule_lag_ms": distribution_ms(lags),
        "errors_by_kind": dict(sorted(error_kinds.items(), key=lambda kv: -kv[1])[:10]),
    }


class KneeRule:
    """When a step counts as past the knee (see the module docstring)."""

    def __init__(self, *, lag_tolerance: float = 0.05, p95_factor: float = 2.0, p95_limit_ms: Optional[float] = None,
                 max_error_rate: float = 0.05):
        if not 0 < lag_tolerance < 1 or p95_factor <= 1 or not 0 <= max_error_rate < 1:
            raise ValueError("knee rule: 0 < lag tolerance < 1, p95 factor > 1, 0 <= max error rate < 1")
        self.lag_tolerance, self.p95_factor = lag_tolerance, p95_factor
        self.p95_limit_ms, self.max_error_rate = p95_limit_ms, max_error_rate

    def p95_limit(self, steps: Sequence[dict]) -> Optional[float]:
        if self.p95_limit_ms is not None:
            return self.p95_limit_ms
        first = steps[0]["e2e_ms"] if steps else None
        return first["p95"] * self.p95_factor if first else None

    def find(self, steps: Sequence[dict]) -> Optional[Dict[str, Any]]:
        """The knee among ``steps`` (dicts from :func:`summarize` plus ``index``/``label``), or None."""
        limit = self.p95_limit(steps)
        best = steps[0]["achieved_rps"] if steps else 0.0
        for k in range(1, len(steps)):
            step, previous = steps[k], steps[k - 1]
            reasons = []
            offered, achieved = step["offered_qps"], step["achieved_rps"]
            if achieved < (1.0 - self.lag_tolerance) * offered:
                reasons.append(f"achieved {achieved:.1f} rps < {(1 - self.lag_tolerance) * 100:g} % of offered "
                               f"{offered:.1f} qps")
            elif achieved <= previous["achieved_rps"]:
                reasons.append(f"achieved {achieved:.1f} rps did not rise above the previous step's "
                               f"{previous['achieved_rps']:.1f}")
            p95 = step["e2e_ms"]["p95"] if step["e2e_ms"] else None
            if limit is not None and p95 is not None and p95 > limit:
                reasons.append(f"P95 {p95:.1f} ms > limit {limit:.1f} ms")
            if step["error_rate"] > self.max_error_rate:
                reasons.append(f"error rate {step['error_rate'] * 100:.1f} % > {self.max_error_rate * 100:g} %")
            best = max(best, achieved)
            if reasons:
                return {"step": step["index"], "label": step["label"], "offered_qps": offered,
                        "achieved_rps": achieved, "last_good_qps": previous["offered_qps"],
                        "capacity_rps": best, "p95_limit_ms": round(limit, 3) if limit is not None else None,
                        "reasons": reasons}
        return None

    def to_dict(self) -> dict:
        return {"lag_tolerance": self.lag_tolerance, "p95_factor": self.p95_factor,
                "p95_limit_ms": self.p95_limit_ms, "max_error_rate": self.max_error_rate}


def timeline(results: Sequence[Result], *, window: float, duration: float) -> List[Dict[str, Any]]:
    """Per window of ``window`` seconds: offered (planned), achieved (ok completions), errors (by
    completion), and latency percentiles of the requests *sent* in the window."""
    n = max(1, int(math.ceil(duration / window - 1e-9)))
    planned = [0] * n
    achieved = [0] * n
    errors = [0] * n
    lat: List[List[float]] = [[] for _ in range(n)]
    ttft: List[List[float]] = [[] for _ in range(n)]

    def slot(t: float) -> Optional[int]:
        i = int(t // window)
        return i if 0 <= i < n else None

    for r in results:
        i = slot(r.planned)
        if i is not None:
            planned[i] += 1
        if r.end is not None:
            j = slot(r.end)
            if j is not None:
                if r.error is None:
                    achieved[j] += 1
                else:
                    errors[j] += 1
        if r.sent is not None:
            i = slot(r.sent)
            if i is not None and r.ok:
                lat[i].append(r.end - r.sent)
                if r.first is not None:
                    ttft[i].append(r.first - r.sent)
    out = []
    for i in range(n):
        data = sorted(lat[i])
        tt = sorted(ttft[i])
        out.append({
            "t": round(i * window, 6),
            "offered_qps": _rate(planned[i], window),
            "achieved_rps": _rate(achieved[i], window),
            "errors": errors[i],
            "p50_ms": round(percentile(data, 50) * 1000, 3) if data else None,
            "p95_ms": round(percentile(data, 95) * 1000, 3) if data else None,
            "p99_ms": round(percentile(data, 99) * 1000, 3) if data else None,
            "ttft_p95_ms": round(percentile(tt, 95) * 1000, 3) if tt else None,
        })
    return out


def burst_recovery(results: Sequence[Result], *, baseline_start: float, baseline_end: float, burst_end: float,
                   window: float, end: float, confirm_windows: int = 2, tolerance: float = 0.10) -> Dict[str, Any]:
    """Recovery after a burst (DOMAIN.md): time from ``burst_end`` until the P95 latency of the
    requests sent in a window is within ``tolerance`` of the baseline P95 and stays so for the next
    ``confirm_windows`` windows (or until the run ends). Unfinished or failed requests count as
    infinitely slow, so a window with them is never "recovered"."""
    base = sorted(r.latency for r in results if r.ok and baseline_start <= r.planned < baseline_end)
    out: Dict[str, Any] = {"baseline_p95_ms": None, "limit_ms": None, "recovery_s": None, "recovered": False,
                           "burst_end_s": round(burst_end, 6), "window_s": window, "windows": []}
    if not base:
        return out
    baseline_p95 = percentile(base, 95)
    limit = baseline_p95 * (1.0 + tolerance)
    out["baseline_p95_ms"] = round(baseline_p95 * 1000, 3)
    out["limit_ms"] = round(limit * 1000, 3)
    n = int((end - burst_end) // window)
    p95s: List[Optional[float]] = []
    for i in range(n):
        lo, hi = burst_end + i * window, burst_end + (i + 1) * window
        data = sorted((r.latency if r.ok else math.inf) for r in results if r.sent is not None and lo <= r.sent < hi)
        p95s.append(percentile(data, 95) if data else None)
    out["windows"] = [None if (p is None or math.isinf(p)) else round(p * 1000, 3) for p in p95s]
    for i in range(n):
        following = p95s[i:i + 1 + confirm_windows]
        if following[0] is None:
            continue
        if all(p is None or p <= limit for p in following):
            out["recovery_s"] = round(i * window, 6)
            out["recovered"] = True
            break
    return out


def format_table(report: Dict[str, Any]) -> str:
    """The report's steps as a fixed-width text table, then the headline lines."""
    head = ("step", "offered", "achieved", "ok", "err%", "p50 ms", "p95 ms", "p99 ms", "ttft p95", "tpot p50",
            "lag p99")
    rows = [head]

    def ms(d, key):
        return "-" if not d else f"{d[key]:.1f}"

    for s in report["steps"]:
        rows.append((s["label"], f"{s['offered_qps']:.1f}", f"{s['achieved_rps']:.1f}", str(s["ok"]),
                     f"{s['error_rate'] * 100:.1f}", ms(s["e2e_ms"], "p50"), ms(s["e2e_ms"], "p95"),
                     ms(s["e2e_ms"], "p99"), ms(s["ttft_ms"], "p95"), ms(s["tpot_ms"], "p50"),
                     ms(s["schedule_lag_ms"], "p99")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    total = report["totals"]
    lines.append("")
    lines.append(f"{total['planned']} requests planned, {total['ok']} ok, {total['errors']} errors, "
                 f"{total['unfinished']} unfinished; achieved {total['achieved_rps']:.1f} rps over "
                 f"{report['duration_s']:.1f} s; schedule lag p99 "
                 f"{ms(total['schedule_lag_ms'], 'p99')} ms")
    knee = report.get("knee")
    if report["test_type"] == "step":
        if knee:
            lines.append(f"Knee at {knee['label']}: {'; '.join(knee['reasons'])}. "
                         f"Capacity ~ {knee['capacity_rps']:.1f} rps; last good step {knee['last_good_qps']:.1f} qps.")
        else:
            lines.append("No knee found: throughput kept rising up to the last step (raise --qps or --max-steps).")
    burst = report.get("burst")
    if burst:
        if burst["recovered"]:
            lines.append(f"Burst recovery: P95 back within 10 % of the baseline {burst['baseline_p95_ms']:.1f} ms "
                         f"{burst['recovery_s']:.2f} s after the burst ended.")
        else:
            lines.append(f"Burst recovery: P95 did not return within 10 % of the baseline "
                         f"({burst['baseline_p95_ms']} ms) before the test ended.")
    return "\n".join(lines)
