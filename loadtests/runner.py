"""Runs a load test started from the page, in the background (a thread of the embedded server, or
a Celery worker): builds it from the run's stored options, starts the built-in simulator when that
is the target, traces every request with the project's "load tests" key, writes progress about
once a second, and stores the report (or the failure) on the run."""

from __future__ import annotations

import argparse
import logging
import threading
import time

from django.db import close_old_connections, connection

from .models import LoadTestRun
from .services import load_test_key_ensure, load_test_run_fail, load_test_run_finish, load_test_run_progress
from .engine_watch import EngineWatch, metrics_url, watch_report
from .simulator import DEFAULT_SIMULATOR, simulator_start, simulator_stop

log = logging.getLogger("tracedash.loadtests")
PROGRESS_INTERVAL_S = 1.0
TOKENS = 20


def plan_options(options: dict) -> dict:
    """The generator's options for the page's few fields: ``duration`` is the whole test's length.

    step: 10 steps of duration / 10 s (the test stops at the knee); burst: 20 % at the baseline,
    a rise of at most 10 s (DOMAIN.md), 20 % at the peak, the rest back at the baseline."""
    duration = float(options["duration"])
    out = {"test_type": options["test_type"], "qps": float(options["qps"]), "duration": duration}
    if options["test_type"] == "step":
        out.update(step_duration=duration / 10, max_steps=10)
    elif options["test_type"] == "burst":
        ramp = min(10.0, 0.1 * duration)
        out.update(baseline_duration=0.2 * duration, ramp=ramp, hold=0.2 * duration,
                   recover_duration=duration - 0.4 * duration - ramp)
    return out


def _namespace(options: dict, target: str, target_api_key: str | None) -> argparse.Namespace:
    from tracedash_sdk.loadtest import add_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser, target_required=False)
    ns = parser.parse_args([])
    for key, value in plan_options(options).items():
        setattr(ns, key, value)
    ns.target, ns.target_api_key = target, target_api_key
    ns.model = options.get("model") or None
    ns.max_tokens = TOKENS
    ns.timeout = 60.0
    ns.drain_timeout = 30.0
    return ns


class _LatestLine:
    """The generator's progress output: only its latest line is kept (written to the run by the
    reporter thread: the generator's event loop must not wait for the database)."""

    def __init__(self):
        self.line = ""

    def write(self, text: str) -> int:
        text = text.strip()
        if text:
            self.line = text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _report_progress(run_pk: int, test, sink: _LatestLine, planned_s: float, started: float,
                     done: threading.Event) -> None:
    try:
        while True:
            finished = done.wait(PROGRESS_INTERVAL_S)
            load_test_run_progress(run_pk=run_pk, progress={
                "elapsed_s": round(time.monotonic() - started, 1), "planned_s": planned_s,
                "sent": len(test.results), "done": test._done, "errors": test._errors,
                "in_flight": len(test._tasks), "line": sink.line})
            if finished:  # that was the final count, written before the report
                break
    finally:
        connection.close()


def load_test_execute(*, run_pk: int, trace_endpoint: str | None, target_api_key: str | None = None) -> None:
    """Run the stored run ``run_pk`` to its end. Never raises: a failure is recorded on the run."""
    from tracedash_sdk import Tracer
    from tracedash_sdk.loadtest import build_load_test

    run = LoadTestRun.objects.select_related("project").get(pk=run_pk)
    options = run.config
    simulator = tracer = watch = None
    try:
        target = run.target_url
        if options.get("target") == "simulator":
            simulator, target = simulator_start(DEFAULT_SIMULATOR)
        key = load_test_key_ensure(project=run.project) if trace_endpoint else None
        if trace_endpoint:
            tracer = Tracer(endpoint=trace_endpoint, api_key=key, service="loadtest", max_queue_spans=200_000,
                            max_batch_spans=2_000)
        if simulator is not None:  # its queue and KV cache, beside the requests (Engines page, report)
            watch = EngineWatch(metrics_url(target), endpoint=trace_endpoint, api_key=key)
        sink = _LatestLine()
        test = build_load_test(_namespace(options, target, target_api_key), tracer=tracer, run_id=run.run_id,
                               progress=sink)
        test.progress_interval = PROGRESS_INTERVAL_S
        if simulator is not None:
            from demo.simulator import SimulatorConfig

            rps = SimulatorConfig.from_dict(DEFAULT_SIMULATOR).saturation_rps(output_tokens=TOKENS,
                                                                               prompt_tokens=(200 + 3) // 4)
            test.metadata["simulator"] = {"config": DEFAULT_SIMULATOR, "saturation_rps": round(rps, 3)}
        planned = float(options["duration"])  # at most: a step test stops at its knee
        done = threading.Event()
        reporter = threading.Thread(target=_report_progress, name=f"loadtest-progress-{run_pk}", daemon=True,
                                    args=(run_pk, test, sink, planned, time.monotonic(), done))
        reporter.start()
        if watch is not None:
            watch.start()
        try:
            report = test.run()
        finally:
            done.set()
            reporter.join(30)
            if watch is not None:
                watch.stop()
        report = watch_report(watch, report)
        if tracer is not None:
            tracer.shutdown(timeout=60.0)
            report["config"]["tracing"] = {"service": tracer.service, "endpoint": tracer.exporter.endpoint,
                                           "exporter": dict(tracer.exporter.stats)}
            tracer = None
        load_test_run_finish(run=run, report=report)
    except Exception as exc:  # noqa: BLE001 - recorded on the run: nobody else would see it
        log.exception("load test %s failed", run.run_id)
        load_test_run_fail(run=run, error=f"{type(exc).__name__}: {exc}")
    finally:
        if tracer is not None:
            tracer.shutdown(timeout=10.0)
        if simulator is not None:
            simulator_stop(simulator)


def load_test_execute_in_thread(**kwargs) -> None:
    """``load_test_execute`` as a thread of its own, which then closes its database connection (a
    caller that runs the load test in its own thread keeps its connection open)."""
    close_old_connections()
    try:
        load_test_execute(**kwargs)
    finally:
        connection.close()
