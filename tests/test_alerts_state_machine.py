"""The alert state machine against scripted sample streams (no database, no clock)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alerts.state_machine import FIRING, INACTIVE, PENDING, RESOLVED, RuleSpec, State, step

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def run(rule, values, every=5.0, start=State()):
    """Feed ``values`` (None = missing) one per ``every`` seconds; return (states, transitions)."""
    state, states, transitions = start, [], []
    for i, value in enumerate(values):
        now = T0 + timedelta(seconds=i * every)
        state, tr = step(rule, state, value, now)
        states.append(state.state)
        if tr:
            transitions.append((i, tr.from_state, tr.to_state))
    return states, transitions, state


def test_for_zero_fires_on_the_first_breaching_sample_and_resolves_on_recovery():
    rule = RuleSpec("gte", 85)
    states, transitions, _ = run(rule, [80, 86, 90, 84])
    assert states == [INACTIVE, FIRING, FIRING, RESOLVED]
    assert transitions == [(1, INACTIVE, FIRING), (3, FIRING, RESOLVED)]


def test_threshold_comparators_are_exact_at_the_boundary():
    assert run(RuleSpec("gte", 85), [85])[0] == [FIRING]
    assert run(RuleSpec("gt", 85), [85])[0] == [INACTIVE]
    assert run(RuleSpec("lt", 50), [50, 49.9])[0] == [INACTIVE, FIRING]
    assert run(RuleSpec("lte", 50), [50])[0] == [FIRING]


def test_for_duration_holds_pending_until_it_has_breached_that_long():
    rule = RuleSpec("gte", 85, for_seconds=60)
    values = [90] * 14  # every 5 s: 0 … 65 s
    states, transitions, _ = run(rule, values)
    assert states[0] == PENDING and states[11] == PENDING  # 55 s
    assert states[12] == FIRING  # 60 s after the first breach
    assert transitions == [(0, INACTIVE, PENDING), (12, PENDING, FIRING)]


def test_flapping_input_with_for_never_fires():
    rule = RuleSpec("gte", 85, for_seconds=30)
    states, transitions, _ = run(rule, [90, 80] * 60)
    assert FIRING not in states
    assert {(a, b) for _, a, b in transitions} == {(INACTIVE, PENDING), (PENDING, INACTIVE)}


def test_keep_firing_for_rides_out_short_dips():
    rule = RuleSpec("gte", 85, keep_firing_for_seconds=20)
    # fires, dips for 15 s (3 samples), breaches again, then recovers for good
    states, transitions, _ = run(rule, [90, 80, 80, 80, 90, 80, 80, 80, 80, 80])
    assert transitions == [(0, INACTIVE, FIRING), (8, FIRING, RESOLVED)]  # 20 s after the last breach at i=4
    assert states[1:8] == [FIRING] * 7


def test_missing_data_keep_last_holds_the_state_and_is_flagged():
    rule = RuleSpec("gte", 85, missing_data="keep_last", grace_seconds=300)
    states, transitions, last = run(rule, [90, None, None, None])
    assert states == [FIRING] * 4 and transitions == [(0, INACTIVE, FIRING)]
    assert last.no_data and last.value == 90  # the last real value is kept, never replaced by 0
    assert last.missing_since == T0 + timedelta(seconds=5)


def test_a_gap_is_not_read_as_zero():
    # "less than 50 % utilisation" must not fire because samples stopped arriving
    rule = RuleSpec("lt", 50, missing_data="keep_last")
    states, transitions, _ = run(rule, [70, None, None, 70])
    assert transitions == [] and states == [INACTIVE] * 4


def test_missing_data_alert_policy_fires_and_resolve_policy_resolves():
    alert = RuleSpec("gte", 85, missing_data="alert")
    states, transitions, last = run(alert, [50, None, None])
    assert states == [INACTIVE, FIRING, FIRING] and transitions[0][1:] == (INACTIVE, FIRING)
    resolve = RuleSpec("gte", 85, missing_data="resolve")
    states, transitions, _ = run(resolve, [90, None])
    assert states == [FIRING, RESOLVED]


def test_a_series_that_disappears_resolves_after_the_grace_period():
    rule = RuleSpec("gte", 85, missing_data="keep_last", grace_seconds=30)
    states, transitions, last = run(rule, [90] + [None] * 8)
    assert transitions == [(0, INACTIVE, FIRING), (6, FIRING, RESOLVED)]  # last seen at 0 s, gone at 30 s
    assert last.stale


def test_recovery_after_resolution_goes_through_pending_again():
    rule = RuleSpec("gte", 85, for_seconds=10)
    states, transitions, _ = run(rule, [90, 90, 90, 80, 90, 90, 90])
    assert [t[1:] for t in transitions] == [(INACTIVE, PENDING), (PENDING, FIRING), (FIRING, RESOLVED),
                                          (RESOLVED, PENDING), (PENDING, FIRING)]


def test_nan_is_missing():
    rule = RuleSpec("gte", 85, missing_data="keep_last")
    _, transitions, last = run(rule, [float("nan")])
    assert transitions == [] and last.no_data


def test_unknown_comparator_is_an_error():
    with pytest.raises(ValueError, match="comparator"):
        step(RuleSpec("~", 1), State(), 1.0, T0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), max_size=60),
       st.sampled_from([0, 10, 30]), st.sampled_from([0, 10]), st.sampled_from(["keep_last", "alert", "resolve"]))
def test_transitions_are_always_legal(values, for_s, keep_s, policy):
    rule = RuleSpec("gte", 85, for_seconds=for_s, keep_firing_for_seconds=keep_s, missing_data=policy, grace_seconds=60)
    legal = {(INACTIVE, PENDING), (INACTIVE, FIRING), (PENDING, FIRING), (PENDING, INACTIVE), (FIRING, RESOLVED),
             (RESOLVED, PENDING), (RESOLVED, FIRING)}
    _, transitions, _ = run(rule, values)
    for _, a, b in transitions:
        assert (a, b) in legal
    # firing and resolved alternate: never two firings without a resolution between them
    fired = [b for _, a, b in transitions if b in (FIRING, RESOLVED)]
    assert all(x != y for x, y in zip(fired, fired[1:]))


# --- `for` needs breaching samples that span it (issue: a 5-minute rule fired on its first sample) ---

def run_samples(rule, stream, every=5.0, start=State()):
    """Evaluate every ``every`` seconds; ``stream(t)`` -> (value, sample time in seconds | None)."""
    state, transitions = start, []
    i = 0
    while True:
        t = i * every
        got = stream(t)
        if got is StopIteration:
            return transitions, state
        value, sampled = got
        state, tr = step(rule, state, value, T0 + timedelta(seconds=t),
                         None if sampled is None else T0 + timedelta(seconds=sampled))
        if tr:
            transitions.append((t, tr.from_state, tr.to_state))
        i += 1


FIVE_MIN = RuleSpec("gt", 70, for_seconds=300, gap_seconds=60)


def test_a_single_sample_never_fires_a_five_minute_rule_however_long_it_is_evaluated():
    # One breaching sample at t=0 (an average over the window stays at that value); evaluated
    # every 5 s for 20 minutes: it is pending, never firing.
    transitions, last = run_samples(FIVE_MIN, lambda t: StopIteration if t > 1200 else (95.0, 0.0))
    assert transitions == [(0, INACTIVE, PENDING)]
    assert last.state == PENDING and last.active_since == T0


def test_continuous_samples_over_five_minutes_fire_at_five_minutes():
    # a sample every 10 s, evaluations every 5 s: fires once a breaching sample is 300 s after the first
    transitions, _ = run_samples(FIVE_MIN, lambda t: StopIteration if t > 400 else (95.0, t - t % 10))
    assert transitions == [(0, INACTIVE, PENDING), (300, PENDING, FIRING)]


def test_a_gap_in_the_samples_restarts_the_coverage():
    # samples every 10 s for 200 s, none for 90 s (> 60 s tolerance), then again from 290 s
    def stream(t):
        if t > 700:
            return StopIteration
        return 95.0, (t - t % 10 if t < 200 or t >= 290 else 190.0)
    transitions, _ = run_samples(FIVE_MIN, stream)
    assert transitions == [(0, INACTIVE, PENDING), (590, PENDING, FIRING)]  # 290 + 300


def test_a_gap_within_the_tolerance_does_not_restart_it():
    def stream(t):
        if t > 400:
            return StopIteration
        return 95.0, (t - t % 10 if t < 100 or t >= 140 else 90.0)  # 50 s without a sample
    transitions, _ = run_samples(FIVE_MIN, stream)
    assert transitions == [(0, INACTIVE, PENDING), (300, PENDING, FIRING)]


def test_gpu_memory_for_one_minute_fires_after_a_minute_of_agent_samples():
    rule = RuleSpec("gte", 85, for_seconds=60, gap_seconds=60)
    # the agent samples every 3 s, the round runs every 5 s and sees the newest sample
    transitions, _ = run_samples(rule, lambda t: StopIteration if t > 90 else (90.0, t - t % 3), every=5.0)
    assert transitions == [(0, INACTIVE, PENDING), (60, PENDING, FIRING)]  # the sample of 60 s is 60 s after the first


def test_a_recovery_sample_between_breaches_restarts_the_coverage():
    def stream(t):
        if t > 600:
            return StopIteration
        return (50.0 if t == 200 else 95.0), t
    transitions, _ = run_samples(FIVE_MIN, stream)
    assert transitions == [(0, INACTIVE, PENDING), (200, PENDING, INACTIVE), (205, INACTIVE, PENDING),
                           (505, PENDING, FIRING)]
