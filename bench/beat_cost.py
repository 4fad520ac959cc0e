"""What the beat's analytics cost per span at a steady ingest rate, in CPU, without HTTP.

    .venv/bin/python bench/beat_cost.py [--rate 8000] [--duration 20] [--rounds 2] [--configs store,summaries,beat]

``bench/ingest.py --compare-beat`` shows the beat's cost as lost throughput of a closed-loop load,
which this 2-core shared machine makes noisy (±20 % from one run to the next). This benchmark holds
the load fixed instead and reads CPU: spans from ``bench/load_spans.py``'s generator (whole traces,
~8.5 spans each, start times at their arrival) are inserted at ``--rate`` spans/s in batches of
``--batch`` rows, by a feeder thread on the schedule of an open-loop client, for ``--duration``
seconds, while the process runs, in threads of their own as the embedded beat does:

- ``store``: nothing else (the insert and the merges it causes: the ingestion path's store share);
- ``summaries``: the summariser every ``TRACEDASH_SUMMARIZE_SECONDS`` (``analytics.summarizer.traces_summarize``);
- ``beat``: the summariser and the rollups every ``TRACEDASH_ROLLUP_SECONDS`` (``rollup_services.rollups_update``).

Each configuration runs in a child process of its own (a fresh chdb data dir and SQLite database);
CPU is the child's, every chdb thread included, from the first insert until ``--tail`` seconds
after the last (the last summariser and rollup runs and the merges then). Configurations alternate
over ``--rounds`` rounds; the report gives each one's CPU ms per 1,000 spans (median over rounds),
the difference to ``store`` (the analytics' own cost per 1,000 spans) and its ratio to the store's
cost — the issue's "summaries and rollups at a tenth of ingestion's cost" — and checks that every
trace was summarised.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS = ("store", "summaries", "beat")
PROJECT_ID = 1


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the child: one configuration -----------------------------------------------------------------
def child(args) -> dict:
    from bench.common import process_cpu_seconds

    os.environ["TRACEDASH_DATA_DIR"] = str(Path(args.work) / "settings")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)  # the summariser reads the project's price table
    from bench import load_spans
    from store import set_store

    store = load_spans.open_store(Path(args.work) / "store")
    set_store(store)
    from analytics import rollup_services, summarizer

    if args.preload:
        # The hour before the run, with its summaries, as a server that has been taking traffic has
        # it: what grows with the table shows against the same load on an empty one.
        load_spans.load(store=store, spans_wanted=args.preload, days=1 / 24, batch=10_000, seed=args.seed + 1,
                        now_ns=time.time_ns() - 60 * 1_000_000_000)
        store.command("OPTIMIZE TABLE traces FINAL", tag="bench.beat_cost.preload")
        summarizer.watermark_set(project_id=PROJECT_ID, job=summarizer.JOB,
                                 value=summarizer._clock_ns() // 1_000_000)  # those are summarised already
    tag_ms: dict[str, float] = {}  # wall time of the store calls per tag (where a run spends its time)
    timed = store._timed

    def timed_by_tag(kind, tag, started):
        tag_ms[tag] = tag_ms.get(tag, 0.0) + (time.perf_counter() - started) * 1000
        timed(kind, tag, started)

    store._timed = timed_by_tag

    total = int(args.rate * args.duration)
    t0 = time.time_ns() + 2_000_000_000  # the schedule starts once every span is generated (below)
    gen = load_spans.Generator(seed=args.seed, start_ns=t0, end_ns=t0 + int(args.duration * 1e9),
                               traces=max(1, total // 8), project_id=PROJECT_ID)
    batches = load_spans.arrival_batches(gen, total, args.batch)
    trace_ids = {row["trace_id"] for batch in batches for row in batch}

    stop = threading.Event()
    runs = {"summaries": [], "rollups": []}
    errors: list[str] = []

    def periodic(name: str, every: float, fn) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - reported, fails the run
                errors.append(f"{name}: {exc!r}")
            runs[name].append(time.perf_counter() - started)
            stop.wait(max(0.0, every - (time.perf_counter() - started)))

    threads = []
    if args.config in ("summaries", "beat"):
        threads.append(threading.Thread(target=periodic, daemon=True, args=(
            "summaries", float(settings.TRACEDASH_SUMMARIZE_SECONDS),
            lambda: summarizer.traces_summarize(project_ids=[PROJECT_ID]))))
    if args.config == "beat":
        threads.append(threading.Thread(target=periodic, daemon=True, args=(
            "rollups", float(settings.TRACEDASH_ROLLUP_SECONDS),
            lambda: rollup_services.rollups_update(project_ids=[PROJECT_ID]))))

    while time.time_ns() < t0:
        time.sleep(0.01)
    cpu0, wall0 = process_cpu_seconds(), time.monotonic()
    for thread in threads:
        thread.start()
    behind = 0.0
    interval = args.batch / args.rate
    for i, batch in enumerate(batches):
        due = wall0 + i * interval
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
        store.insert("spans", batch, tag="bench.beat_cost.spans")
    fed = time.monotonic()
    time.sleep(args.tail)
    stop.set()
    for thread in threads:
        thread.join()
    cpu = process_cpu_seconds() - cpu0
    wall = time.monotonic() - wall0
    summarised = None
    if args.config != "store":
        summarised = int(store.query(
            "SELECT uniqExact(trace_id) FROM traces WHERE project_id = {p:UInt64} AND trace_id IN (SELECT trace_id FROM spans"
            " WHERE project_id = {p:UInt64} AND start_time >= fromUnixTimestamp64Nano({t0:Int64}))",
            {"p": PROJECT_ID, "t0": t0}, tag="bench.beat_cost.check").scalar())
    caches = {r[0]: int(r[1]) for r in store.query(
        "SELECT metric, value FROM system.metrics WHERE metric IN ('MarkCacheBytes', 'PrimaryIndexCacheBytes',"
        " 'IndexMarkCacheBytes', 'UncompressedCacheBytes', 'QueryConditionCacheBytes', 'MemoryTracking')",
        tag="bench.beat_cost.caches").rows}
    import resource

    store.close()
    return {"caches_mib": {k: round(v / 2**20, 1) for k, v in caches.items()},
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),"config": args.config, "spans": total, "traces": len(trace_ids), "summarised": summarised,
            "cpu_s": cpu, "wall_s": wall, "feed_s": fed - wall0, "max_behind_s": behind,
            "cpu_ms_per_1k": cpu * 1e6 / total,
            "summary_runs": len(runs["summaries"]), "summary_run_s": statistics.median(runs["summaries"]) if runs["summaries"] else None,
            "rollup_runs": len(runs["rollups"]), "rollup_run_s": statistics.median(runs["rollups"]) if runs["rollups"] else None,
            "tag_ms": {t: round(ms, 1) for t, ms in sorted(tag_ms.items(), key=lambda kv: -kv[1])}, "errors": errors}


# --- the parent: alternate the configurations, report ----------------------------------------------
def run_config(args, config: str, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TRACEDASH_CLICKHOUSE_URL",
                                                            "CELERY_BROKER_URL", "TRACEDASH_CHANNEL_LAYER_URL")}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--work", str(work),
           "--rate", str(args.rate), "--duration", str(args.duration), "--batch", str(args.batch),
           "--tail", str(args.tail), "--seed", str(args.seed), "--preload", str(args.preload)]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.duration * 10 + 300)
    if out.returncode != 0:
        raise SystemExit(f"{config} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(results: dict[str, list[dict]], args) -> str:
    med = {c: statistics.median(r["cpu_ms_per_1k"] for r in rs) for c, rs in results.items()}
    base = med.get("store")
    lines = [f"beat cost at {args.rate:,} spans/s for {args.duration:g} s (batches of {args.batch:,}, "
             f"{args.rounds} round(s), tail {args.tail:g} s, {args.preload:,} spans loaded before)", "",
             "config    | CPU ms / 1k spans (rounds)        | median | over store | / store | summary run s | rollup run s | summarised",
             "----------+-----------------------------------+--------+------------+---------+---------------+--------------+-----------"]
    for config, rs in results.items():
        each = ", ".join(f"{r['cpu_ms_per_1k']:.1f}" for r in rs)
        over = med[config] - base if base is not None else None
        ratio = over / base if base else None
        sr = [r["summary_run_s"] for r in rs if r["summary_run_s"] is not None]
        rr = [r["rollup_run_s"] for r in rs if r["rollup_run_s"] is not None]
        summarised = "—" if rs[0]["summarised"] is None else ", ".join(f"{r['summarised']:,}/{r['traces']:,}" for r in rs)
        lines.append(f"{config:9s} | {each:33s} | {med[config]:6.1f} | "
                     f"{'—' if over is None or config == 'store' else f'{over:+.1f}':>10s} | "
                     f"{'—' if ratio is None or config == 'store' else f'{ratio:.2f}':>7s} | "
                     f"{(f'{statistics.median(sr):.2f}' if sr else '—'):>13s} | {(f'{statistics.median(rr):.2f}' if rr else '—'):>12s} | {summarised}")
    for config, rs in results.items():
        if config == "store":
            continue
        tags = sorted({t for r in rs for t in r["tag_ms"] if not t.startswith("bench.")},
                      key=lambda t: -statistics.median(r["tag_ms"].get(t, 0.0) for r in rs))
        lines += ["", f"{config}: wall time of its store calls over the run, median ms by tag: "
                  + ", ".join(f"{t.rsplit('.', 1)[-1]} {statistics.median(r['tag_ms'].get(t, 0.0) for r in rs):,.0f}"
                              for t in tags[:8])]
    behind = max(r["max_behind_s"] for rs in results.values() for r in rs)
    lines += ["", f"feeder at most {behind:.2f} s behind its schedule (a figure over a second means the rate was not held)"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=8000, help="spans/s inserted (default 8000)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per run (default 20)")
    parser.add_argument("--batch", type=int, default=1000, help="rows per insert (default 1000)")
    parser.add_argument("--tail", type=float, default=5.0, help="seconds measured after the last insert (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the configurations (default 2)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated: store, summaries, beat")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--preload", type=int, default=0,
                        help="spans (with their summaries) of the hour before, loaded first (default 0: an empty store)")
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--data-dir", help="where to make the temporary data dirs")
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.config = args.child
        print(json.dumps(child(args)), flush=True)
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or any(c not in CONFIGS for c in configs) or args.rate <= 0 or args.duration <= 0 or args.rounds < 1:
        parser.error(f"--configs from {', '.join(CONFIGS)}; --rate, --duration, --rounds positive")
    results: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="tracedash-bench-beat-", dir=args.data_dir) as tmp:
        n = 0
        for round_no in range(args.rounds):
            for config in configs:
                n += 1
                log(f"[{n}/{args.rounds * len(configs)}] round {round_no + 1}: {config} "
                    f"({args.rate:,} spans/s for {args.duration:g} s)…")
                r = run_config(args, config, Path(tmp) / f"{config}-{round_no}")
                if r["errors"]:
                    raise SystemExit(f"{config}: {r['errors'][:3]}")
                if r["summarised"] is not None and r["summarised"] != r["traces"]:
                    raise SystemExit(f"{config}: {r['summarised']} of {r['traces']} traces summarised")
                log(f"      {r['cpu_ms_per_1k']:.1f} ms CPU / 1k spans, {r['summary_runs']} summariser runs, "
                    f"{r['rollup_runs']} rollup runs; max RSS {r['max_rss_mib']:,.0f} MiB, chdb memory (MiB) {r['caches_mib']}")
                results[config].append(r)
    text = report(results, args)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
