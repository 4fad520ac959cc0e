"""What each entry of the beat costs at a steady ingest rate, against the store's cost of the same spans.

    .venv/bin/python bench/beat_parts.py [--rate 12500] [--duration 60] [--batch 1000]

``bench/ingest.py --compare-beat`` sees the beat only as throughput a closed-loop load loses, and
``bench/beat_cost.py`` compares processes run minutes apart, on a machine whose speed drifts more
than the difference. Here everything runs in one process and one thread, one step after another,
so each CPU second has exactly one owner: a project made as users make one (its rules of thumb
installed) receives ``bench/load_spans.py``'s traces at ``--rate`` spans/s in inserts of ``--batch``
rows, start times at their arrival, for ``--duration`` seconds of wall time; between inserts the
beat's entries (``CELERY_BEAT_SCHEDULE``, as ``make run`` has them: the summariser, the rollups, the
alert rounds, the host sampler, the memory release) run whenever they are due, through the same
``server.embedded_beat.EmbeddedBeat`` the server runs them with.

Printed: the CPU (the process's, every chdb thread included) of the inserts, of each beat entry, and
of the time between them (the store's merges, the sampler's writer), per second of traffic and per
1,000 spans, and each entry's share of the inserts' own CPU (the issue's "summaries and rollups at a
tenth of ingestion's cost"). The run checks that every trace was summarised.
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
    parser.add_argument("--rate", type=int, default=12_500, help="spans/s inserted (default 12,500)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    parser.add_argument("--batch", type=int, default=1000, help="rows per insert (default 1,000)")
    parser.add_argument("--skip", default="", help="comma-separated beat entries not to run ('all': none runs, the "
                        "inserts' own figures)")
    parser.add_argument("--arrival", choices=("whole", "ends"), default="whole",
                        help="whole: each trace's spans arrive together, at its start (default); ends: each span "
                             "arrives when it ends, as SDKs and OpenTelemetry exporters send them (the children "
                             "before their root, a trace over its seconds)")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.batch <= 0:
        parser.error("--rate, --duration and --batch must be positive")

    load_spans._django()
    import tempfile

    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from config.celery import app
    from projects.services import project_create
    from server.embedded_beat import EmbeddedBeat
    from store import set_store

    store = load_spans.open_store(Path(tempfile.mkdtemp(prefix="tracedash-beat-parts-")))
    set_store(store)
    project, _ = project_create(name="beat-parts")
    beat = EmbeddedBeat(app, settings.CELERY_BEAT_SCHEDULE)
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = skip - set(beat.entries) - {"all"}
    if unknown:
        parser.error(f"--skip: no beat entry {', '.join(sorted(unknown))} (entries: {', '.join(beat.entries)})")
    names = [] if "all" in skip else [n for n in beat.entries if n not in skip]

    total = int(args.rate * args.duration)
    interval = args.batch / args.rate
    t0 = time.time_ns() + 2_000_000_000
    gen = load_spans.Generator(seed=args.seed, start_ns=t0, end_ns=t0 + int(args.duration * 1e9),
                               traces=max(1, total // 8), project_id=project.pk)
    batches = load_spans.arrival_batches(gen, total, args.batch, ends=args.arrival == "ends")
    # Building a long run's batches takes longer than the 2 s allowed for it: the traces would then
    # start that much before they arrive (tens of seconds at 20,000 spans/s for 150 s), and every
    # rollup run would recompute the minute just ended again while it kept being marked. Move them
    # to start at their arrival.
    late = time.time_ns() + 1_000_000_000 - t0
    if late > 0:
        for batch in batches:
            for row in batch:
                row["start_time"] += late
                if row["event_times"]:
                    row["event_times"] = [t + late for t in row["event_times"]]
        t0 += late
    trace_ids = {row["trace_id"] for batch in batches for row in batch}

    class SummariesWritten:  # a write listener: the summaries written (a trace that grows is written again)
        rows = 0

        def on_insert(self, table, rows, tag):
            if table == "traces":
                self.rows += len(rows)

        def reset(self):
            pass

    written = SummariesWritten()
    store.add_write_listener(written)
    by_call, _ = cpu_by_store_call(store)
    cpu = {name: [] for name in ["insert", *names, "between"]}  # CPU seconds of each call
    behind = 0.0

    def timed(name: str, fn, *a, **k) -> None:
        started = process_cpu_seconds()
        fn(*a, **k)
        cpu[name].append(process_cpu_seconds() - started)

    while time.time_ns() < t0:
        time.sleep(0.01)
    wall0 = time.monotonic()
    mark = process_cpu_seconds()
    for i, batch in enumerate(batches):
        due = wall0 + i * interval
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            behind = max(behind, now - due)
        cpu["between"].append(process_cpu_seconds() - mark)
        timed("insert", store.insert, "spans", batch, tag="bench.beat_parts.spans")
        for name in names:
            runs = beat.runs[name]
            started = process_cpu_seconds()
            beat.tick(names=[name])
            if beat.runs[name] > runs:
                cpu[name].append(process_cpu_seconds() - started)
        mark = process_cpu_seconds()
        if (i + 1) % max(1, len(batches) // 10) == 0:
            print(f"{i + 1:,}/{len(batches):,} inserts, {time.monotonic() - wall0:,.0f} s", file=sys.stderr, flush=True)
    wall = time.monotonic() - wall0
    by_call = {tag: seconds for tag, seconds in by_call.items() if "bench.beat_parts" not in tag}
    # What is left to summarise (the spans of the last runs): once more, outside the figures.
    from analytics import summarizer

    if "traces-summarize" in names:
        summarizer.traces_summarize(project_ids=[project.pk])
    summarised = len(trace_ids) if "traces-summarize" not in names else int(store.query(
        "SELECT uniqExact(trace_id) FROM traces WHERE project_id = {p:UInt64}", {"p": project.pk},
        tag="bench.beat_parts.check").scalar())
    store.close()

    seconds = args.duration
    base = sum(cpu["insert"])
    print(", ".join(f"{k} {v}" for k, v in machine().items()))
    print(f"{total:,} spans ({len(trace_ids):,} traces, arriving {args.arrival}) in {len(batches):,} inserts of {args.batch:,} rows at "
          f"{args.rate:,} spans/s for {seconds:g} s (wall {wall:,.1f} s; at most {behind:.2f} s behind schedule); "
          + (f"{summarised:,} of {len(trace_ids):,} traces summarised" if "traces-summarize" in names
             else "the summariser not run") + (f"; not run: {', '.join(sorted(skip))}" if skip else ""))
    if "traces-summarize" in names:
        print(f"summaries written: {written.rows:,}, {written.rows / max(len(trace_ids), 1):.2f} a trace")
        from analytics.fresh_spans import fresh_for
        from store import get_store

        fresh = fresh_for(get_store())
        if fresh is not None:
            stats = fresh.stats
            print(f"the summariser's memory: {stats['windows']:,} runs' arrivals from memory, {stats['store']:,} from the "
                  f"store; traces that grew: {stats['grown']:,} with their earlier spans in memory, "
                  f"{stats['grown_read']:,} read back; kept for them at the end: {fresh.kept_rows:,} spans, "
                  f"{fresh.kept_bytes / 2**20:,.1f} MiB")
    rows = []
    beat_total = 0.0
    for name, calls in cpu.items():
        spent = sum(calls)
        if name in names:
            beat_total += spent
        median = (f"{statistics.median(calls) * 1000:,.1f} ({min(calls) * 1000:,.0f}–{max(calls) * 1000:,.0f})"
                  if calls and name != "between" else "—")
        rows.append([name, f"{len(calls):,}", median, f"{spent * 1000 / seconds:,.1f}", f"{spent * 1e6 / total:,.2f}",
                     "—" if name == "insert" else f"{spent / base:.3f}"])
    rows.append(["the beat, all entries", "", "", f"{beat_total * 1000 / seconds:,.1f}", f"{beat_total * 1e6 / total:,.2f}",
                 f"{beat_total / base:.3f}"])
    print(table(["part", "runs", "ms CPU a run: median (min–max)", "ms CPU a second", "ms CPU per 1,000 spans", "/ inserts"], rows))
    print("the beat's store calls, ms of CPU a second (an insert's line includes its statement's): " + ", ".join(
        f"{tag.replace('analytics.', '')} {spent * 1000 / seconds:,.1f}"
        for tag, spent in sorted(by_call.items(), key=lambda kv: -kv[1])[:10]))
    if summarised != len(trace_ids):
        print(f"FAIL: {len(trace_ids) - summarised:,} traces were not summarised", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
