"""What the beat's work holds in memory, in one process without HTTP: is RSS growth kept memory or
freed pages the allocator has not returned?

    .venv/bin/python bench/memory_probe.py [--rate 6800] [--seconds 240] [--alerts 5] [--summaries 2]
                                           [--rollups 10] [--release-every 0] [--pages 0]

Inserts realistic spans (``bench/load_spans.py``'s generator) through ``Store.insert`` at ``--rate``
spans/s in 1,000-span batches into a fresh embedded store, while threads run, as the embedded beat
does, the summariser, the rollups and alert rounds (the default rules of one project) every
``--summaries`` / ``--rollups`` / ``--alerts`` seconds (0: not at all). Every 10 s it prints the
process's RSS, then the RSS after ``SYSTEM JEMALLOC PURGE`` (ClickHouse's freed pages returned),
the Python object count, ClickHouse's own memory tracker, threads and active/outdated parts. RSS
that grows while the purged figure stays flat is memory held, not used; a purged figure that grows
is kept memory. ``--release-every N`` purges every N s in a thread of its own instead (the
product's ``store-release-memory`` entry), and the purge column then shows nothing more.
``--pages N``: a thread also requests every page the soak's clients poll (``bench/soak.py``
``page_urls``, through Django's test client as a member of the project) one after another,
pausing N s between them. The ``caches`` column is what ClickHouse's caches hold (marks, primary
and skip indexes, query conditions, compiled expressions: ``system.metrics``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import rss_bytes  # noqa: E402


CACHE_METRICS = ("('MarkCacheBytes', 'PrimaryIndexCacheBytes', 'IndexMarkCacheBytes', 'UncompressedCacheBytes',"
                 " 'IndexUncompressedCacheBytes', 'QueryConditionCacheBytes', 'CompiledExpressionCacheBytes',"
                 " 'QueryCacheBytes', 'PageCacheBytes')")


def threads() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=6800.0)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--summaries", type=float, default=2.0, help="summariser every N s (0: never)")
    parser.add_argument("--rollups", type=float, default=10.0, help="rollups every N s (0: never)")
    parser.add_argument("--alerts", type=float, default=5.0, help="alert round every N s (0: never)")
    parser.add_argument("--release-every", type=float, default=0.0, help="purge every N s in a thread (0: only at samples)")
    parser.add_argument("--pages", type=float, default=0.0, help="request the soak's pages, N s apart (0: none)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tracedash-memory-probe-"))
    os.environ["TRACEDASH_DATA_DIR"] = str(work / "settings")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from alerts.services import alerts_evaluate_round
    from analytics import rollup_services, summarizer
    from bench import load_spans
    from projects.models import Project
    from store import set_store

    store = load_spans.open_store(work / "store")
    set_store(store)
    project = Project.objects.create(name="memory-probe")  # with the default alert rules
    stop = threading.Event()
    errors: list[str] = []

    def periodic(every: float, fn) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - counted and shown at the end
                errors.append(f"{fn.__name__}: {exc!r}")
            stop.wait(max(0.0, every - (time.perf_counter() - started)))

    def summaries():
        summarizer.traces_summarize(project_ids=[project.pk])

    def rollups():
        rollup_services.rollups_update(project_ids=[project.pk])

    def alerts():
        alerts_evaluate_round(deliver="none")

    def release():
        store.release_memory()

    page_requests = [0]

    def pages():
        from django.contrib.auth import get_user_model
        from django.test import Client

        from bench.soak import page_urls
        from projects.services import membership_add

        user = get_user_model().objects.create_user(username="memory-probe", password="pw-memory-probe-1")
        membership_add(project=project, user=user)
        client = Client()
        client.force_login(user)
        while not stop.is_set():
            trace_id = store.query("SELECT trace_id FROM traces_by_start FINAL WHERE project_id = {p:UInt64}"
                                   " ORDER BY start_time DESC LIMIT 1", {"p": project.pk},
                                   tag="bench.memory_probe.trace").scalar()
            for name, path in page_urls(trace_id or "0" * 32):
                if stop.is_set():
                    return
                response = client.get(path, {"project": project.pk})
                if response.status_code != 200 and trace_id:
                    errors.append(f"{name}: HTTP {response.status_code}")
                page_requests[0] += 1
                stop.wait(args.pages)

    jobs = [(args.summaries, summaries), (args.rollups, rollups), (args.alerts, alerts), (args.release_every, release)]
    workers = [threading.Thread(target=periodic, args=(every, fn), daemon=True) for every, fn in jobs if every > 0]
    if args.pages > 0:
        from django.conf import settings

        settings.ALLOWED_HOSTS = ["*"]
        workers.append(threading.Thread(target=pages, daemon=True))
    total = int(args.rate * args.seconds)
    t0 = time.time_ns()
    gen = load_spans.Generator(seed=5, start_ns=t0, end_ns=t0 + int(args.seconds * 1e9), traces=max(1, total // 8),
                               project_id=project.pk)
    for worker in workers:
        worker.start()
    print(f"{total:,} spans at {args.rate:,.0f}/s; summaries every {args.summaries:g} s, rollups {args.rollups:g} s, "
          f"alerts {args.alerts:g} s, purge thread {args.release_every:g} s (0: none)", flush=True)
    print(f"{'s':>4} {'RSS MiB':>8} {'purged':>7} {'objects':>8} {'CH MiB':>7} {'caches':>7} {'threads':>7} {'parts':>7}"
          f" {'behind s':>8} {'pages':>6}", flush=True)
    started = time.monotonic()
    sent, pending, next_sample = 0, [], started
    while sent < total:
        while len(pending) < args.batch:
            pending.extend(gen.trace(sent / total))
        batch, pending = pending[:args.batch], pending[args.batch:]
        due = started + sent / args.rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        store.insert("spans", batch, tag="bench.memory_probe.spans")
        sent += len(batch)
        if time.monotonic() >= next_sample:
            rss = rss_bytes() / 2**20
            store.release_memory()
            purged = rss_bytes() / 2**20
            tracked = int(store.query("SELECT value FROM system.metrics WHERE metric = 'MemoryTracking'",
                                      tag="bench.memory_probe.tracked").scalar())
            caches = int(store.query(f"SELECT sum(value) FROM system.metrics WHERE metric IN {CACHE_METRICS}",
                                     tag="bench.memory_probe.caches").scalar() or 0)
            active, outdated = store.query("SELECT countIf(active), countIf(NOT active) FROM system.parts"
                                           " WHERE database = currentDatabase()", tag="bench.memory_probe.parts").rows[0]
            print(f"{time.monotonic() - started:4.0f} {rss:8.0f} {purged:7.0f} {len(gc.get_objects()):8,} "
                  f"{tracked / 2**20:7.0f} {caches / 2**20:7.1f} {threads():7} {active:>3}/{outdated:<3}"
                  f" {max(0.0, now - due):8.1f} {page_requests[0]:6}", flush=True)
            next_sample += 10
    stop.set()
    for worker in workers:
        worker.join()
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""), flush=True)
    store.close()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
