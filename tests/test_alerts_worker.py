"""A real Celery worker over Redis evaluates the rules (beat embedded in the worker) and delivers
the webhook: tests/support/worker_server.py runs the web app and the worker in one subprocess with
its own chdb data dir and SQLite file; this test ingests over HTTP and receives the webhook here."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid


from tests.conftest import wait_until
from tests.support.webhook_receiver import WebhookReceiver
from tests.support.worker_server import WorkerServer, requires_redis, send_task

BROKER = os.environ.get("TRACEDASH_TEST_ALERTS_BROKER", "redis://127.0.0.1:6379/5")
GiB = 2**30


pytestmark = requires_redis(BROKER)


def _post_samples(url, key, mem_pct):
    body = json.dumps({"samples": [{"host": "worker-gpu", "gpu_index": 0, "time": time.time_ns(),
                                    "gpu_memory_used": int(80 * GiB * mem_pct / 100), "gpu_memory_total": 80 * GiB}]})
    request = urllib.request.Request(url + "/api/v1/resources", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_celery_worker_over_redis_fires_and_resolves_once():
    with WebhookReceiver() as hook:
        server = WorkerServer(broker=BROKER, queue=f"alerts-test-{uuid.uuid4().hex[:10]}", beat="alerts-evaluate",
                              setup="tests.alerts_support:alerts_project",
                              setup_kwargs={"webhook_url": hook.url + "/worker"},
                              env={"TRACEDASH_ALERTS_EVALUATE_SECONDS": "1"})
        with server:
            key = server.setup["key"]
            _post_samples(server.url, key, 50)
            time.sleep(2.5)  # a couple of rounds below the threshold: nothing is sent
            assert hook.requests == []
            _post_samples(server.url, key, 92)
            # A second beat (or a retry) enqueues the same round meanwhile: the worker's threads run
            # these rounds beside the beat's own; the alert still fires, and notifies, once.
            for _ in range(3):
                send_task(BROKER, server.queue, "alerts.tasks.evaluate")
            try:
                wait_until(lambda: len(hook.requests) >= 1, timeout=30, message="the firing webhook")
                for _ in range(3):  # keep it above: still one notification
                    _post_samples(server.url, key, 93)
                    time.sleep(1)
                _post_samples(server.url, key, 40)
                wait_until(lambda: len(hook.requests) >= 2, timeout=30, message="the resolved webhook")
                time.sleep(2.5)
            except AssertionError:
                raise AssertionError(f"worker log:\n{server.log()}") from None
            log = server.log()
        statuses = [r.json["status"] for r in hook.requests]
        assert statuses == ["firing", "resolved"], statuses
        assert hook.requests[0].json["alerts"][0]["labels"]["host"] == "worker-gpu"
        assert "X-Tracedash-Signature" in hook.requests[0].headers
        assert "alerts.tasks.evaluate" in log and "alerts.tasks.deliver_notification" in log  # both ran in the worker
