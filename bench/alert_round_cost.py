"""What one alert round costs with a project's default rules over a busy window of traffic.

    .venv/bin/python bench/alert_round_cost.py [--rate 12500] [--seconds 300] [--rounds 6]

A fresh embedded store (one process, no HTTP) and a project made as users make one (its rules of
thumb installed: ``alerts.services.DEFAULT_RULES``) receive ``--seconds`` of traffic at ``--rate``
spans/s (``bench/load_spans.py``'s traces, summaries written with them, the summariser's watermark
set after them, so a round has nothing left to summarise). Then ``alerts_evaluate_round`` runs
``--rounds`` times, a second apart, and each round's CPU (the process's, every chdb thread
included) and wall are printed, with what that CPU would cost per 1,000 spans at that rate when a
round runs every ``TRACEDASH_ALERTS_EVALUATE_SECONDS`` (default 5 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import load_spans  # noqa: E402
from bench.common import cpu_by_store_call, machine, process_cpu_seconds, table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=12_500, help="spans/s of the traffic loaded (default 12,500)")
    parser.add_argument("--seconds", type=int, default=300, help="seconds of traffic before now (default 300: the latency rules' window)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print the N functions with the most cumulative time in the last round (cProfile)")
    args = parser.parse_args(argv)

    load_spans._django()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from store import set_store

    store, _ = load_spans.fresh_batch(10, prefix="tracedash-alert-round-", tag="bench.alert_round_cost.spans")
    set_store(store)
    from alerts import services
    from alerts.models import AlertRule
    from analytics import summarizer
    from projects.services import project_create

    project, _ = project_create(name="alert-round-cost")
    rules = list(AlertRule.objects.filter(project=project, enabled=True).values_list("metric", "window_seconds"))
    load_spans.load(store=store, spans_wanted=args.rate * args.seconds, days=args.seconds / 86400, batch=10_000,
                    seed=3, now_ns=time.time_ns(), project_id=project.pk)
    summarizer.watermark_set(project_id=project.pk, job=summarizer.JOB, value=summarizer._clock_ns() // 1_000_000)
    traces = int(store.query("SELECT count() FROM traces", tag="bench.alert_round_cost.count").scalar())
    by_call, _ = cpu_by_store_call(store)
    cpu, wall = [], []
    for i in range(args.rounds):
        c0, w0 = process_cpu_seconds(), time.perf_counter()
        report = services.alerts_evaluate_round(deliver="none")
        cpu.append((process_cpu_seconds() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
        print(f"round {i + 1}/{args.rounds}: {cpu[-1]:,.0f} ms CPU, {wall[-1]:,.0f} ms wall, {report.rules} rules, "
              f"{report.queries} queries", file=sys.stderr, flush=True)
        time.sleep(1)
    by_call = dict(by_call)  # the measured rounds' only
    profiler = None
    if args.profile:  # one more round, outside the figures (the profiler slows what it watches)
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(services.alerts_evaluate_round, deliver="none")
    store.close()
    every = float(settings.CELERY_BEAT_SCHEDULE["alerts-evaluate"]["schedule"])
    median = statistics.median(cpu)
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"{len(rules)} enabled rules ({', '.join(f'{m} {w} s' for m, w in rules)}); {args.seconds} s of traffic at "
          f"{args.rate:,} spans/s: {args.rate * args.seconds:,} spans, {traces:,} traces")
    print(f"alert round: CPU median {median:,.0f} ms (min {min(cpu):,.0f}, max {max(cpu):,.0f}), wall median "
          f"{statistics.median(wall):,.0f} ms")
    print(f"one round every {every:g} s at {args.rate:,} spans/s: {median / every:,.0f} ms of CPU a second, "
          f"{median / every / args.rate * 1000:.1f} ms per 1,000 spans")
    print(table(["part (store call tag)", "ms of CPU a round"],
                [[tag, f"{seconds * 1000 / args.rounds:,.1f}"]
                 for tag, seconds in sorted(by_call.items(), key=lambda kv: -kv[1]) if not tag.startswith("bench.")]))
    print(f"outside store calls: {median - sum(by_call.values()) * 1000 / args.rounds:,.0f} ms a round "
          "(Python: the metadata database, the rules, the state machine)")
    if profiler is not None:
        import pstats

        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
