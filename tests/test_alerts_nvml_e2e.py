"""End to end: the agent's sampler reads a fake NVML whose GPU memory crosses 85 % and falls back,
sends through the real server (uvicorn), the evaluation round runs, and the webhook receiver gets
exactly one firing and one resolved notification."""

from __future__ import annotations

import sys

import pytest

from agent import cli
from alerts.models import AlertRule, AlertSeries
from alerts.services import alerts_evaluate_round, channel_create
from store import get_store
from tests.conftest import wait_until
from tests.fake_nvml import GiB, FakeGpu, FakeNvml
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def _count(project_id):
    return get_store().query("SELECT count() FROM resource_samples WHERE project_id = {p:UInt64} AND gpu_index = 0",
                             {"p": project_id}, tag="tests.alerts.count").scalar()


def test_fake_nvml_crossing_85_percent_gives_one_firing_and_one_resolved(asgi_server, project_with_key, monkeypatch):
    project, key = project_with_key()
    gpu = FakeGpu("GPU-alert-0", memory_used=56 * GiB, memory_total=80 * GiB)  # 70 %
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu]))
    with WebhookReceiver() as hook:
        channel = channel_create(project=project, name="hook", kind="webhook", url=hook.url, group_interval_seconds=0)
        rule = AlertRule.objects.get(project=project, metric="gpu_memory_percent", is_default=True)
        rule.for_seconds = 0  # the default waits 1 min; the test keeps the rest of the default rule
        rule.keep_firing_for_seconds = 0
        rule.save()
        rule.channels.set([channel])
        AlertRule.objects.filter(project=project).exclude(pk=rule.pk).update(enabled=False)

        sent = 0
        for used_gib in (56, 60, 68, 70, 72, 40, 30, 30):  # 70 % 75 % 85 % 87.5 % 90 % 50 % 37.5 % 37.5 %
            gpu.memory_used = used_gib * GiB
            assert cli.main(["--endpoint", asgi_server.url, "--api-key", key, "--once", "--host", "nvml-host"],
                            environ={}) == 0
            sent += 1
            wait_until(lambda: _count(project.pk) >= sent, message="the sample in ClickHouse")
            alerts_evaluate_round(deliver="inline")

        assert [r.json["status"] for r in hook.requests] == ["firing", "resolved"]
        firing = hook.requests[0].json["alerts"][0]
        assert firing["labels"]["host"] == "nvml-host" and firing["labels"]["gpu"] == "0"
        assert firing["value"] == pytest.approx(85.0)  # 68 / 80 GiB: the crossing sample itself
        assert AlertSeries.objects.get(rule=rule).state == "resolved"
