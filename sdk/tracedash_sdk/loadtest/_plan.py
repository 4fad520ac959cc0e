"""Arrival schedules: the open-loop plan of when each request is sent.

A plan is a sequence of :class:`Segment` s (a step, or a phase of a burst), each with an arrival rate
that is constant or changes linearly from ``qps_start`` to ``qps_end``. Arrival times are computed
up front from the rate alone ("uniform": evenly spaced by the rate; "poisson": a Poisson process of
that rate), never from how the target is doing: a slow target shows as latency, not as fewer
requests (no coordinated omission).
"""

from __future__ import annotations

import math
import random
from typing import Iterator, List, Optional

ARRIVALS = ("uniform", "poisson")


class Segment:
    """One part of a plan: ``duration`` seconds starting at ``start`` (seconds from the run start),
    rate going linearly from ``qps_start`` to ``qps_end``."""

    __slots__ = ("index", "label", "kind", "start", "duration", "qps_start", "qps_end", "planned")

    def __init__(self, index: int, label: str, kind: str, duration: float, qps_start: float,
                 qps_end: Optional[float] = None):
        if duration <= 0:
            raise ValueError(f"{label}: duration must be > 0")
        if qps_start < 0 or (qps_end is not None and qps_end < 0):
            raise ValueError(f"{label}: rates must be >= 0")
        self.index = index
        self.label = label
        self.kind = kind
        self.start = 0.0
        self.duration = float(duration)
        self.qps_start = float(qps_start)
        self.qps_end = float(qps_start if qps_end is None else qps_end)
        self.planned = 0

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def mean_qps(self) -> float:
        return (self.qps_start + self.qps_end) / 2.0

    def rate_at(self, t: float) -> float:
        """The planned rate ``t`` seconds into the segment."""
        return self.qps_start + (self.qps_end - self.qps_start) * min(max(t / self.duration, 0.0), 1.0)

    def _count_until(self, t: float) -> float:
        return self.qps_start * t + (self.qps_end - self.qps_start) * t * t / (2.0 * self.duration)

    def _time_of_count(self, n: float) -> float:
        if n <= 0:
            return 0.0
        a = (self.qps_end - self.qps_start) / (2.0 * self.duration)
        b = self.qps_start
        if abs(a) < 1e-12:
            return n / b if b > 0 else math.inf
        disc = b * b + 4.0 * a * n
        return (-b + math.sqrt(max(disc, 0.0))) / (2.0 * a)

    def to_dict(self) -> dict:
        return {"index": self.index, "label": self.label, "kind": self.kind, "start_s": round(self.start, 6),
                "duration_s": self.duration, "qps_start": self.qps_start, "qps_end": self.qps_end,
                "planned": self.planned}


class ArrivalClock:
    """Turns segments into arrival offsets (seconds from the run start), keeping the spacing
    continuous across segment borders. The first request goes at 0."""

    def __init__(self, arrivals: str = "uniform", seed: Optional[int] = None):
        if arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}; got {arrivals!r}")
        self.arrivals = arrivals
        self.rng = random.Random(seed)
        self._carry = 1.0  # uniform: fraction of the next arrival already accumulated (1.0 = send at once)
        self._next_poisson: Optional[float] = None

    def times(self, seg: Segment) -> Iterator[float]:
        if self.arrivals == "uniform":
            yield from self._uniform(seg)
        else:
            yield from self._poisson(seg)

    def _uniform(self, seg: Segment) -> Iterator[float]:
        total = seg._count_until(seg.duration)
        if total <= 0:
            return
        carry = self._carry
        count = int(math.floor(carry + total + 1e-9))
        for j in range(1, count + 1):
            t = seg._time_of_count(j - carry)
            if t >= seg.duration:
                count = j - 1
                break
            yield seg.start + max(t, 0.0)
        self._carry = carry + total - count

    def _poisson(self, seg: Segment) -> Iterator[float]:
        # Thinning (Lewis & Shedler): candidates at the segment's highest rate, kept with rate(t)/max.
        peak = max(seg.qps_start, seg.qps_end)
        if peak <= 0:
            return
        t = 0.0
        rng = self.rng
        while True:
            t += rng.expovariate(peak)
            if t >= seg.duration:
                return
            if rng.random() * peak <= seg.rate_at(t):
                yield seg.start + t


# ---- the four test types ----------------------------------------------------------------------------

