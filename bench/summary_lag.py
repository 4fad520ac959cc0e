"""How soon after its last span is acknowledged a trace's summary is visible, under ingestion load.

    .venv/bin/python bench/summary_lag.py [--duration 60] [--concurrency 8] [--probe-every 1.0]

A real `manage.py serve` with its in-process beat (summaries every TRACEDASH_SUMMARIZE_SECONDS,
rollups, alert rounds: what `make run` runs) is loaded by ``bench/ingest.py``'s json-1000 scenario
(``--concurrency`` keep-alive connections posting 1,000-span batches). Meanwhile a probe posts a
small trace of its own every ``--probe-every`` seconds and, as a logged-in user, polls the
explorer's JSON (``/traces/rows.json?trace_id=…``, which reads the per-trace summaries) every
50 ms until the trace's row is there. Lag = the first poll that sees it − the 200 of its batch.
Printed: the load achieved and the lag's p50, p95 and maximum. Target: p95 ≤ 5 s.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.common import Server, machine, percentile  # noqa: E402
from bench.ingest import build_scenarios, drive, validate_templates  # noqa: E402
from bench.read import Client  # noqa: E402

USERNAME = "lag-probe"
TARGET_P95_S = 5.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def probe_trace() -> tuple[str, bytes]:
    """A root span and a model call under it, starting now."""
    trace_id, root_id = secrets.token_hex(16), secrets.token_hex(8)
    now = time.time_ns()
    spans = [
        {"trace_id": trace_id, "span_id": root_id, "name": "lag-probe", "phase": "other", "service": "lag-probe",
         "start_time": now, "duration_ms": 20},
        {"trace_id": trace_id, "span_id": secrets.token_hex(8), "parent_span_id": root_id, "name": "chat",
         "phase": "inference", "service": "lag-probe", "model": "probe-model", "start_time": now + 2_000_000,
         "duration_ms": 15, "input_tokens": 10, "output_tokens": 5},
    ]
    return trace_id, json.dumps({"spans": spans}).encode()


def probe(server: Server, key: str, password: str, *, until: float, every: float, lags: list, misses: list) -> None:
    ingest, reader = Client(server.port), Client(server.port)
    reader.login(USERNAME, password)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    while time.monotonic() < until:
        started = time.monotonic()
        trace_id, body = probe_trace()
        status, answer = ingest.request("POST", "/api/v1/traces", body, headers)
        if status != 200:
            raise RuntimeError(f"the probe's batch was refused: {status} {answer[:200]!r}")
        acknowledged = time.monotonic()
        deadline = acknowledged + 60
        while True:
            status, answer = reader.request("GET", f"/traces/rows.json?trace_id={trace_id}&range=1h")
            if status == 200 and any(r["trace_id"] == trace_id for r in json.loads(answer)["rows"]):
                lags.append(time.monotonic() - acknowledged)
                break
            if time.monotonic() > deadline:
                misses.append(trace_id)
                break
            time.sleep(0.05)
        time.sleep(max(0.0, every - (time.monotonic() - started)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--concurrency", type=int, default=8, help="load connections (default 8)")
    parser.add_argument("--probe-every", type=float, default=1.0, help="seconds between probe traces (default 1)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="tracedash-bench-lag-"))
    scenario = next(s for s in build_scenarios(7, pool_100=1, pool_1000=6) if s.name == "json-1000")
    request_numbers = iter(range(1, 10**9))
    validate_templates([scenario], request_numbers)
    server = Server(work / "server", env={"TRACEDASH_INGEST_RATE_LIMIT": "0", "TRACEDASH_BEAT_SAMPLE_SECONDS": "3600"})
    password = secrets.token_urlsafe(12)
    lags: list[float] = []
    misses: list[str] = []
    try:
        log("starting `manage.py serve` (in-process beat on)…")
        server.start()
        server.manage("shell", "-c", f"from django.contrib.auth import get_user_model; "
                                     f"get_user_model().objects.create_user({USERNAME!r}, password={password!r})")
        key = server.manage("create_project", "lag", "--member", USERNAME).strip().splitlines()[-1]
        until = time.monotonic() + args.duration
        prober = threading.Thread(target=probe, args=(server, key, password),
                                  kwargs={"until": until, "every": args.probe_every, "lags": lags, "misses": misses},
                                  daemon=True)
        prober.start()
        load = drive(scenario, server, key, duration=args.duration, concurrency=args.concurrency,
                     request_numbers=request_numbers)
        prober.join(timeout=90)
    except BaseException:
        log(f"\nserver log (last lines, {server.log_path}):\n{server.log_tail()}")
        raise
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    lags.sort()
    figures = {"probes": len(lags) + len(misses), "seen": len(lags), "missed": len(misses),
               "p50_s": percentile(lags, 50), "p95_s": percentile(lags, 95), "max_s": lags[-1] if lags else None,
               "load_spans_per_s": load["spans_per_s"], "load_errors": load["errors"]}
    info = machine()
    print()
    print(f"tracedash summary lag — {args.duration:g} s of json-1000 load ({load['spans_per_s']:,.0f} spans/s "
          f"acknowledged, {args.concurrency} connections, errors {load['errors']}), beat in-process")
    if lags:
        print(f"summary visible after its batch's 200: p50 {figures['p50_s']:.2f} s, p95 {figures['p95_s']:.2f} s, "
              f"max {figures['max_s']:.2f} s over {len(lags)} probe traces ({len(misses)} not seen within 60 s); "
              f"target p95 <= {TARGET_P95_S:g} s: {'met' if figures['p95_s'] <= TARGET_P95_S and not misses else 'NOT met'}")
    else:
        print("no probe trace was seen")
    print(f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}")
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": None}, "figures": figures}, indent=2) + "\n")
    return 0 if lags and not misses else 1


if __name__ == "__main__":
    sys.exit(main())
