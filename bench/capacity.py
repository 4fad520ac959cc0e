"""The capacity model's inputs, measured on this machine in one run, and the table computed from them.

    .venv/bin/python bench/capacity.py [--duration 15] [--spans 200000] [--json PATH] [--keep]
    .venv/bin/python bench/capacity.py --from-json PATH [--rates …] [--retention …] [--utilisation 0.6]

Every cost is **CPU time** (user + system, every thread of the process: chdb's ClickHouse threads
run inside the process that opened it), not wall time: CPU-seconds per unit of work change far
less than wall time when the machine is shared with other work. Four phases:

1. **HTTP ingest** (``bench/ingest.py``'s machinery): a ``manage.py serve`` subprocess without its
   in-process beat (the ingest path alone, as a production web process runs it), fed native JSON
   and OTLP protobuf in 1,000-span batches for ``--duration`` s each. Its CPU is read from /proc,
   from the first request until its group commits *and the merges they caused* have finished,
   less its idle CPU over the same time. Embedded, the server's process holds both the web path
   and the ClickHouse insert, so this is the web + store total per 1,000 spans.
2. **Store** (the ClickHouse half): the same spans, parsed by ``ingest.schemas.parse_spans`` as
   the server does, inserted with ``Store.insert`` in batches of the size the server's group
   commit made, until the merges they cause have finished: the store's CPU per 1,000 spans.
   **Web = server total − store.** Those distinct spans, stored once and merged, also give the
   bytes per span of prompt-heavy traffic (every model call carries its 1–4 KB prompt).
3. **Disk, summaries, rollups**: ``--spans`` realistic spans (``bench/load_spans.py``'s generator)
   over ``--minutes`` minutes into a fresh embedded store; then
   - summaries: ``analytics.summarizer.traces_summarize_ids`` (the summariser's INSERT … SELECT:
     the SQL engine, a server's default, unless ``TRACEDASH_SUMMARY_ENGINE`` says otherwise;
     its dirty-minute marks and the ``traces_by_start`` view) over every trace, ``traces``
     emptied before each of ``--rounds`` rounds, merges included: CPU per 1,000 spans summarised;
   - rollups: ``analytics.rollup_services.rollup_minutes_recompute`` over the late-arrival window
     (``TRACEDASH_ROLLUP_LATE_SECONDS`` + one minute: what each incremental run recomputes) once
     on the loaded minutes and once on as many empty minutes (the fixed cost of a run): CPU per
     run and per 1,000 traces recomputed;
   - disk: every table ``OPTIMIZE … FINAL``, then ``system.parts`` (compressed bytes, rows) and
     ``system.columns`` (the biggest columns of ``spans``).
4. **The table**: ``capacity_table`` turns those figures into web cores, ClickHouse cores and disk
   per day for a list of span rates (the arithmetic is in that pure function; tests/test_capacity.py).

The figures come from the embedded engine (chdb, ClickHouse 26.9 in-process); a ClickHouse server
compresses the same way but its CPU per row may differ (other thread pools, network protocol).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import process_cpu_seconds  # noqa: E402

DEFAULT_RATES = (1_000, 5_000, 20_000, 50_000, 100_000)
DEFAULT_RETENTION = (7, 30, 90)
DEFAULT_UTILISATION = 0.6  # provision cores so that the measured load keeps them at most this busy
ROLLUP_TABLES = ("rollup_minute", "rollup_hour", "rollup_hour_all", "rollup_6h", "rollup_6h_all",
                 "rollup_day", "rollup_day_all")


def log(message: str, end: str = "\n") -> None:
    print(message, file=sys.stderr, end=end, flush=True)


# --- the arithmetic (pure) -------------------------------------------------------------------------
def _rollup_cpu(f: dict, traces_per_s: float) -> float:
    """CPU-seconds per second of the rollup task (see ``capacity_table``)."""
    def run(traces: float) -> float:
        return f["rollup_run_cpu_s"] + traces / 1000 * f["rollup_cpu_s_per_1000_traces"]

    interval = f["rollup_interval_s"]
    every = f.get("rollup_late_every_s") or interval
    if every <= interval:  # every run re-covers the window
        return run(traces_per_s * f["rollup_window_s"]) / interval
    # A run recomputes the minutes that ended since the last run (the open minute waits until it
    # has ended): each trace once, on average ``interval`` seconds of traffic a run.
    return run(traces_per_s * min(interval, f["rollup_window_s"])) / interval + run(traces_per_s * f["rollup_window_s"]) / every


def capacity_table(figures: dict, *, rates=DEFAULT_RATES, retention_days=DEFAULT_RETENTION,
                   utilisation: float = DEFAULT_UTILISATION) -> list[dict]:
    """One row per span rate. ``figures`` (all CPU in seconds):

    - ``web_cpu_s_per_1000_spans``: the HTTP path (parse, validate, ASGI, group commit);
    - ``store_cpu_s_per_1000_spans``: the ClickHouse insert of the spans and its merges;
    - ``summary_cpu_s_per_1000_spans``: the summariser's work per span summarised (once each);
    - ``rollup_run_cpu_s``: one rollup run's fixed cost (its window recomputed with no traces);
    - ``rollup_cpu_s_per_1000_traces``: the added cost per 1,000 traces in the recomputed window;
    - ``rollup_interval_s``, ``rollup_window_s``, ``rollup_late_every_s``: a run every interval
      recomputes the marked minutes that have ended since the last run (the open minute waits until
      it has ended: on average an interval of traffic, each trace once), and the whole late-arrival
      window every ``rollup_late_every_s`` (absent or not
      above the interval: on every run, as before TRACEDASH_ROLLUP_LATE_EVERY_SECONDS);
    - ``spans_per_trace``;
    - ``bytes_per_span`` (spans), ``bytes_per_trace`` (traces + traces_by_start),
      ``rollup_bytes_per_minute`` (every rollup level, per minute of traffic).

    ClickHouse cores = insert + merges + summaries + rollups. Cores are the measured CPU-seconds per
    second (``*_cpu``), and the whole cores to provision so that they run at most ``utilisation``
    busy (``*_cores``). Disk per day in bytes; ``disk_bytes[N]`` = N days of it (the retention)."""
    if not 0 < utilisation <= 1:
        raise ValueError("utilisation must be in (0, 1]")
    f = figures
    rows = []
    for rate in rates:
        traces_per_s = rate / f["spans_per_trace"]
        web_cpu = rate / 1000 * f["web_cpu_s_per_1000_spans"]
        rollup_cpu = _rollup_cpu(f, traces_per_s)
        store_cpu = rate / 1000 * f["store_cpu_s_per_1000_spans"]
        summary_cpu = rate / 1000 * f["summary_cpu_s_per_1000_spans"]
        clickhouse_cpu = store_cpu + summary_cpu + rollup_cpu
        per_day = 86400 * (rate * f["bytes_per_span"] + traces_per_s * f["bytes_per_trace"]) + 1440 * f["rollup_bytes_per_minute"]
        rows.append({
            "spans_per_s": rate,
            "web_cpu": web_cpu, "web_cores": math.ceil(web_cpu / utilisation - 1e-9),
            "store_cpu": store_cpu, "summary_cpu": summary_cpu, "rollup_cpu": rollup_cpu,
            "clickhouse_cpu": clickhouse_cpu, "clickhouse_cores": math.ceil(clickhouse_cpu / utilisation - 1e-9),
            "disk_bytes_per_day": per_day,
            "disk_bytes": {n: per_day * n for n in retention_days},
        })
    return rows


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError


# --- measuring --------------------------------------------------------------------------------------
def _wait_merges(store, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and store.query(
            "SELECT count() FROM system.merges WHERE database = currentDatabase()", tag="bench.capacity.merges").scalar():
        time.sleep(0.25)


def _wait_idle(server, idle_rate: float, timeout: float = 90.0) -> None:
    """Until the server's CPU over one second is back near its idle rate (its merges are done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = server.cpu_seconds()
        time.sleep(1.0)
        if server.cpu_seconds() - before <= idle_rate + 0.03:
            return


