"""One real sample from this machine, printed as JSON, with its basic invariants checked.

    python -m agent.check_gpu            # from the folder that holds agent/
    python agent/check_gpu.py            # the same
    python -m agent.check_gpu --require-gpu   # exit 1 (not 0) when NVML or a GPU is absent

Django-free: needs psutil, and nvidia-ml-py for the GPU part. Exit status 0 when every check
passed, or when NVML is absent (there is nothing to check; one clear line says so); 1 when a check
failed, the failures listed on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):  # run as a file: make ``agent`` importable from the folder above
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.sampler import MAX_PROCESSES, NvmlReader, ResourceSampler, to_payload  # noqa: E402


def check(rows: list[dict]) -> list[str]:
    """The invariants every sample must hold; a list of what is wrong (empty: all good)."""
    problems = []
    host = [r for r in rows if r["gpu_index"] == -1]
    if len(host) != 1:
        problems.append(f"expected one host row, got {len(host)}")
    for row in host:
        if row["cpu_percent"] is None or not 0 <= row["cpu_percent"] <= 100:
            problems.append(f"host cpu_percent {row['cpu_percent']!r} is not within 0..100")
        if not (row["memory_total"] and 0 < row["memory_used"] <= row["memory_total"]):
            problems.append(f"host memory_used {row['memory_used']!r} is not within 0..memory_total {row['memory_total']!r}")
    for row in rows:
        if row["gpu_index"] < 0:
            continue
        name = f"GPU {row['gpu_index']} ({row['gpu_name']}, {row['gpu_uuid']})"
        used, total = row["gpu_memory_used"], row["gpu_memory_total"]
        if not row["gpu_uuid"]:
            problems.append(f"{name}: no UUID")
        if used is None or total is None:
            problems.append(f"{name}: memory not reported (used {used!r}, total {total!r})")
        elif not (total > 0 and 0 <= used <= total):
            problems.append(f"{name}: memory used {used} is not within 0..total {total}")
        util = row["gpu_utilization"]
        if util is not None and not 0 <= util <= 100:
            problems.append(f"{name}: utilisation {util} is not within 0..100")
        temp = row["gpu_temperature"]
        if temp is not None and not 0 < temp < 150:
            problems.append(f"{name}: temperature {temp} °C is implausible")
        power = row["gpu_power_watts"]
        if power is not None and not 0 <= power < 5000:
            problems.append(f"{name}: power {power} W is implausible")
        pids = row["process_pids"]
        if len(pids) != len(set(pids)):
            problems.append(f"{name}: a PID is listed twice: {pids}")
        if len(pids) > MAX_PROCESSES:
            problems.append(f"{name}: {len(pids)} processes, more than the API takes ({MAX_PROCESSES})")
        if total is not None and any(m > total for m in row["process_gpu_memory"]):
            problems.append(f"{name}: a process uses more than the GPU's total memory: {row['process_gpu_memory']}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.check_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-gpu", action="store_true", help="fail (exit 1) when NVML or a GPU is absent")
    args = parser.parse_args(argv)
    nvml = NvmlReader()
    sampler = ResourceSampler(host="check-gpu", nvml=nvml, min_cpu_window=0.5) if nvml.available else None
    if sampler is None:
        print(f"check_gpu: NVML is not available on this machine ({nvml.reason}); no GPU to check.", file=sys.stderr)
        return 1 if args.require_gpu else 0
    try:
        started = time.monotonic()
        rows = sampler.sample()
        took = time.monotonic() - started
    finally:
        sampler.close()
    print(json.dumps({"rows": rows, "payload": to_payload(rows), "sample_seconds": round(took, 3)}, indent=2, default=str))
    problems = check(rows)
    gpus = [r for r in rows if r["gpu_index"] >= 0]
    if not gpus:
        if args.require_gpu:
            problems.append("NVML started but no GPU could be read")
        print("check_gpu: NVML is available but reports no readable GPU.", file=sys.stderr)
    for problem in problems:
        print(f"check_gpu: FAILED: {problem}", file=sys.stderr)
    if problems:
        return 1
    summary = ", ".join(f"GPU {r['gpu_index']} {r['gpu_name']}: {100 * r['gpu_memory_used'] / r['gpu_memory_total']:.1f} % memory, "
                        f"{r['gpu_utilization']} % util, {len(r['process_pids'])} process(es)" for r in gpus)
    print(f"check_gpu: OK: {len(gpus)} GPU(s) sampled{': ' + summary if summary else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
