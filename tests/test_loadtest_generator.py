"""The open-loop load generator (tracedash_sdk.loadtest) against the LLM simulator.

No database, no ClickHouse: each test starts a simulator with serve() and runs a short load test
(seconds) with small step lengths. The simulator is configured with no jitter and no load slowdown,
so its saturation point is exactly capacity / service time (SimulatorConfig.saturation_rps).
"""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracedash_sdk as td
from demo.simulator import SimulatorConfig, serve
from tracedash_sdk.loadtest import (ArrivalClock, BurstPlan, ConstantPlan, KneeRule, LoadTest, RequestMix, ScenarioError,
                                    Segment, StepPlan, Target, load_scenario_file, percentile)

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 20

# 4 slots, each request holds one for 52.5 + 19 x 2.5 = 100 ms: saturation at 40 completions/s.
SATURATING = dict(queue_delay_ms=0.0, prefill_ms=52.5, prefill_ms_per_token=0.0, decode_ms_per_token=2.5,
                  capacity=4, load_slowdown=0.0, jitter=0.0, error_rate=0.0)


@contextlib.contextmanager
def sim_process(config: SimulatorConfig):
    """The simulator in its own process (as in real use: it does not share the generator's GIL, so
    its service times stay what is configured even on a busy test machine)."""
    port = _free_port()
    path = Path(tempfile.mkdtemp()) / "sim.json"
    data = config.to_dict()
    data.pop("models")
    path.write_text(json.dumps(data))
    proc = subprocess.Popen([sys.executable, "-m", "demo.simulator", "--port", str(port), "--config", str(path),
                             "--log-level", "warning"], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90  # a ceiling: a loaded machine starts it later
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "simulator did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _mix(**kwargs):
    return RequestMix.single(model="sim-gpt", max_tokens=TOKENS, **kwargs)


def test_simulator_saturation_point_is_capacity_over_service_time():
    config = SimulatorConfig(**SATURATING)
    assert config.saturation_rps(output_tokens=TOKENS) == pytest.approx(40.0)
    slow = SimulatorConfig(**{**SATURATING, "load_slowdown": 0.5})
    # a full pool decodes 1 + 0.5 * 3/4 times slower: 52.5 + 47.5 * 1.375 ms per request
    assert slow.saturation_rps(output_tokens=TOKENS) == pytest.approx(4 / ((52.5 + 47.5 * 1.375) / 1000))
    assert SimulatorConfig.instant().saturation_rps(output_tokens=TOKENS) == float("inf")


def test_step_test_finds_the_knee_where_the_target_stops_keeping_up():
    """What the generator detects follows from the run's own data, so a loaded machine (on which
    the simulator delivers less than its configured capacity) moves the knee, never breaks the test.
    The configured capacity is only an upper bound: load can slow the simulator, never speed it up."""
    config = SimulatorConfig(**SATURATING)
    capacity = config.saturation_rps(output_tokens=TOKENS)
    with sim_process(config) as url:
        plan = StepPlan(37.5, 2.0)  # steps of 18.75, 26.25, 33.75, 41.25, 48.75, ... qps
        report = LoadTest(target=Target(url), plan=plan, mix=_mix(), drain_timeout=2.0).run()
    knee = report["knee"]
    assert knee is not None, report["steps"]
    steps = report["steps"]
    # Past the configured capacity the target cannot keep up, whatever the machine: the knee is
    # at or before the second step over it, and the test stopped there (live knee: that step or the
    # next one, requests still queued at a step's end only add latency).
    first_over = next(k for k in range(plan.max_steps) if plan.qps_of(k) > capacity)
    assert knee["step"] <= first_over + 1, (knee, capacity)
    assert report["stopped"] == "knee" and knee["step"] < len(steps) <= knee["step"] + 2
    # The capacity it reports is what the target delivered at the knee: never above the configured one.
    knee_step = steps[knee["step"]]
    assert knee["capacity_rps"] == pytest.approx(max(s["achieved_rps"] for s in steps[:knee["step"] + 1]))
    assert knee["capacity_rps"] <= 1.1 * capacity, knee
    # The knee step fell behind the offered load (or its latency/errors crossed the limit); every
    # step between the first and it kept up.
    assert knee["reasons"] and knee["offered_qps"] == knee_step["offered_qps"], knee
    if knee_step["achieved_rps"] < 0.95 * knee_step["offered_qps"]:
        assert knee["reasons"][0].startswith(f"achieved {knee_step['achieved_rps']:.1f} rps <"), knee
    for step in steps[1:knee["step"]]:
        assert step["errors"] == 0 and step["achieved_rps"] >= 0.95 * step["offered_qps"], step
    assert all(s["ttft_ms"]["p50"] >= 50 for s in steps)  # prefill 52.5 ms: a lower bound holds on any machine


def test_burst_test_detects_and_reports_the_recovery():
    """The recovery is checked against the run's own recorded requests (no wall-clock speed): P95
    rose above the baseline's during the burst, and the reported recovery is the first window after
    it whose P95 is back within 10 % of the baseline P95 and stays there."""
    # Requests of about a second on 40 slots (38 rps): a busy machine's timer delays (tens of ms)
    # stay well inside the 10 % of the baseline P95 that recovery is measured against. Windows of a
    # second (a dozen requests each), and a baseline at under a third of the capacity, so the
    # burst's backlog drains well before the end of the recovery phase even if a loaded machine
    # lets the simulator deliver less.
    window = 1.0
    plan = BurstPlan(12.0, baseline_s=3.0, ramp_s=1.0, hold_s=1.5, recover_s=9.0, factor=5.0)
    config = SimulatorConfig(**{**SATURATING, "prefill_ms": 1000.0, "capacity": 40})
    capacity = config.saturation_rps(output_tokens=TOKENS)
    assert plan.peak_qps > capacity > 3 * plan.baseline_qps
    with sim_process(config) as url:
        test = LoadTest(target=Target(url), plan=plan, mix=_mix(), window=window, drain_timeout=30.0)
        report = test.run()
    burst = report["burst"]
    assert burst["burst_end_s"] == pytest.approx(plan.burst_end) and burst["burst_start_s"] == plan.baseline_s
    results = test.results

    def p95_ms(lo, hi, key):
        lat = sorted((r.latency if r.ok else float("inf")) for r in results
                     if key(r) is not None and lo <= key(r) < hi)
        return percentile(lat, 95) * 1000 if lat else None

    baseline_p95 = p95_ms(0.0, plan.baseline_s, lambda r: r.planned)
    assert burst["baseline_p95_ms"] == pytest.approx(baseline_p95, rel=1e-3)
    assert burst["limit_ms"] == pytest.approx(1.1 * baseline_p95, rel=1e-3)
    assert baseline_p95 >= 1047  # 1000 + 19 x 2.5 ms per request: a lower bound holds on any machine
    # Saturated during the hold (offered above what any machine lets the simulator deliver): the
    # queue grew, and with it the latency.
    hold = next(s for s in report["steps"] if s["kind"] == "hold")
    assert hold["achieved_rps"] < hold["offered_qps"] and hold["e2e_ms"]["p95"] > 1.5 * baseline_p95
    # The backlog was there right after the burst...
    first = p95_ms(plan.burst_end, plan.burst_end + window, lambda r: r.sent)
    assert first is None or first > burst["limit_ms"], (first, burst)
    # ...and it drained: the recovery is reported, after some time, before the end of the run.
    assert burst["recovered"], burst
    assert window <= burst["recovery_s"] < plan.recover_s, burst
    at = plan.burst_end + burst["recovery_s"]
    for k in range(3):  # that window and the two that confirm it are within the limit
        p95 = p95_ms(at + k * window, at + (k + 1) * window, lambda r: r.sent)
        assert p95 is None or p95 <= burst["limit_ms"], (k, p95, burst)
    # and no earlier window qualified: each had a window over the limit among it and the two after
    for i in range(int(round(burst["recovery_s"] / window))):
        lo = plan.burst_end + i * window
        following = [p95_ms(lo + k * window, lo + (k + 1) * window, lambda r: r.sent) for k in range(3)]
        assert following[0] is None or any(p is not None and p > burst["limit_ms"] for p in following), (i, following)
    assert report["timeline"] and burst["windows"][int(round(burst["recovery_s"] / window))] is not None


def test_open_loop_keeps_its_schedule_when_the_target_stalls():
    stalled = SimulatorConfig.instant(prefill_ms=60_000.0)  # every request hangs for a minute
    with serve(stalled) as sim:
        plan = ConstantPlan(50.0, 2.0)
        test = LoadTest(target=Target(sim.base_url), plan=plan, mix=_mix(), drain_timeout=0.3, window=0.5)
        report = test.run()
        arrived = sim.stats()["requests"]
    assert report["totals"]["planned"] == 100
    assert report["totals"]["sent"] == 100 and arrived == 100  # nothing held back by the 100 requests in flight
    lags = sorted(r.sent - r.planned for r in test.results)
    # Every request left without waiting for an answer: a closed loop would have sent the later ones
    # a minute late, after the first answers. (How close to its schedule it sends is the machine's
    # speed: bench/loadgen.py measures it; this bound is half the stall, whatever the machine.)
    assert lags[0] >= 0 and lags[-1] < 30.0, lags[-5:]
    # sent evenly, 25 per half second, although not one answer came back
    assert [w["offered_qps"] for w in report["timeline"][:4]] == [50.0] * 4
    assert report["totals"]["unfinished"] == 100 and report["totals"]["ok"] == 0
    assert all(r.end is None for r in test.results)


def test_every_request_is_a_trace_tagged_with_the_run_and_step():
    exporter = td.InMemoryExporter()
    tracer = td.Tracer(exporter=exporter, service="loadtest")
    with serve(SimulatorConfig.instant(decode_ms_per_token=1.0)) as sim:
        test = LoadTest(target=Target(sim.base_url), plan=StepPlan(20.0, 0.5, max_steps=2), mix=_mix(),
                        tracer=tracer, run_id="run-abc")
        report = test.run()
    records = exporter.records()
    roots = [r for r in records if r["parent_span_id"] is None]
    calls = [r for r in records if r["parent_span_id"] is not None]
    assert len(roots) == len(calls) == report["totals"]["planned"] == 5 + 7
    assert {r["attributes"]["loadtest.run_id"] for r in records} == {"run-abc"}
    assert sorted({r["attributes"]["loadtest.step"] for r in roots}) == [0, 1]
    by_id = {r["span_id"]: r for r in roots}
    for call in calls:
        assert call["phase"] == "inference" and call["model"] == "sim-gpt"
        assert call["output_tokens"] == TOKENS and call["input_tokens"] > 0
        assert call["ttft_ms"] is not None and 0 < call["ttft_ms"] < 1000
        assert call["trace_id"] == by_id[call["parent_span_id"]]["trace_id"]


def test_errors_are_counted_not_raised():
    with serve(SimulatorConfig.instant(error_rate=1.0, error_mix={503: 1.0})) as sim:
        report = LoadTest(target=Target(sim.base_url), plan=ConstantPlan(20.0, 0.5), mix=_mix()).run()
    totals = report["totals"]
    assert totals["errors"] == totals["planned"] == 10 and totals["error_rate"] == 1.0
    assert any(kind.startswith("HTTP 503") for kind in totals["errors_by_kind"])


def test_an_unreachable_target_is_reported_as_errors(closed_port_url):
    report = LoadTest(target=Target(closed_port_url + "/v1"), plan=ConstantPlan(10.0, 0.3), mix=_mix()).run()
    assert report["totals"]["errors"] == report["totals"]["planned"] == 3
    assert "ConnectionRefusedError" in next(iter(report["totals"]["errors_by_kind"]))


def test_uniform_arrivals_follow_the_rate_across_a_ramp():
    clock = ArrivalClock("uniform")
    a = Segment(0, "base", "baseline", 1.0, 10.0)
    b = Segment(1, "ramp", "ramp", 2.0, 10.0, 30.0)
    b.start = 1.0
    first = list(clock.times(a))
    second = list(clock.times(b))
    assert first[0] == 0.0 and len(first) == 10
    assert len(second) == 40  # integral of a 10 -> 30 qps ramp over 2 s
    gaps = [y - x for x, y in zip(second, second[1:])]
    assert gaps[0] > gaps[-1]  # closer together as the rate rises
    poisson = list(ArrivalClock("poisson", seed=1).times(Segment(0, "p", "constant", 100.0, 20.0)))
    assert 1800 < len(poisson) < 2200


def test_mixed_scenario_files_json_and_toml(tmp_path):
    spec = {"qps": 40, "duration": 1.5, "scenarios": [
        {"name": "short chat", "weight": 3, "models": ["sim-gpt"], "turns": 1, "prompt_chars": 100, "max_tokens": 5},
        {"name": "long conversation", "weight": 1, "models": ["sim-gpt", "sim-large"], "turns": 6,
         "prompt_chars": 400, "max_tokens": 40, "system": "Be brief."}]}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(spec))
    toml = tmp_path / "mix.toml"
    toml.write_text('qps = 40\n[[scenarios]]\nname = "a"\nmodel = "sim-gpt"\nmax_tokens = 3\n'
                    '[[scenarios]]\nname = "b"\nweight = 2\nmodels = ["x", "y"]\nturns = 3\n')
    assert [s.name for s in load_scenario_file(str(toml))["mix"].scenarios] == ["a", "b"]
    loaded = load_scenario_file(str(path))
    with serve(SimulatorConfig.instant(decode_ms_per_token=0.5, models={"sim-large": {}})) as sim:
        report = LoadTest(target=Target(sim.base_url), plan=ConstantPlan(loaded["qps"], loaded["duration"], "mixed"),
                          mix=loaded["mix"], seed=3).run()
    scenarios = report["groups"]["scenario"]
    assert scenarios["short chat"]["planned"] + scenarios["long conversation"]["planned"] == 60
    assert scenarios["short chat"]["planned"] > scenarios["long conversation"]["planned"]
    assert set(report["groups"]["model"]) == {"sim-gpt", "sim-large"}
    assert scenarios["short chat"]["output_tokens"] == 5 * scenarios["short chat"]["ok"]
    assert report["totals"]["errors"] == 0

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"scenarios": [{"name": "x", "model": "m", "turns": 0}]}))
    with pytest.raises(ScenarioError, match=r"scenarios\[0\].*'turns' must be an integer >= 1"):
        load_scenario_file(str(bad))
    bad.write_text(json.dumps({"scenarios": [{"name": "x", "model": "m", "colour": "red"}]}))
    with pytest.raises(ScenarioError, match="unknown keys colour"):
        load_scenario_file(str(bad))