def measure_http(args, work: Path, request_numbers) -> tuple[dict, list]:
    """Phase 1: server CPU per 1,000 spans, native JSON and OTLP, 1,000-span batches."""
    from bench.common import Server
    from bench.ingest import build_scenarios, drive, validate_templates, wait_drained

    log("[1/4] HTTP ingest: generating and encoding traces…")
    scenarios = build_scenarios(args.seed, pool_100=2, pool_1000=6)
    validate_templates(scenarios, request_numbers)
    server = Server(work / "server", env={"TRACEDASH_INGEST_RATE_LIMIT": "0", "TRACEDASH_EMBEDDED_BEAT": "0",
                                          "TRACEDASH_BEAT_SAMPLE_SECONDS": "3600"})
    out = {}
    try:
        log("      starting `manage.py serve` (no in-process beat)…")
        server.start()
        key = server.manage("create_project", "capacity").strip().splitlines()[-1]
        time.sleep(2.0)
        before = server.cpu_seconds()
        time.sleep(3.0)
        idle_rate = (server.cpu_seconds() - before) / 3.0
        out["server_idle_cpu_per_s"] = round(idle_rate, 4)
        for scenario in (s for s in scenarios if s.name in ("json-1000", "otlp-1000")):
            started_cpu, started = server.cpu_seconds(), time.monotonic()
            result = drive(scenario, server, key, duration=args.duration, concurrency=args.concurrency,
                           request_numbers=request_numbers)
            wait_drained(server)
            _wait_idle(server, idle_rate)
            cpu = server.cpu_seconds() - started_cpu - idle_rate * (time.monotonic() - started)
            fmt = scenario.name.split("-")[0]
            out[fmt] = {"spans": result["spans_acknowledged"], "spans_per_s": result["spans_per_s"],
                        "rows_per_insert": result["rows_per_insert"], "errors": result["errors"],
                        "server_cpu_s": round(cpu, 2),
                        "server_cpu_s_per_1000_spans": cpu / result["spans_acknowledged"] * 1000}
            log(f"      {scenario.name}: {result['spans_acknowledged']:,} spans, server CPU "
                f"{out[fmt]['server_cpu_s_per_1000_spans'] * 1000:.1f} ms per 1,000 spans (merges included), "
                f"{result['rows_per_insert'] or 0:,.0f} rows per group commit")
    except BaseException:
        log(f"server log (last lines):\n{server.log_tail()}")
        raise
    finally:
        server.stop()
    return out, scenarios


