"""A real Celery worker over Redis runs the summariser and the rollup task (beat embedded in the
worker, both every second), and the overview page and the series JSON show what they computed:
tests/support/worker_server.py runs the web app and the worker in one subprocess with its own chdb
data dir and SQLite file (chdb opens a data dir from one process only); this test only talks HTTP.
Late roots sent afterwards are counted once."""

from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.request
import uuid

import requests

from tests.conftest import wait_until
from tests.rollup_support import random_trace
from tests.support.worker_server import WorkerServer, requires_redis

BROKER = os.environ.get("TRACEDASH_TEST_ROLLUPS_BROKER", "redis://127.0.0.1:6379/6")
NS = 1_000_000_000


pytestmark = requires_redis(BROKER)


def _send(url: str, key: str, spans: list[dict]) -> None:
    request = urllib.request.Request(url + "/api/v1/traces", data=json.dumps({"spans": spans}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _overview_json(url: str, key: str) -> dict:
    response = requests.get(url + "/api/v1/series/overview", params={"range": "24h"},
                            headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _page_requests(session: requests.Session, url: str) -> int | None:
    html = session.get(url + "/?range=24h", timeout=30).text
    # the Requests tile: its value is the first number after class="value" (inside whatever tags)
    match = re.search(r'data-kpi="requests".*?class="value">(?:\s*<[^>]+>)*\s*([0-9,]+)', html, re.S)
    return int(match.group(1).replace(",", "")) if match else None


def _login(url: str, username: str, password: str) -> requests.Session:
    session = requests.Session()
    session.get(url + "/login/", timeout=30)
    response = session.post(url + "/login/", data={"username": username, "password": password,
                                                   "csrfmiddlewaretoken": session.cookies["csrftoken"]},
                            headers={"Referer": url + "/login/"}, timeout=30)
    assert response.status_code == 200 and "sessionid" in session.cookies, response.text[:500]
    return session


def test_celery_worker_over_redis_builds_the_rollups_the_page_shows():
    rng = random.Random(12)
    now = time.time_ns()
    traces = [random_trace(rng, start_ns=now - rng.randrange(5 * 60 * NS, 3 * 3600 * NS), model=rng.choice(["m1", "m2"]))
              for _ in range(50)]
    complete, rootless = traces[:40], traces[40:]
    server = WorkerServer(broker=BROKER, queue=f"rollups-test-{uuid.uuid4().hex[:10]}",
                          beat="traces-summarize,rollups-update", setup="tests.rollup_support:rollup_worker_project",
                          env={"TRACEDASH_SUMMARIZE_SECONDS": "1", "TRACEDASH_ROLLUP_SECONDS": "1"})
    with server:
        key = server.setup["key"]
        try:
            _send(server.url, key, [s for t in complete for s in t] + [s for t in rootless for s in t[1:]])
            wait_until(lambda: _overview_json(server.url, key)["stats"]["requests"] == 40, timeout=60,
                       message="the worker's rollups to count the 40 rooted traces")
            body = _overview_json(server.url, key)
            assert body["stats"]["e2e_ms"]["p95"] > 0 and sum(b["requests"] for b in body["series"]["buckets"] if b) == 40
            session = _login(server.url, server.setup["username"], server.setup["password"])
            assert _page_requests(session, server.url) == 40
            _send(server.url, key, [t[0] for t in rootless] + complete[0])  # late roots, and a re-sent trace
            wait_until(lambda: _overview_json(server.url, key)["stats"]["requests"] == 50, timeout=60,
                       message="the late roots to be counted")
            time.sleep(3)  # more rounds: still counted once
            assert _overview_json(server.url, key)["stats"]["requests"] == 50
            assert _page_requests(session, server.url) == 50
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nworker log:\n{server.log()}") from None
        log = server.log()
    assert "analytics.tasks.summarize_traces" in log and "analytics.tasks.update_rollups" in log  # ran in the worker
