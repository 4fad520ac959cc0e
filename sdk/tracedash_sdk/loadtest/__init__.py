"""Open-loop load testing of OpenAI-compatible chat endpoints, every request traced.

    from tracedash_sdk.loadtest import LoadTest, Target, StepPlan, RequestMix
    report = LoadTest(target=Target("http://127.0.0.1:8100/v1"), plan=StepPlan(100, 30),
                      mix=RequestMix.single(model="sim-gpt")).run()

Command line: ``tracedash-loadtest --target URL --test-type step --qps 100`` (``python -m
tracedash_sdk.loadtest``). Standard library only. See docs/loadtest.md.
"""

from ._cli import add_arguments, build_load_test, main, write_report
from ._http import ConnectionPool, HttpError, Target
from ._plan import ArrivalClock, BurstPlan, ConstantPlan, Plan, Segment, StepPlan, planned_segments
from ._report import KneeRule, Result, burst_recovery, format_table, percentile, summarize, timeline
from ._runner import LoadTest, default_tracer, new_run_id
from ._scenario import RequestMix, Scenario, ScenarioError, load_scenario_file, scenarios_from_dict

__all__ = [
    "ArrivalClock", "BurstPlan", "ConnectionPool", "ConstantPlan", "HttpError", "KneeRule", "LoadTest", "Plan",
    "RequestMix", "Result", "Scenario", "ScenarioError", "Segment", "StepPlan", "Target", "add_arguments",
    "build_load_test", "burst_recovery", "default_tracer", "format_table", "load_scenario_file", "main",
    "new_run_id", "percentile", "planned_segments", "scenarios_from_dict", "summarize", "timeline", "write_report",
]