def measure_store(store, scenarios, request_numbers, *, batch: int, total_rows: int) -> dict:
    """Phase 2: the ClickHouse half of ingest, merges included."""
    from django.conf import settings

    from ingest.schemas import Limits, parse_spans

    limits = Limits.from_settings(settings)
    native = next(s for s in scenarios if s.name == "json-1000")
    rows = [row for i in range(20) for row in parse_spans(native.patch(native.templates[i % len(native.templates)],
                                                                       next(request_numbers)), project_id=1, limits=limits)[0]]
    store.insert("spans", rows[:1000], tag="bench.capacity.warmup", dedup_token=secrets.token_hex(16))
    _wait_merges(store)
    log(f"[2/4] store: inserting {total_rows:,} parsed spans in batches of {batch:,} (as the group commit did)…")
    cpu, inserted, offset = process_cpu_seconds(), 0, 0
    while inserted < total_rows:
        if offset + batch > len(rows):
            offset = 0
        chunk = rows[offset:offset + batch]
        offset += batch
        store.insert("spans", chunk, tag="bench.capacity.store", dedup_token=secrets.token_hex(16))
        inserted += len(chunk)
        log(f"\r      {inserted:,}/{total_rows:,} spans", end="")
    log("\n      waiting for the merges…")
    _wait_merges(store)
    used = process_cpu_seconds() - cpu
    # The same distinct rows once (every model call carries a 1–4 KB prompt): what prompt-heavy spans take on disk.
    store.command("TRUNCATE TABLE spans", tag="bench.capacity.truncate")
    distinct = rows[:len(native.templates) * native.batch]  # the bodies repeat the templates' prompts after these
    store.insert("spans", distinct, tag="bench.capacity.heavy", dedup_token=secrets.token_hex(16))
    store.command("OPTIMIZE TABLE spans FINAL", tag="bench.capacity.optimize")
    on_disk, stored = store.query("SELECT sum(bytes_on_disk), sum(rows) FROM system.parts WHERE database = currentDatabase() "
                                  "AND table = 'spans' AND active", tag="bench.capacity.heavy_parts").rows[0]
    store.command("TRUNCATE TABLE spans", tag="bench.capacity.truncate")
    return {"rows": inserted, "batch": batch, "cpu_s": round(used, 2), "store_cpu_s_per_1000_spans": used / inserted * 1000,
            "prompt_heavy_bytes_per_span": int(on_disk) / max(int(stored), 1), "prompt_heavy_rows": int(stored)}