def test_knee_rule_reasons():
    def step(i, offered, achieved, p95, err=0.0):
        return {"index": i, "label": f"s{i}", "offered_qps": offered, "achieved_rps": achieved,
                "e2e_ms": {"p95": p95}, "error_rate": err}

    rule = KneeRule()
    assert rule.find([step(0, 50, 50, 100), step(1, 70, 70, 110)]) is None
    knee = rule.find([step(0, 50, 50, 100), step(1, 70, 70, 110), step(2, 90, 71, 120)])
    assert knee["step"] == 2 and knee["capacity_rps"] == 71 and "achieved" in knee["reasons"][0]
    assert "P95" in rule.find([step(0, 50, 50, 100), step(1, 70, 70, 250)])["reasons"][0]
    assert "error rate" in rule.find([step(0, 50, 50, 100), step(1, 70, 70, 100, err=0.2)])["reasons"][0]


def test_console_script_writes_the_report_and_prints_a_table(tmp_path):
    with serve(SimulatorConfig.instant()) as sim:
        out = tmp_path / "report.json"
        done = subprocess.run([sys.executable, "-m", "tracedash_sdk.loadtest", "--target", sim.base_url, "--qps", "20",
                               "--duration", "0.5", "--json", str(out), "--no-trace"],
                              cwd=tmp_path, env={"PYTHONPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["totals"]["ok"] == 10 and report["test_type"] == "concurrency"
    assert "offered" in done.stdout and "20 qps" in done.stdout
    assert "sent 10" in done.stderr  # the final progress line
    bad = subprocess.run([sys.executable, "-m", "tracedash_sdk.loadtest", "--target", "ftp://x", "--qps", "1"],
                         cwd=tmp_path, env={"PYTHONPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=180)
    assert bad.returncode == 2 and "target must be an http(s) URL" in bad.stderr


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 20.0), st.floats(0.0, 500.0), st.floats(0.0, 500.0)), min_size=1, max_size=6))
def test_uniform_schedule_is_sorted_and_matches_the_planned_rate(parts):
    clock = ArrivalClock("uniform")
    start, times, expected = 0.0, [], 0.0
    for i, (duration, q0, q1) in enumerate(parts):
        seg = Segment(i, f"s{i}", "step", duration, q0, q1)
        seg.start = start
        got = list(clock.times(seg))
        assert all(seg.start <= t < seg.end + 1e-9 for t in got)
        times += got
        start = seg.end
        expected += duration * (q0 + q1) / 2
    assert times == sorted(times)
    # one arrival at 0, then one per unit of the integral of the rate: never drifts from the plan
    assert abs(len(times) - (1 + expected)) <= 1.0 + 1e-6 * expected


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=200), st.sampled_from([50, 90, 95, 99]))
def test_percentile_is_numpy_linear(values, p):
    data = sorted(values)
    expected = statistics.quantiles(data, n=100, method="inclusive")[p - 1] if len(data) > 1 else data[0]
    assert percentile(data, p) == pytest.approx(expected, rel=1e-9, abs=1e-6)
