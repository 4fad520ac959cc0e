"""Two evaluation rounds racing on one project (two beats, or a round that outlived its lease)
against the real metadata database (SQLite by default, PostgreSQL when DATABASE_URL is set) and
real ClickHouse samples: the transition and the notification happen exactly once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from alerts import services
from alerts.models import AlertEvent, AlertRule, AlertSeries, EvaluationLease, Notification
from alerts.services import alerts_evaluate_round, channel_create, rule_create
from server.leases import lease_name
from tests.alerts_support import T0, insert_samples, sample
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def firing_setup(project_with_key):
    """A GPU-memory rule with a webhook, its series evaluated once below the threshold; then a
    sample above it, so the next round fires."""
    with WebhookReceiver() as hook:
        project, _ = project_with_key()
        AlertRule.objects.filter(project=project).delete()
        channel = channel_create(project=project, name="hook", kind="webhook", url=hook.url + "/alerts",
                                 group_interval_seconds=0)
        rule = rule_create(project=project, channels=[channel], name="GPU memory", metric="gpu_memory_percent",
                           aggregation="last", window_seconds=60, comparator="gte", threshold=85, for_seconds=0)
        insert_samples([sample(project.pk, T0 - timedelta(seconds=10), mem_pct=80)])
        alerts_evaluate_round(now=T0, deliver="inline")
        assert AlertSeries.objects.get(rule=rule).state == "inactive"
        insert_samples([sample(project.pk, T0 + timedelta(seconds=3), mem_pct=90)])
        yield project, rule, hook


def test_a_round_that_outlived_its_lease_writes_nothing_twice(firing_setup, monkeypatch):
    """Round A reads the series, then stalls past its lease; round B takes the project and fires
    it. When A goes on, its stale write is refused: one firing event, one notification."""
    project, rule, hook = firing_setup
    read, go = threading.Event(), threading.Event()
    real_rule_values = services.metrics.rule_values
    stalled = []

    def rule_values(rule_, candidates):  # the real function; round A waits here once, after its reads
        if threading.current_thread().name == "round-a" and not stalled:
            stalled.append(True)
            read.set()
            assert go.wait(60)
        return real_rule_values(rule_, candidates)

    monkeypatch.setattr(services.metrics, "rule_values", rule_values)
    reports = {}

    def round_a():
        try:
            reports["a"] = alerts_evaluate_round(now=T0 + timedelta(seconds=5), deliver="inline")
        finally:
            connection.close()

    a = threading.Thread(target=round_a, name="round-a")
    a.start()
    try:
        assert read.wait(60), "round A never reached its evaluation"
        # A looks dead to the others: its lease runs out.
        EvaluationLease.objects.filter(name=lease_name(services.LEASE_NAME, project.pk)) \
            .update(expires_at=timezone.now() - timedelta(seconds=1))
        reports["b"] = alerts_evaluate_round(now=T0 + timedelta(seconds=5), deliver="inline")
    finally:
        go.set()
        a.join(60)
    assert reports["b"].transitions == 1 and reports["b"].projects == 1
    assert reports["a"].conflicts == 1 and reports["a"].transitions == 0 and reports["a"].notifications == []
    assert AlertSeries.objects.get(rule=rule).state == "firing"
    assert AlertEvent.objects.filter(rule=rule, to_state="firing").count() == 1
    assert Notification.objects.filter(rule=rule).count() == 1 and len(hook.requests) == 1
    # The next round evaluates the project again as usual: still one notification.
    again = alerts_evaluate_round(now=T0 + timedelta(seconds=10), deliver="inline")
    assert again.projects == 1 and again.conflicts == 0 and len(hook.requests) == 1


def test_two_beats_enqueueing_the_same_round_notify_once(firing_setup):
    """Two beats hand the same round to two workers at the same moment (threads here, each with
    its own database connection): one of them evaluates the project, one notification is sent."""
    project, rule, hook = firing_setup
    barrier = threading.Barrier(2)
    reports, errors = [], []

    def worker():
        try:
            barrier.wait(30)
            reports.append(alerts_evaluate_round(now=T0 + timedelta(seconds=5), deliver="inline"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and len(reports) == 2
    assert sum(r.transitions for r in reports) == 1
    assert AlertEvent.objects.filter(rule=rule, to_state="firing").count() == 1
    assert Notification.objects.filter(rule=rule).count() == 1 and len(hook.requests) == 1
