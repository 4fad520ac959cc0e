"""``tracedash-loadtest`` (and the shared options of ``manage.py loadtest``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from ._http import Target
from ._plan import ARRIVALS, BurstPlan, ConstantPlan, Plan, StepPlan
from ._report import KneeRule, format_table
from ._runner import LoadTest, default_tracer, new_run_id
from ._scenario import RequestMix, ScenarioError, load_scenario_file

TEST_TYPES = ("concurrency", "step", "burst", "mixed")


def add_arguments(parser: argparse.ArgumentParser, *, target_required: bool = True) -> None:
    """The load test options, shared by the console script and the manage command."""
    g = parser.add_argument_group("target")
    g.add_argument("--target", required=target_required, default=os.environ.get("LOADTEST_TARGET"),
                   metavar="URL", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8100/v1 [LOADTEST_TARGET]")
    g.add_argument("--target-api-key", default=os.environ.get("LOADTEST_TARGET_API_KEY"), metavar="KEY",
                   help="bearer key for the target [LOADTEST_TARGET_API_KEY]")
    g.add_argument("--model", default=None, help="model to ask for (default: sim-gpt, the simulator's)")
    g.add_argument("--max-tokens", type=int, default=20, help="output tokens per request [20]")
    g.add_argument("--prompt-chars", type=int, default=200, help="prompt length in characters [200]")
    g.add_argument("--no-stream", action="store_true", help="ask for non-streamed answers (no TTFT/TPOT)")
    g.add_argument("--scenario", metavar="FILE", help="scenario file (JSON or TOML) for --test-type mixed")

    g = parser.add_argument_group("load")
    g.add_argument("--test-type", choices=TEST_TYPES, default="concurrency")
    g.add_argument("--qps", type=float, default=None,
                   help="arrival rate; step and burst: the baseline QPS [10; mixed: the scenario file's]")
    g.add_argument("--duration", type=float, default=None, help="concurrency/mixed: seconds [60]")
    g.add_argument("--step-duration", type=float, default=30.0, help="step: seconds per step [30]")
    g.add_argument("--start-fraction", type=float, default=0.5, help="step: first step as a share of --qps [0.5]")
    g.add_argument("--step-fraction", type=float, default=0.2, help="step: added per step, share of --qps [0.2]")
    g.add_argument("--max-steps", type=int, default=20, help="step: stop after this many steps [20]")
    g.add_argument("--baseline-duration", type=float, default=30.0, help="burst: seconds at the baseline first [30]")
    g.add_argument("--ramp", type=float, default=10.0, help="burst: seconds to rise to the peak [10]")
    g.add_argument("--hold", type=float, default=30.0, help="burst: seconds at the peak [30]")
    g.add_argument("--recover-duration", type=float, default=60.0, help="burst: seconds back at the baseline [60]")
    g.add_argument("--burst-factor", type=float, default=3.0, help="burst: peak / baseline [3]")
    g.add_argument("--arrivals", choices=ARRIVALS, default="uniform",
                   help="uniform: evenly spaced; poisson: random (exponential gaps) [uniform]")
    g.add_argument("--seed", type=int, default=None, help="random seed (poisson arrivals, scenario picks)")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds per request before it counts as an error [60]")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to wait for running requests after the last arrival [30]")
    g.add_argument("--window", type=float, default=1.0, help="seconds per timeline window (recovery, charts) [1]")
    g.add_argument("--connections", type=int, default=0, help="keep-alive connections to open before the start [0]")

    g = parser.add_argument_group("knee (step test)")
    g.add_argument("--p95-limit-ms", type=float, default=None,
                   help="P95 above which a step is past the knee [--p95-factor x the first step's P95]")
    g.add_argument("--p95-factor", type=float, default=2.0, help="[2]")
    g.add_argument("--max-error-rate", type=float, default=0.05, help="error rate above which a step is past the knee [0.05]")
    g.add_argument("--lag-tolerance", type=float, default=0.05,
                   help="a step whose achieved RPS is below (1 - this) x offered is past the knee [0.05]")

    g = parser.add_argument_group("tracing and output")
    g.add_argument("--tracedash-endpoint", default=None, metavar="URL",
                   help="tracedash server to send every request's trace to [TRACEDASH_ENDPOINT]")
    g.add_argument("--tracedash-api-key", default=None, metavar="KEY", help="its project ingest key [TRACEDASH_API_KEY]")
    g.add_argument("--service", default="loadtest", help="service name of the traces [loadtest]")
    g.add_argument("--no-trace", action="store_true", help="do not send traces")
    g.add_argument("--json", dest="json_path", metavar="PATH", default=None,
                   help="write the report here [loadtest-<run id>.json]")
    g.add_argument("--quiet", action="store_true", help="no progress line")


def build_load_test(args: argparse.Namespace, *, tracer: Any = None, run_id: Optional[str] = None,
                    progress: Any = None, default_model: str = "sim-gpt") -> LoadTest:
    """A :class:`LoadTest` from parsed options; raises ValueError (ScenarioError) with a clear message."""
    model = args.model or default_model
    qps, duration = args.qps, args.duration
    if args.test_type == "mixed":
        if not args.scenario:
            raise ValueError("--test-type mixed needs --scenario FILE")
        loaded = load_scenario_file(args.scenario, default_model=model)
        mix: RequestMix = loaded["mix"]
        qps = qps if qps is not None else loaded["qps"]
        duration = duration if duration is not None else loaded["duration"]
    else:
        if args.scenario:
            raise ValueError("--scenario is for --test-type mixed")
        if args.max_tokens < 1 or args.prompt_chars < 1:
            raise ValueError("--max-tokens and --prompt-chars must be at least 1")
        mix = RequestMix.single(model=model, max_tokens=args.max_tokens, prompt_chars=args.prompt_chars,
                                stream=not args.no_stream)
    mix._rng.seed(args.seed)
    qps = 10.0 if qps is None else qps
    duration = 60.0 if duration is None else duration
    if qps <= 0:
        raise ValueError("--qps must be > 0")
    plan: Plan
    if args.test_type in ("concurrency", "mixed"):
        plan = ConstantPlan(qps, duration, test_type=args.test_type)
    elif args.test_type == "step":
        plan = StepPlan(qps, args.step_duration, start_fraction=args.start_fraction, step_fraction=args.step_fraction,
                        max_steps=args.max_steps)
    else:
        plan = BurstPlan(qps, baseline_s=args.baseline_duration, ramp_s=args.ramp, hold_s=args.hold,
                         recover_s=args.recover_duration, factor=args.burst_factor)
    rule = KneeRule(lag_tolerance=args.lag_tolerance, p95_factor=args.p95_factor, p95_limit_ms=args.p95_limit_ms,
                    max_error_rate=args.max_error_rate)
    return LoadTest(target=Target(args.target, args.target_api_key), plan=plan, mix=mix, run_id=run_id,
                    tracer=tracer, timeout=args.timeout, drain_timeout=args.drain_timeout, window=args.window,
                    knee_rule=rule, arrivals=args.arrivals, seed=args.seed, progress=progress,
                    warm_connections=args.connections)


def write_report(report: Dict[str, Any], path: Optional[str]) -> str:
    path = path or f"loadtest-{report['run_id']}.json"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    return path


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tracedash-loadtest",
        description="Open-loop load test of an OpenAI-compatible chat endpoint (step, burst, constant or mixed "
                    "load), every request traced into tracedash. See docs/loadtest.md.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    run_id = new_run_id()
    tracer = None
    if not args.no_trace:
        tracer = default_tracer(endpoint=args.tracedash_endpoint, api_key=args.tracedash_api_key, service=args.service)
    try:
        test = build_load_test(args, tracer=tracer, run_id=run_id, progress=None if args.quiet else sys.stderr)
    except (ValueError, ScenarioError) as exc:
        parser.exit(2, f"tracedash-loadtest: error: {exc}\n")
    print(f"Load test {run_id}: {args.test_type} against {test.target.base_url}"
          + (f", traced to {tracer.exporter.endpoint}" if tracer is not None else " (not traced)"), file=sys.stderr)
    try:
        report = test.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if tracer is not None:
            tracer.shutdown(timeout=30.0)
    if tracer is not None:
        report["config"]["tracing"] = {"service": tracer.service, "exporter": dict(tracer.exporter.stats)}
    path = write_report(report, args.json_path)
    print(format_table(report))
    print(f"Report: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
