"""The built-in target of load tests: the demo simulator (demo.simulator) in a process of its own,
so that it does not share the generator's GIL, with a known saturation point."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from django.conf import settings

# 32 slots, each request of 20 tokens holds one for 40 + 19 x 6 x (1 + 0.2 x 31/32) ms = 172 ms,
# so it saturates near 186 completions/s. Its paged KV cache (144 blocks of 16 tokens) holds 32
# requests of a 50-token prompt and 20 answer tokens (4 to 5 blocks each) only just: at the knee
# it is full, requests wait and some are preempted, as a vLLM server's at its limit.
DEFAULT_SIMULATOR = {"queue_delay_ms": 2.0, "prefill_ms": 40.0, "prefill_ms_per_token": 0.0,
                     "decode_ms_per_token": 6.0, "capacity": 32, "load_slowdown": 0.2, "jitter": 0.05,
                     "error_rate": 0.0, "kv_cache_blocks": 144, "kv_block_tokens": 16}


class SimulatorError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def simulator_start(config: dict | None = None, *, start_timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start the simulator on a free local port; returns the process and its base URL (``…/v1``).
    Stop it with :func:`simulator_stop`."""
    config = dict(DEFAULT_SIMULATOR if config is None else config)
    port = _free_port()
    handle = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="loadtest-sim-", delete=False)
    with handle:
        json.dump(config, handle)
    process = subprocess.Popen([sys.executable, "-m", "demo.simulator", "--host", "127.0.0.1", "--port", str(port),
                                "--config", handle.name, "--log-level", "warning"],
                               cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_timeout  # a ceiling: a busy machine starts it later
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise SimulatorError("the demo simulator did not start") from None
                time.sleep(0.1)
    finally:
        os.unlink(handle.name)
    return process, f"http://127.0.0.1:{port}/v1"


def simulator_stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