def measure_summaries(store, *, rounds: int, prices: dict) -> dict:
    from analytics.summarizer import traces_summarize_ids

    touched = store.query("SELECT trace_id, min(toUnixTimestamp64Nano(start_time)) AS first_ns, "
                          "max(toUnixTimestamp64Nano(start_time)) AS last_ns FROM spans "
                          "WHERE project_id = 1 GROUP BY trace_id", tag="bench.capacity.touched").dicts()
    costs, spans = [], 0
    for i in range(rounds):
        for table in ("traces", "traces_by_start", "rollup_dirty"):
            store.command(f"TRUNCATE TABLE {table}", tag="bench.capacity.truncate")
        _wait_merges(store)
        cpu = process_cpu_seconds()
        # The summariser's batches: at most TRACEDASH_SUMMARIZE_MAX_SPANS spans a run, so split as it would.
        written, spans = [], 0
        for j in range(0, len(touched), 20_000):
            ids, n = traces_summarize_ids(project_id=1, touched=touched[j:j + 20_000], prices=prices)
            written += ids
            spans += n
        _wait_merges(store)
        costs.append(process_cpu_seconds() - cpu)
        log(f"\r[3/4] summaries: round {i + 1}/{rounds}, {len(written):,} traces / {spans:,} spans, "
            f"{costs[-1]:.2f} CPU s", end="")
    log("")
    best = sorted(costs)[len(costs) // 2]
    return {"traces": len(touched), "spans": spans, "cpu_s_rounds": [round(c, 2) for c in costs],
            "summary_cpu_s_per_1000_spans": best / spans * 1000}


def measure_rollups(store, *, minutes: list[int], window_minutes: int, rounds: int) -> dict:
    from analytics.rollup_services import rollup_minutes_recompute

    loaded = minutes[-window_minutes:]
    empty = [m - 400 * 86400 for m in loaded]  # as many minutes, long before any span
    traces = store.query("SELECT count() FROM traces FINAL WHERE project_id = 1 AND start_time >= "
                         "toDateTime({lo:UInt32}, 'UTC') AND start_time < toDateTime({hi:UInt32}, 'UTC')",
                         {"lo": loaded[0], "hi": loaded[-1] + 60}, tag="bench.capacity.window").scalar()
    cost = {"loaded": [], "empty": []}
    for i in range(rounds):
        for label, window in (("loaded", loaded), ("empty", empty)):
            cpu = process_cpu_seconds()
            rollup_minutes_recompute(project_id=1, minutes=window)
            _wait_merges(store)
            cost[label].append(process_cpu_seconds() - cpu)
        log(f"\r      rollups: round {i + 1}/{rounds}: window of {len(loaded)} minutes with {int(traces):,} traces "
            f"{cost['loaded'][-1]:.2f} CPU s, empty {cost['empty'][-1]:.2f} CPU s", end="")
    log("")
    median = {k: sorted(v)[len(v) // 2] for k, v in cost.items()}
    per_1000 = max(0.0, median["loaded"] - median["empty"]) / max(int(traces), 1) * 1000
    return {"window_minutes": len(loaded), "traces_in_window": int(traces),
            "cpu_s_loaded": [round(c, 3) for c in cost["loaded"]], "cpu_s_empty": [round(c, 3) for c in cost["empty"]],
            "rollup_run_cpu_s": median["empty"], "rollup_cpu_s_per_1000_traces": per_1000}


def measure_disk(store, *, minutes: int) -> dict:
    tables = [r[0] for r in store.query("SELECT name FROM system.tables WHERE database = currentDatabase() AND "
                                        "engine LIKE '%MergeTree%'", tag="bench.capacity.tables").rows]
    for name in tables:
        store.command(f"OPTIMIZE TABLE {name} FINAL", tag="bench.capacity.optimize")
    _wait_merges(store)
    parts = {r[0]: {"rows": int(r[1]), "compressed": int(r[2]), "uncompressed": int(r[3]), "on_disk": int(r[4])}
             for r in store.query(
                 "SELECT table, sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes), sum(bytes_on_disk) "
                 "FROM system.parts WHERE database = currentDatabase() AND active GROUP BY table",
                 tag="bench.capacity.parts").rows}
    columns = [{"column": r[0], "compressed": int(r[1]), "uncompressed": int(r[2])} for r in store.query(
        "SELECT name, data_compressed_bytes, data_uncompressed_bytes FROM system.columns "
        "WHERE database = currentDatabase() AND table = 'spans' ORDER BY data_compressed_bytes DESC LIMIT 8",
        tag="bench.capacity.columns").rows]
    spans, traces = parts["spans"], parts.get("traces", {"rows": 0, "on_disk": 0})
    by_start = parts.get("traces_by_start", {"rows": 0, "on_disk": 0})
    rollup_bytes = sum(parts.get(t, {"on_disk": 0})["on_disk"] for t in ROLLUP_TABLES)
    return {
        "tables": parts, "spans_columns": columns,
        "bytes_per_span": spans["on_disk"] / spans["rows"],
        "compression_ratio_spans": spans["uncompressed"] / max(spans["compressed"], 1),
        "bytes_per_trace": (traces["on_disk"] + by_start["on_disk"]) / max(traces["rows"], 1),
        "rollup_bytes_per_minute": rollup_bytes / minutes,
        "rollup_minute_rows_per_minute": parts.get("rollup_minute", {"rows": 0})["rows"] / minutes,
    }


def measure(args) -> dict:
    from bench import load_spans
    from bench.common import machine

    work = Path(tempfile.mkdtemp(prefix="tracedash-bench-capacity-", dir=args.data_dir))
    request_numbers = itertools.count(1)
    started = time.monotonic()
    try:
        http, scenarios = measure_http(args, work, request_numbers)
        os.environ["TRACEDASH_DATA_DIR"] = str(work / "settings")
        # The model sizes a ClickHouse server, whose summariser runs the SQL engine by default
        # (TRACEDASH_SUMMARY_ENGINE=auto); set the variable to measure the other one.
        os.environ.setdefault("TRACEDASH_SUMMARY_ENGINE", "sql")
        load_spans._django()
        from django.conf import settings

        from store import set_store

        store = load_spans.open_store(work / "store")
        set_store(store)
        batch = max(100, int(round(http["json"]["rows_per_insert"] or 1000)))
        store_figures = measure_store(store, scenarios, request_numbers, batch=batch, total_rows=args.store_rows)

        minutes = max(2, int(args.minutes))
        log(f"[3/4] loading {args.spans:,} spans over {minutes} minutes (bench/load_spans.py's generator)…")
        now_ns = (time.time_ns() // 60_000_000_000) * 60_000_000_000  # whole minutes: the window lines up
        loaded = load_spans.load(store=store, spans_wanted=args.spans, days=minutes / 1440, batch=20_000, seed=args.seed,
                                 now_ns=now_ns)
        _wait_merges(store)
        prices = {name: (p_in, p_out) for name, p_in, p_out, _ in load_spans.MODELS}
        summaries = measure_summaries(store, rounds=args.rounds, prices=prices)
        first_minute = now_ns // 1_000_000_000 - minutes * 60
        minute_list = list(range(first_minute, first_minute + minutes * 60, 60))
        window_s = int(settings.TRACEDASH_ROLLUP_LATE_SECONDS) + 60
        rollups = measure_rollups(store, minutes=minute_list, window_minutes=min(minutes, window_s // 60),
                                  rounds=args.rounds)
        log("[4/4] disk: OPTIMIZE FINAL every table, reading system.parts and system.columns…")
        disk = measure_disk(store, minutes=minutes)
        store.close()
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    import chdb

    store_1000 = store_figures["store_cpu_s_per_1000_spans"]
    figures = {
        "web_cpu_s_per_1000_spans": http["json"]["server_cpu_s_per_1000_spans"] - store_1000,
        "web_cpu_s_per_1000_spans_otlp": http["otlp"]["server_cpu_s_per_1000_spans"] - store_1000,
        "store_cpu_s_per_1000_spans": store_1000,
        "summary_cpu_s_per_1000_spans": summaries["summary_cpu_s_per_1000_spans"],
        "rollup_run_cpu_s": rollups["rollup_run_cpu_s"],
        "rollup_cpu_s_per_1000_traces": rollups["rollup_cpu_s_per_1000_traces"],
        "rollup_interval_s": float(settings.TRACEDASH_ROLLUP_SECONDS),
        "rollup_window_s": float(window_s),
        "rollup_late_every_s": float(settings.TRACEDASH_ROLLUP_LATE_EVERY_SECONDS),
        "spans_per_trace": loaded["spans"] / loaded["traces"],
        "bytes_per_span": disk["bytes_per_span"],
        "bytes_per_trace": disk["bytes_per_trace"],
        "rollup_bytes_per_minute": disk["rollup_bytes_per_minute"],
    }
    return {"figures": figures, "http": http, "store": store_figures, "summaries": summaries, "rollups": rollups,
            "disk": disk, "machine": machine(), "engine": f"chdb {chdb.__version__} (ClickHouse {chdb.engine_version})",
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(time.monotonic() - started),
            "load_average": os.getloadavg(),
            "settings": {"duration": args.duration, "concurrency": args.concurrency, "spans": args.spans,
                         "minutes": minutes, "rounds": args.rounds, "store_rows": args.store_rows}}


# --- report -------------------------------------------------------------------------------------------
def report(result: dict, *, rates, retention_days, utilisation: float, alt_rollup=None) -> str:
    from bench.common import table

    f = result["figures"]
    http, disk = result["http"], result["disk"]
    ms = lambda s: f"{s * 1000:,.1f}"  # noqa: E731
    lines = [f"tracedash capacity figures — {result['measured_at']}, {result['engine']}, "
             f"nproc {result['machine']['nproc']}, {result['machine']['cpu_model']}, load average "
             f"{result['load_average'][0]:.1f} (CPU time, not wall time)", ""]
    lines.append(table(["measured input", "value", "how"], [
        ["server total, native JSON", f"{ms(http['json']['server_cpu_s_per_1000_spans'])} ms CPU / 1k spans",
         f"manage.py serve, {http['json']['spans']:,} spans in 1,000-span batches"],
        ["server total, OTLP protobuf", f"{ms(http['otlp']['server_cpu_s_per_1000_spans'])} ms CPU / 1k spans",
         f"same, {http['otlp']['spans']:,} spans"],
        ["store (insert + merges)", f"{ms(f['store_cpu_s_per_1000_spans'])} ms CPU / 1k spans",
         f"Store.insert of {result['store']['rows']:,} parsed spans, {result['store']['batch']:,}-row batches"],
        ["web, native JSON", f"{ms(f['web_cpu_s_per_1000_spans'])} ms CPU / 1k spans", "server total - store"],
        ["web, OTLP protobuf", f"{ms(f['web_cpu_s_per_1000_spans_otlp'])} ms CPU / 1k spans", "server total - store"],
        ["summaries", f"{ms(f['summary_cpu_s_per_1000_spans'])} ms CPU / 1k spans",
         f"traces_summarize_ids over {result['summaries']['spans']:,} spans, median of {len(result['summaries']['cpu_s_rounds'])}"],
        ["rollup run, fixed", f"{ms(f['rollup_run_cpu_s'])} ms CPU / run",
         f"{result['rollups']['window_minutes']} empty minutes + their hours, 6 h, days"],
        ["rollup, per trace", f"{ms(f['rollup_cpu_s_per_1000_traces'])} ms CPU / 1k traces",
         f"{result['rollups']['window_minutes']} minutes holding {result['rollups']['traces_in_window']:,} traces, minus fixed"],
        ["rollup schedule", f"every {f['rollup_interval_s']:g} s the marked minutes; the last {f['rollup_window_s']:g} s "
         f"every {f.get('rollup_late_every_s') or f['rollup_interval_s']:g} s", "settings"],
        ["spans per trace", f"{f['spans_per_trace']:.2f}", "bench/load_spans.py generator"],
        ["spans on disk", f"{f['bytes_per_span']:,.1f} B / span", f"compressed {disk['compression_ratio_spans']:.1f}x, after OPTIMIZE FINAL"],
        ["spans on disk, prompt-heavy", f"{result['store'].get('prompt_heavy_bytes_per_span', 0):,.1f} B / span",
         f"{result['store'].get('prompt_heavy_rows', 0):,} bench/ingest.py spans: every model call with a 1-4 KB prompt"],
        ["traces + traces_by_start", f"{f['bytes_per_trace']:,.1f} B / trace", "after OPTIMIZE FINAL"],
        ["rollups (every level)", f"{f['rollup_bytes_per_minute'] / 1000:,.1f} KB / minute",
         f"{disk['rollup_minute_rows_per_minute']:.0f} rollup_minute rows a minute"],
    ]))
    lines += ["", "biggest columns of spans (compressed):",
              ", ".join(f"{c['column']} {c['compressed'] / disk['tables']['spans']['rows']:,.1f} B/span" for c in disk["spans_columns"]), ""]
    rows = capacity_table(f, rates=rates, retention_days=retention_days, utilisation=utilisation)
    headers = ["spans/s", "web CPU", "web cores", "CH CPU (ins+sum+roll)", "CH cores", "disk/day",
               *(f"disk {n} d" for n in retention_days)]
    lines.append(f"capacity at most {utilisation:.0%} busy (cores = ceil(CPU-seconds per second / {utilisation:g}))")
    lines.append(table(headers, [[f"{r['spans_per_s']:,}", f"{r['web_cpu']:.2f}", str(r["web_cores"]),
                                  f"{r['clickhouse_cpu']:.2f} ({r['store_cpu']:.2f}+{r['summary_cpu']:.2f}+{r['rollup_cpu']:.2f})",
                                  str(r["clickhouse_cores"]), human_bytes(r["disk_bytes_per_day"]),
                                  *(human_bytes(r["disk_bytes"][n]) for n in retention_days)] for r in rows]))
    if alt_rollup:
        interval, late = alt_rollup
        alt = dict(f, rollup_interval_s=float(interval), rollup_window_s=float(late + 60))
        lines += ["", f"the same with rollups every {interval:g} s over the last {late:g} s "
                  f"(TRACEDASH_ROLLUP_SECONDS={interval:g}, TRACEDASH_ROLLUP_LATE_SECONDS={late:g})"]
        lines.append(table(["spans/s", "CH CPU (ins+sum+roll)", "CH cores"], [
            [f"{r['spans_per_s']:,}", f"{r['clickhouse_cpu']:.2f} ({r['store_cpu']:.2f}+{r['summary_cpu']:.2f}+{r['rollup_cpu']:.2f})",
             str(r["clickhouse_cores"])]
            for r in capacity_table(alt, rates=rates, retention_days=retention_days, utilisation=utilisation)]))
    lines.append(f"\nmeasured in {result['seconds']} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of HTTP load per format (default 15)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--spans", type=int, default=200_000, help="spans loaded for the disk/summary/rollup figures")
    parser.add_argument("--minutes", type=int, default=11, help="minutes those spans are spread over (default 11)")
    parser.add_argument("--store-rows", type=int, default=200_000, help="spans inserted for the store figure")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the summary and rollup measurements (median)")
    parser.add_argument("--rates", default=",".join(map(str, DEFAULT_RATES)), help="span rates of the table")
    parser.add_argument("--retention", default=",".join(map(str, DEFAULT_RETENTION)), help="retention days of the table")
    parser.add_argument("--utilisation", type=float, default=DEFAULT_UTILISATION)
    parser.add_argument("--alt-rollup", default="60,120", metavar="SECONDS,LATE",
                        help="also print the ClickHouse cores with rollups every SECONDS over the last LATE seconds "
                             "(default 60,120; 'none' for no second table)")
    parser.add_argument("--data-dir", type=Path, help="where to make the temporary data dirs")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures and the table as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    parser.add_argument("--from-json", type=Path, metavar="PATH",
                        help="measure nothing: print the report (and table) of a run saved with --json")
    args = parser.parse_args(argv)
    try:
        rates = [int(x) for x in args.rates.split(",") if x.strip()]
        retention = [int(x) for x in args.retention.split(",") if x.strip()]
        alt_rollup = None if args.alt_rollup == "none" else tuple(int(x) for x in args.alt_rollup.split(","))
        if alt_rollup is not None and (len(alt_rollup) != 2 or alt_rollup[0] < 1 or alt_rollup[1] < 0):
            raise ValueError
    except ValueError:
        parser.error("--rates, --retention and --alt-rollup are comma-separated whole numbers "
                     "(--alt-rollup: SECONDS >= 1, LATE >= 0)")
    if (args.duration <= 0 or args.spans < 1000 or args.store_rows < 1000 or args.rounds < 1 or not rates
            or not retention or not 0 < args.utilisation <= 1):
        parser.error("--duration, --rounds must be positive, --spans/--store-rows at least 1000, utilisation in (0, 1]")
    if args.data_dir:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        result = json.loads(args.from_json.read_text())  # re-render a saved run: no measuring
    else:
        result = measure(args)
    print(report(result, rates=rates, retention_days=retention, utilisation=args.utilisation, alt_rollup=alt_rollup),
          flush=True)
    if args.json:
        result["table"] = capacity_table(result["figures"], rates=rates, retention_days=retention, utilisation=args.utilisation)
        result["utilisation"] = args.utilisation
        if alt_rollup:
            alt = dict(result["figures"], rollup_interval_s=float(alt_rollup[0]), rollup_window_s=float(alt_rollup[1] + 60))
            result["table_alt_rollup"] = {"rollup_seconds": alt_rollup[0], "rollup_late_seconds": alt_rollup[1],
                                          "rows": capacity_table(alt, rates=rates, retention_days=retention,
                                                                 utilisation=args.utilisation)}
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
