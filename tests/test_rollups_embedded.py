"""Embedded mode (`make run`: no broker): the in-process beat runs the summariser and the rollup
task inside `manage.py serve`, and the series JSON shows their result. Subprocess, own data dir."""

from __future__ import annotations

import json
import random
import time
import urllib.request

from tests.conftest import wait_until
from tests.rollup_support import random_trace
from tests.test_serve import Server, _free_port

NS = 1_000_000_000


def test_embedded_beat_summarises_and_rolls_up(tmp_path):
    server = Server(tmp_path / "var", _free_port())
    server.env.update(TRACEDASH_DEMO="0", TRACEDASH_SUMMARIZE_SECONDS="1", TRACEDASH_ROLLUP_SECONDS="1")
    server.start()
    try:
        key = server.manage("create_project", "embedded-rollups").strip().splitlines()[-1].split()[-1]
        rng = random.Random(21)
        traces = [random_trace(rng, start_ns=time.time_ns() - rng.randrange(2 * 60 * NS, 5 * 3600 * NS)) for _ in range(30)]
        body = json.dumps({"spans": [s for t in traces for s in t]}).encode()
        request = urllib.request.Request(server.base + "/api/v1/traces", data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200

        def overview():
            request = urllib.request.Request(server.base + "/api/v1/series/overview?range=24h",
                                             headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())

        try:
            wait_until(lambda: overview()["stats"]["requests"] == 30, timeout=60, message="the in-process rollups")
        except AssertionError:
            raise AssertionError(f"{overview()['stats']}\n{server.output()[-5000:]}") from None
        stats = overview()["stats"]
        assert stats["e2e_ms"]["p95"] > 0 and stats["output_tokens"] > 0
    finally:
        assert server.interrupt() == 0
