"""The state machine of one alert series, Prometheus' semantics, with missing data explicit.

Pure functions over small dataclasses (no database, no clock): the tests drive them with scripted
sample streams, and the evaluation round (alerts.services) persists what they return.

Per evaluation the series gets a value or ``None`` (no sample in the rule's window: missing,
never read as 0):

- breaching (value compares true against the threshold): inactive/resolved -> pending (or straight
  to firing when ``for`` is 0); pending -> firing once breaching SAMPLES cover ``for`` seconds:
  pending starts at the time of the first breaching sample seen (``sample_at``, the newest sample
  behind the value), and fires when a later breaching sample is at least ``for`` seconds after it.
  One sample is never ``for`` seconds, however long the evaluations go on: without new samples the
  coverage does not grow. A gap between two successive breaching samples longer than the rule's
  ``gap_seconds`` restarts the coverage at the later sample (the breach was not observed
  continuously);
- not breaching: pending -> inactive (nothing was ever notified); firing -> resolved once it has
  not breached for ``keep_firing_for`` seconds (0: at once);
- missing: ``keep_last`` keeps the state as it is, ``alert`` counts as breaching, ``resolve`` as not
  breaching; whatever the policy (except ``alert``), a series with no data for ``grace`` seconds
  resolves (the host or service went away) and is marked stale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

INACTIVE, PENDING, FIRING, RESOLVED = "inactive", "pending", "firing", "resolved"


@dataclass(frozen=True)
class RuleSpec:
    comparator: str  # gt | gte | lt | lte
    threshold: float
    for_seconds: float = 0.0
    keep_firing_for_seconds: float = 0.0
    missing_data: str = "keep_last"  # keep_last | alert | resolve
    grace_seconds: float = 300.0
    gap_seconds: float = 60.0  # longest gap between two breaching samples that still counts as continuous


@dataclass(frozen=True)
class State:
    state: str = INACTIVE
    value: float | None = None
    no_data: bool = False
    active_since: datetime | None = None
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    last_breach_at: datetime | None = None
    last_seen_at: datetime | None = None
    missing_since: datetime | None = None
    last_sample_at: datetime | None = None  # the newest sample behind the last breaching value
    stale: bool = False  # no data for longer than the grace period


@dataclass(frozen=True)
class Transition:
    from_state: str
    to_state: str
    reason: str


def breaches(comparator: str, value: float, threshold: float) -> bool:
    if comparator == "gt":
        return value > threshold
    if comparator == "gte":
        return value >= threshold
    if comparator == "lt":
        return value < threshold
    if comparator == "lte":
        return value <= threshold
    raise ValueError(f"unknown comparator {comparator!r}")


def step(rule: RuleSpec, current: State, value: float | None, now: datetime,
         sample_at: datetime | None = None) -> tuple[State, Transition | None]:
    """The series' state after one evaluation at ``now`` with ``value`` (None: missing).

    ``sample_at``: the time of the newest sample behind ``value`` (default ``now``: one sample per
    evaluation). Missing data that counts as breaching (policy ``alert``) is covered by the clock."""
    if value is None or value != value:  # NaN (0/0) is missing too
        missing_since = current.missing_since or now
        st = replace(current, no_data=True, missing_since=missing_since)
        seen = current.last_seen_at or missing_since
        gone = (now - seen).total_seconds() >= rule.grace_seconds
        if rule.missing_data == "alert":
            return _apply(rule, st, True, now, "no data", sample_at=now)
        if gone:
            st = replace(st, stale=True)
            return _apply(rule, st, False, now, "no data for the grace period", force_resolve=True)
        if rule.missing_data == "resolve":
            return _apply(rule, st, False, now, "no data")
        return st, None  # keep_last
    st = replace(current, value=float(value), no_data=False, missing_since=None, last_seen_at=now, stale=False)
    hit = breaches(rule.comparator, float(value), rule.threshold)
    return _apply(rule, st, hit, now, f"value {float(value):g}", sample_at=sample_at or now)


def _apply(rule: RuleSpec, st: State, hit: bool, now: datetime, reason: str, *, sample_at: datetime | None = None,
           force_resolve: bool = False) -> tuple[State, Transition | None]:
    before = st.state
    if hit:
        sample_at = min(sample_at or now, now)
        previous = st.last_sample_at
        st = replace(st, last_breach_at=now, last_sample_at=max(sample_at, previous) if previous else sample_at)
        if before in (INACTIVE, RESOLVED):
            if rule.for_seconds <= 0:
                return replace(st, state=FIRING, active_since=now, fired_at=now, resolved_at=None), \
                    Transition(before, FIRING, reason)
            return replace(st, state=PENDING, active_since=sample_at), Transition(before, PENDING, reason)
        if before == PENDING:
            newest = st.last_sample_at
            if st.active_since is None or previous is None or \
                    (newest - previous).total_seconds() > rule.gap_seconds:
                # the breach was not observed continuously: the coverage starts again here
                return replace(st, active_since=newest), None
            if newest - st.active_since >= timedelta(seconds=rule.for_seconds):
                return replace(st, state=FIRING, fired_at=now, resolved_at=None), Transition(PENDING, FIRING, reason)
            return st, None
        return st, None  # firing stays firing
    st = replace(st, last_sample_at=None)
    if before == PENDING:
        return replace(st, state=INACTIVE, active_since=None), Transition(PENDING, INACTIVE, reason)
    if before == FIRING:
        held = st.last_breach_at is not None and not force_resolve and \
            now - st.last_breach_at < timedelta(seconds=rule.keep_firing_for_seconds)
        if held:
            return st, None
        return replace(st, state=RESOLVED, resolved_at=now, active_since=None), Transition(FIRING, RESOLVED, reason)
    return st, None