class Plan:
    """A sequence of segments. ``segments()`` is read lazily, so a plan may decide the next segment
    from what the runner measured (``stop_after`` is asked after each one)."""

    test_type = "concurrency"

    def segments(self) -> Iterator[Segment]:  # pragma: no cover - interface
        raise NotImplementedError

    def stop_after(self, segment: Segment, runner) -> bool:
        return False

    def describe(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


class ConstantPlan(Plan):
    """``--test-type concurrency`` (and ``mixed``): one constant arrival rate for ``duration`` s."""

    def __init__(self, qps: float, duration: float, test_type: str = "concurrency"):
        if qps <= 0 or duration <= 0:
            raise ValueError("qps and duration must be > 0")
        self.qps, self.duration, self.test_type = float(qps), float(duration), test_type

    def segments(self) -> Iterator[Segment]:
        yield Segment(0, f"{_fmt(self.qps)} qps", "constant", self.duration, self.qps)

    def describe(self) -> dict:
        return {"qps": self.qps, "duration_s": self.duration}


class StepPlan(Plan):
    """``--test-type step``: start at ``start_fraction`` of ``baseline_qps`` and add
    ``step_fraction`` of it per step, until the runner finds the knee (or ``max_steps``)."""

    test_type = "step"

    def __init__(self, baseline_qps: float, step_duration: float, *, start_fraction: float = 0.5,
                 step_fraction: float = 0.2, max_steps: int = 20):
        if baseline_qps <= 0 or step_duration <= 0:
            raise ValueError("qps and step duration must be > 0")
        if start_fraction <= 0 or step_fraction <= 0 or max_steps < 2:
            raise ValueError("start and step fractions must be > 0 and max_steps >= 2")
        self.baseline_qps = float(baseline_qps)
        self.step_duration = float(step_duration)
        self.start_fraction = float(start_fraction)
        self.step_fraction = float(step_fraction)
        self.max_steps = int(max_steps)

    def qps_of(self, k: int) -> float:
        return self.baseline_qps * (self.start_fraction + self.step_fraction * k)

    def segments(self) -> Iterator[Segment]:
        for k in range(self.max_steps):
            qps = self.qps_of(k)
            yield Segment(k, f"step {k + 1}: {_fmt(qps)} qps", "step", self.step_duration, qps)

    def stop_after(self, segment: Segment, runner) -> bool:
        return runner.knee_now() is not None

    def describe(self) -> dict:
        return {"baseline_qps": self.baseline_qps, "step_duration_s": self.step_duration,
                "start_fraction": self.start_fraction, "step_fraction": self.step_fraction,
                "step_qps": self.baseline_qps * self.step_fraction, "max_steps": self.max_steps}


class BurstPlan(Plan):
    """``--test-type burst``: ``baseline_s`` at the baseline rate, a linear rise to
    ``factor`` x baseline over ``ramp_s`` (10 s by default), ``hold_s`` at the peak, then back to the
    baseline at once for ``recover_s`` while the runner measures the recovery."""

    test_type = "burst"

    def __init__(self, baseline_qps: float, *, baseline_s: float = 30.0, ramp_s: float = 10.0, hold_s: float = 30.0,
                 recover_s: float = 60.0, factor: float = 3.0):
        if baseline_qps <= 0 or min(baseline_s, hold_s, recover_s) <= 0 or ramp_s < 0 or factor <= 1:
            raise ValueError("burst: qps and durations must be > 0 (ramp >= 0) and the factor > 1")
        self.baseline_qps, self.factor = float(baseline_qps), float(factor)
        self.baseline_s, self.ramp_s, self.hold_s, self.recover_s = (float(baseline_s), float(ramp_s),
                                                                   float(hold_s), float(recover_s))

    @property
    def peak_qps(self) -> float:
        return self.baseline_qps * self.factor

    @property
    def burst_end(self) -> float:
        """Seconds from the run start at which the rate drops back to the baseline."""
        return self.baseline_s + self.ramp_s + self.hold_s

    def segments(self) -> Iterator[Segment]:
        base, peak = self.baseline_qps, self.peak_qps
        yield Segment(0, f"baseline {_fmt(base)} qps", "baseline", self.baseline_s, base)
        index = 1
        if self.ramp_s > 0:
            yield Segment(index, f"ramp to {_fmt(peak)} qps", "ramp", self.ramp_s, base, peak)
            index += 1
        yield Segment(index, f"hold {_fmt(peak)} qps", "hold", self.hold_s, peak)
        yield Segment(index + 1, f"recovery {_fmt(base)} qps", "recovery", self.recover_s, base)

    def describe(self) -> dict:
        return {"baseline_qps": self.baseline_qps, "peak_qps": self.peak_qps, "factor": self.factor,
                "baseline_s": self.baseline_s, "ramp_s": self.ramp_s, "hold_s": self.hold_s,
                "recover_s": self.recover_s}


def _fmt(qps: float) -> str:
    return f"{qps:g}" if qps >= 100 or qps == int(qps) else f"{qps:.1f}"


def planned_segments(plan: Plan) -> List[Segment]:
    """Every segment of a plan that does not adapt (for previews and tests), with start times."""
    out, start = [], 0.0
    for seg in plan.segments():
        seg.start = start
        start = seg.end
        out.append(seg)
    return out
