"""Alert latency and evaluation cost.

    .venv/bin/python bench/alert_latency.py [--trials 20] [--rules 1000] [--series 500] [--rounds 5] [--only latency|rounds]

1. **Crossing → webhook.** A real ``manage.py serve`` (embedded defaults: the beat runs the
   ``alerts-evaluate`` entry in-process at the default 5 s) gets one rule per trial, "GPU memory
   ≥ 85 %" with ``for`` 0 on one host, all sending to one webhook channel with the default timers
   (group_wait 0 s). Each trial waits a random 0–5 s (so crossings fall anywhere in the evaluation
   cycle), posts ONE sample at 90 % over ``/api/v1/resources``, and measures from just before the
   POST (the crossing sample's arrival) until this process's HTTP receiver has the firing webhook
   for that host. Prints p50/p95/max (target: p95 ≤ 10 s).
2. **One evaluation round.** After the server stops, this process opens the same data dir and
   evaluates ``--rules`` rules over ``--series`` series (half GPU rows, half host rows of
   ``series/2`` hosts, one sample every 10 s over the last 5 minutes): rules cycle through the
   five resource metrics, four aggregations and two windows, most scoped to one host, 1 % of them
   project-wide (one series per host or GPU). Prints the first round (creates every series) and
   the median and max of ``--rounds`` steady rounds (target: ≤ 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import PRODUCTION_VARIABLES, Server, machine, percentile  # noqa: E402

GiB = 2**30


def _django(data_dir: Path):
    for name in PRODUCTION_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(TRACEDASH_DATA_DIR=str(data_dir), TRACEDASH_DEMO="0", DJANGO_SETTINGS_MODULE="config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _post(base: str, key: str, samples: list[dict]) -> None:
    request = urllib.request.Request(base + "/api/v1/resources", data=json.dumps({"samples": samples}).encode(),
                                     method="POST", headers={"Content-Type": "application/json",
                                                             "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, response.status


def latency(data_dir: Path, trials: int) -> list[float]:
    from alerts.models import AlertRule
    from alerts.services import channel_create, rule_create
    from projects.services import project_create
    from tests.support.webhook_receiver import WebhookReceiver

    project, key = project_create(name="bench-latency")
    AlertRule.objects.filter(project=project).delete()
    receiver = WebhookReceiver().__enter__()
    channel = channel_create(project=project, name="bench-hook", kind="webhook", url=receiver.url, secret="bench")
    for i in range(trials):
        rule_create(project=project, name=f"GPU memory ≥ 85 % on bench-{i}", metric="gpu_memory_percent",
                    aggregation="last", window_seconds=60, comparator="gte", threshold=85, for_seconds=0,
                    host=f"bench-{i}", channels=[channel])
    server = Server(data_dir).start()
    print(f"server up on {server.base} (evaluation every {os.environ.get('TRACEDASH_ALERTS_EVALUATE_SECONDS', '5')} s); "
          f"{trials} trials", flush=True)
    latencies = []
    try:
        for i in range(trials):
            time.sleep(random.uniform(0, 5))
            host = f"bench-{i}"
            sent = time.time()
            _post(server.base, key, [{"host": host, "gpu_index": 0, "time": time.time_ns(),
                                      "gpu_memory_used": int(0.9 * 80 * GiB), "gpu_memory_total": 80 * GiB}])
            deadline = time.monotonic() + 60
            got = None
            while got is None and time.monotonic() < deadline:
                got = next((r for r in list(receiver.requests)
                            if r.json and r.json["alerts"][0]["labels"].get("host") == host), None)
                time.sleep(0.01)
            if got is None:
                raise SystemExit(f"trial {i}: no webhook within 60 s\n{server.log_tail()}")
            latencies.append(got.at - sent)
            print(f"  trial {i + 1:>2}/{trials}: {latencies[-1]:.2f} s", flush=True)
    finally:
        server.stop()
        receiver.__exit__(None, None, None)
    return latencies


def evaluation_round(rules: int, series: int, rounds: int) -> dict:
    from django.utils import timezone

    from alerts.models import AlertRule, AlertSeries
    from alerts.models import Notification
    from alerts.services import alerts_evaluate_round, channel_create, rule_create
    from projects.services import project_create
    from store import get_store

    from django.core.management import call_command

    call_command("migrate_clickhouse", verbosity=0)  # done already when the latency part ran first
    project, _ = project_create(name="bench-rounds")
    AlertRule.objects.filter(project=project).delete()
    hosts = max(1, series // 2)
    now = timezone.now()
    rows = []
    for second in range(0, 300, 10):
        t = int((now - timedelta(seconds=second)).timestamp() * 1e9)
        for h in range(hosts):
            base = {"project_id": project.pk, "time": t, "host": f"h{h:04d}", "gpu_uuid": "", "gpu_name": "",
                    "gpu_utilization": None, "gpu_memory_used": None, "gpu_memory_total": None, "gpu_temperature": None,
                    "gpu_power_watts": None, "cpu_percent": None, "memory_used": None, "memory_total": None,
                    "process_pids": [], "process_names": [], "process_gpu_memory": []}
            rows.append({**base, "gpu_index": -1, "cpu_percent": random.uniform(5, 95),
                         "memory_used": int(random.uniform(0.2, 0.9) * 64 * GiB), "memory_total": 64 * GiB})
            rows.append({**base, "gpu_index": 0, "gpu_uuid": f"GPU-{h}", "gpu_name": "Bench GPU",
                         "gpu_utilization": random.uniform(0, 100), "gpu_temperature": random.uniform(40, 90),
                         "gpu_memory_used": int(random.uniform(0.3, 0.95) * 80 * GiB), "gpu_memory_total": 80 * GiB})
    for start in range(0, len(rows), 10_000):
        get_store().insert("resource_samples", rows[start:start + 10_000], tag="bench.alerts.samples")
    metrics = ["gpu_memory_percent", "gpu_utilization", "gpu_temperature", "host_cpu_percent", "host_memory_percent"]
    aggregations = ["last", "avg", "max", "min"]
    thresholds = {"gpu_memory_percent": 85, "gpu_utilization": 50, "gpu_temperature": 83, "host_cpu_percent": 70,
                  "host_memory_percent": 90}
    # Every rule notifies a channel, so the round also plans notifications (delivery is not timed:
    # it runs after the round, off the evaluation path).
    channel = channel_create(project=project, name="bench-rounds-hook", kind="webhook", url="http://127.0.0.1:9/")
    for i in range(rules):
        metric = metrics[i % len(metrics)]
        rule_create(project=project, name=f"rule-{i}", channels=[channel], metric=metric, aggregation=aggregations[(i // 5) % 4],
                    window_seconds=60 if i % 2 else 300, comparator="lt" if metric == "gpu_utilization" else "gte",
                    threshold=thresholds[metric], for_seconds=(i % 3) * 30,
                    host="" if i % 100 == 0 else f"h{(i * 7) % hosts:04d}")
    times = []
    first = alerts_evaluate_round(project_ids=[project.pk], deliver="none")
    for _ in range(rounds):
        report = alerts_evaluate_round(project_ids=[project.pk], deliver="none")
        times.append(report.seconds)
    return {"rules": first.rules, "series": AlertSeries.objects.filter(project=project).count(),
            "notifications": Notification.objects.filter(project=project).count(),
            "samples": len(rows), "queries": first.queries, "first_round_s": first.seconds,
            "steady_median_s": statistics.median(times), "steady_max_s": max(times)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="alert latency and evaluation-round cost")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--only", choices=("latency", "rounds"), default=None, help="run one of the two parts")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="tracedash-bench-alerts-")) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    print("machine:", json.dumps(machine()), flush=True)
    _django(data_dir)
    if args.only != "rounds":
        _latency_report(sorted(latency(data_dir, args.trials)))
    if args.only != "latency":
        _rounds_report(args)


def _latency_report(latencies: list[float]) -> None:
    print(f"crossing sample -> webhook (for 0, evaluation every 5 s, {len(latencies)} trials): "
          f"p50 {percentile(latencies, 50):.2f} s, p95 {percentile(latencies, 95):.2f} s, "
          f"max {latencies[-1]:.2f} s (target p95 <= 10 s)", flush=True)


def _rounds_report(args) -> None:
    print(f"evaluating {args.rules} rules over {args.series} series …", flush=True)
    rounds = evaluation_round(args.rules, args.series, args.rounds)
    print(f"evaluation round: {rounds['rules']} rules, {rounds['series']} alert series, {rounds['queries']} queries, "
          f"{rounds['notifications']} notifications planned; "
          f"first round {rounds['first_round_s'] * 1000:.0f} ms, steady median {rounds['steady_median_s'] * 1000:.0f} ms, "
          f"max {rounds['steady_max_s'] * 1000:.0f} ms (target <= 1000 ms)", flush=True)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
