"""``python manage.py loadtest``: run an open-loop load test (tracedash_sdk.loadtest), trace every
request into the local server, store the run and its report, print the table and the page's URL.

Without ``--target`` it starts the demo simulator in a separate process (so it does not share the
generator's GIL) with a known saturation point, and tests that."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from projects.models import Project

from loadtests.engine_watch import EngineWatch, metrics_url, watch_report
from loadtests.simulator import DEFAULT_SIMULATOR, SimulatorError, simulator_start, simulator_stop


# Secrets and Django's own options are not stored with the run.
_NOT_STORED = {"tracedash_api_key", "target_api_key", "verbosity", "settings", "pythonpath", "traceback", "no_color",
               "force_color", "skip_checks"}


class Command(BaseCommand):
    help = ("Open-loop load test of an OpenAI-compatible chat endpoint (the demo simulator by default): "
            "concurrency, step (finds the knee), burst (measures recovery) or mixed. Every request is traced "
            "into this server; the report is stored and shown at /loadtests/<id>/.")

    def add_arguments(self, parser):
        from tracedash_sdk.loadtest import add_arguments

        add_arguments(parser, target_required=False)
        parser.add_argument("--project", default=None,
                            help="project that owns the run and receives the traces [the first project]")

    def handle(self, *args, **options):
        import argparse

        from tracedash_sdk import Tracer
        from tracedash_sdk.loadtest import build_load_test, format_table, new_run_id, write_report

        from loadtests.services import load_test_run_create, load_test_run_fail, load_test_run_finish

        ns = argparse.Namespace(**options)
        project = self._project(ns.project)
        base = self._server_url()
        simulator = None
        sim_config = None
        if not ns.target:
            sim_config = dict(DEFAULT_SIMULATOR)
            simulator, ns.target = self._start_simulator(sim_config)
        run_id = new_run_id()
        tracer = None
        endpoint = ns.tracedash_endpoint or os.environ.get("TRACEDASH_ENDPOINT") or base
        if not ns.no_trace and not _reachable(endpoint):
            self.stderr.write(self.style.WARNING(
                f"No tracedash server answers at {endpoint}: the requests will not be traced (start `make run`, "
                "or pass --tracedash-endpoint, or --no-trace to silence this)."))
            ns.no_trace = True
        if not ns.no_trace:
            api_key = ns.tracedash_api_key or os.environ.get("TRACEDASH_API_KEY")
            if not api_key:  # the project's one "load tests" key, created by its first run
                from loadtests.services import load_test_key_ensure

                api_key = load_test_key_ensure(project=project)
            tracer = Tracer(endpoint=endpoint, api_key=api_key, service=ns.service, max_queue_spans=200_000,
                            max_batch_spans=2_000)
        try:
            try:
                test = build_load_test(ns, tracer=tracer, run_id=run_id, progress=None if ns.quiet else sys.stderr)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            if sim_config is not None:
                from demo.simulator import SimulatorConfig

                rps = SimulatorConfig.from_dict(sim_config).saturation_rps(
                    output_tokens=ns.max_tokens, prompt_tokens=(ns.prompt_chars + 3) // 4)
                test.metadata["simulator"] = {"config": sim_config, "saturation_rps": round(rps, 3)}
                self.stderr.write(f"Target: the demo simulator at {ns.target} (saturates near {rps:.0f} rps "
                                  f"for {ns.max_tokens}-token answers)")
            run = load_test_run_create(project=project, run_id=run_id, test_type=ns.test_type, target_url=ns.target,
                                       config={k: v for k, v in options.items()
                                               if k not in _NOT_STORED and _jsonable(v)})
            self.stderr.write(f"Load test {run_id} ({ns.test_type}) → {base}/loadtests/{run.pk}/"
                              + (f", traced to {tracer.exporter.endpoint}" if tracer else " (not traced)"))
            watch = None
            if simulator is not None:  # its queue and KV cache, beside the requests (Engines page, report)
                watch = EngineWatch(metrics_url(ns.target), endpoint=None if ns.no_trace else endpoint,
                                    api_key=None if ns.no_trace else api_key)
                watch.start()
            try:
                report = test.run()
            except KeyboardInterrupt:
                load_test_run_fail(run=run, error="interrupted", interrupted=True)
                raise CommandError("interrupted")
            except Exception as exc:  # noqa: BLE001 - recorded on the run, then re-raised
                load_test_run_fail(run=run, error=f"{type(exc).__name__}: {exc}")
                raise
            finally:
                if watch is not None:
                    watch.stop()
            report = watch_report(watch, report)
        finally:
            delivered = tracer.shutdown(timeout=60.0) if tracer is not None else True
            if simulator is not None:
                simulator_stop(simulator)
        if tracer is not None:
            stats = dict(tracer.exporter.stats)
            report["config"]["tracing"] = {"service": tracer.service, "endpoint": tracer.exporter.endpoint,
                                           "exporter": stats}
            if not delivered or stats.get("spans_dropped") or stats.get("batches_failed"):
                self.stderr.write(self.style.WARNING(
                    f"Some traces did not reach {tracer.exporter.endpoint} ({stats.get('spans_sent', 0)} spans sent, "
                    f"{stats.get('spans_dropped', 0)} dropped): is the server running?"))
        load_test_run_finish(run=run, report=report)
        path = write_report(report, ns.json_path)
        self.stdout.write(format_table(report))
        self.stdout.write(f"Report: {path}")
        self.stdout.write(f"Page: {base}/loadtests/{run.pk}/")

    def _project(self, name):
        if name:
            project = Project.objects.filter(name=name).first()
            if project is None:
                raise CommandError(f"no project named {name!r}; create it with `manage.py create_project {name}`")
            return project
        project = Project.objects.order_by("pk").first()
        if project is None:
            raise CommandError("no project yet; create one with `manage.py create_project NAME` (or start `make run`)")
        return project

    def _server_url(self) -> str:
        host = settings.ENV.host if settings.ENV.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{settings.ENV.port}"

    def _start_simulator(self, config: dict):
        try:
            return simulator_start(config)
        except SimulatorError as exc:
            raise CommandError(str(exc)) from None


def _reachable(endpoint: str) -> bool:
    """Whether anything answers HTTP at ``endpoint`` (any status: only a refused or timed-out
    connection means the server is not there)."""
    try:
        with urllib.request.urlopen(endpoint.rstrip("/") + "/healthz", timeout=3):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
