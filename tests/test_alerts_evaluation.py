"""Evaluation rounds over real ClickHouse data at scripted times: per-series states, missing data,
late samples, flapping, grouping, silences, acknowledgements, errors, notifications delivered to a
real local HTTP receiver (webhook, Slack) and to Django's email outbox."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.core import mail

from alerts import metrics, services
from alerts.models import AlertEvent, AlertRule, AlertSeries, DeliveryAttempt, Notification
from alerts.services import alerts_evaluate_round, channel_create, rule_create, series_acknowledge, silence_create
from tests.alerts_support import GiB, T0, insert_samples, insert_spans, request, sample
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


@pytest.fixture
def project(project_with_key):
    project, _ = project_with_key()
    AlertRule.objects.filter(project=project).delete()  # the default rules are tested on their own
    return project


@pytest.fixture
def hook():
    with WebhookReceiver() as receiver:
        yield receiver


def gpu_rule(project, channels=(), **overrides):
    fields = dict(name="GPU memory ≥ 85 %", metric="gpu_memory_percent", aggregation="last", window_seconds=60,
                  comparator="gte", threshold=85, for_seconds=0)
    fields.update(overrides)
    return rule_create(project=project, channels=channels, **fields)


def webhook(project, hook, **timers):
    timers.setdefault("group_interval_seconds", 0)
    return channel_create(project=project, name=f"hook-{len(timers)}-{timers.get('group_interval_seconds')}",
                          kind="webhook", url=hook.url + "/alerts", secret="s3cret", **timers)


def evaluate(at):
    return alerts_evaluate_round(now=at, deliver="inline")


def states(rule):
    return {s.key: s.state for s in AlertSeries.objects.filter(rule=rule)}


def test_crossing_fires_once_then_resolves_once_with_signed_webhooks(project, hook):
    rule = gpu_rule(project, channels=[webhook(project, hook)])
    insert_samples([sample(project.pk, T0 - timedelta(seconds=10), mem_pct=80)])
    evaluate(T0)
    assert states(rule) == {"host=gpu-1,gpu=0": "inactive"} and hook.requests == []

    insert_samples([sample(project.pk, T0 + timedelta(seconds=3), mem_pct=90)])
    report = evaluate(T0 + timedelta(seconds=5))
    assert report.transitions == 1 and states(rule) == {"host=gpu-1,gpu=0": "firing"}
    assert len(hook.requests) == 1
    got = hook.requests[0]
    body = got.json
    assert body["status"] == "firing" and body["firing"] == 1 and body["rule"]["name"] == rule.name
    alert = body["alerts"][0]
    assert alert["labels"]["host"] == "gpu-1" and alert["labels"]["gpu"] == "0"
    assert alert["value"] == pytest.approx(90, abs=0.01)
    ts = got.headers["X-Tracedash-Timestamp"]
    expected = "sha256=" + hmac.new(b"s3cret", ts.encode() + b"." + got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(got.headers["X-Tracedash-Signature"], expected)

    evaluate(T0 + timedelta(seconds=10))  # still firing, unchanged: nothing new
    assert len(hook.requests) == 1
    insert_samples([sample(project.pk, T0 + timedelta(seconds=12), mem_pct=70)])
    evaluate(T0 + timedelta(seconds=15))
    assert states(rule) == {"host=gpu-1,gpu=0": "resolved"}
    assert [r.json["status"] for r in hook.requests] == ["firing", "resolved"]
    resolved = hook.requests[1].json["alerts"][0]
    assert resolved["status"] == "resolved" and resolved["endsAt"]
    history = list(AlertEvent.objects.filter(rule=rule).order_by("at").values_list("from_state", "to_state"))
    assert history == [("inactive", "firing"), ("firing", "resolved")]


def test_one_series_per_gpu_and_only_the_hot_one_fires(project):
    rule = gpu_rule(project)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=5), gpu_index=0, mem_pct=40),
                    sample(project.pk, T0 - timedelta(seconds=5), gpu_index=1, mem_pct=95),
                    sample(project.pk, T0 - timedelta(seconds=5), host="gpu-2", gpu_index=0, mem_pct=86),
                    sample(project.pk, T0 - timedelta(seconds=5), gpu_index=-1, cpu=99)])  # a host row is no GPU
    evaluate(T0)
    assert states(rule) == {"host=gpu-1,gpu=0": "inactive", "host=gpu-1,gpu=1": "firing", "host=gpu-2,gpu=0": "firing"}
    scoped = gpu_rule(project, name="only gpu-2", host="gpu-2")
    evaluate(T0 + timedelta(seconds=1))
    assert states(scoped) == {"host=gpu-2,gpu=0": "firing"}


def test_host_cpu_average_over_the_window_from_host_rows(project):
    rule = rule_create(project=project, name="cpu", metric="host_cpu_percent", aggregation="avg", window_seconds=300,
                       comparator="gt", threshold=70)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=s), gpu_index=-1, cpu=c)
                    for s, c in ((250, 90), (150, 90), (50, 40))])  # mean 73.3
    insert_samples([sample(project.pk, T0 - timedelta(seconds=10), gpu_index=0, mem_pct=10)])
    evaluate(T0)
    series = AlertSeries.objects.get(rule=rule)
    assert series.key == "host=gpu-1" and series.state == "firing"
    assert series.value == pytest.approx((90 + 90 + 40) / 3, abs=0.01)


def test_late_and_out_of_order_samples(project):
    rule = gpu_rule(project)
    # a breaching sample that arrives late, stamped before the window: it cannot fire now
    insert_samples([sample(project.pk, T0 - timedelta(seconds=120), mem_pct=99),
                    sample(project.pk, T0 - timedelta(seconds=20), mem_pct=50)])
    evaluate(T0)
    assert states(rule) == {"host=gpu-1,gpu=0": "inactive"}
    # an older sample arriving after a newer one does not replace the latest value
    insert_samples([sample(project.pk, T0 - timedelta(seconds=30), mem_pct=99)])
    evaluate(T0 + timedelta(seconds=1))
    assert states(rule) == {"host=gpu-1,gpu=0": "inactive"}
    # a late sample that is the newest in the window counts at the next round
    insert_samples([sample(project.pk, T0 - timedelta(seconds=2), mem_pct=91)])
    evaluate(T0 + timedelta(seconds=2))
    assert states(rule) == {"host=gpu-1,gpu=0": "firing"}


def test_samples_stop_no_data_is_flagged_then_the_series_resolves_after_grace(project, hook):
    rule = gpu_rule(project, channels=[webhook(project, hook)], missing_grace_seconds=200)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=95)])
    evaluate(T0)
    for s in range(10, 130, 10):
        evaluate(T0 + timedelta(seconds=60 + s))  # the sample left the 60 s window at T0+59 s
    series = AlertSeries.objects.get(rule=rule)
    assert series.state == "firing" and series.no_data and series.value == pytest.approx(95, abs=0.01)
    assert len(hook.requests) == 1
    evaluate(T0 + timedelta(seconds=205))  # last seen by the round at T0: 205 s >= 200 s grace
    series.refresh_from_db()
    assert series.state == "resolved" and series.no_data
    assert [r.json["status"] for r in hook.requests] == ["firing", "resolved"]
    assert AlertEvent.objects.filter(rule=rule, to_state="resolved").get().reason == "no data for the grace period"


def test_a_gpu_without_memory_figures_is_missing_not_zero(project):
    rule = gpu_rule(project, comparator="lt", threshold=5, name="almost empty")
    insert_samples([sample(project.pk, T0 - timedelta(seconds=5), mem_pct=None, util=50)])
    evaluate(T0)
    assert not AlertSeries.objects.filter(rule=rule).exists()  # nothing to compare: no series, no alert


def test_flapping_stream_makes_no_notification_storm(project, hook):
    channel = webhook(project, hook, group_interval_seconds=60)
    rule = gpu_rule(project, channels=[channel])
    quiet = gpu_rule(project, name="with for", for_seconds=30, channels=[channel])
    rows = [sample(project.pk, T0 + timedelta(seconds=5 * i - 1), mem_pct=90 if i % 2 == 0 else 80) for i in range(120)]
    insert_samples(rows)
    for i in range(120):  # ten minutes, evaluated every 5 s, crossing the threshold at every round
        evaluate(T0 + timedelta(seconds=5 * i))
    transitions = AlertEvent.objects.filter(rule=rule).count()
    assert transitions >= 100  # it really flapped
    sent = [r.json for r in hook.requests]
    assert all(n["rule"]["id"] == rule.pk for n in sent)  # the rule with `for` never fired
    assert AlertEvent.objects.filter(rule=quiet, to_state="firing").count() == 0
    assert 1 <= len(sent) <= 11  # at most one per group_interval (60 s) over 600 s, plus the first
    assert Notification.objects.filter(rule=rule).count() == len(sent)


def test_group_wait_batches_series_that_fire_together_and_repeat_interval_repeats(project, hook):
    channel = webhook(project, hook, group_wait_seconds=10, group_interval_seconds=30, repeat_interval_seconds=300)
    gpu_rule(project, channels=[channel])
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), gpu_index=0, mem_pct=90)])
    evaluate(T0)
    assert hook.requests == []  # group_wait
    insert_samples([sample(project.pk, T0 + timedelta(seconds=4), gpu_index=1, mem_pct=92)])
    evaluate(T0 + timedelta(seconds=5))
    assert hook.requests == []
    for s in range(0, 60, 5):
        insert_samples([sample(project.pk, T0 + timedelta(seconds=s + 9), gpu_index=g, mem_pct=90) for g in (0, 1)])
    evaluate(T0 + timedelta(seconds=10))
    assert len(hook.requests) == 1 and hook.requests[0].json["firing"] == 2  # both, in one notification
    evaluate(T0 + timedelta(seconds=50))
    assert len(hook.requests) == 1  # unchanged, before repeat_interval
    insert_samples([sample(project.pk, T0 + timedelta(seconds=s), gpu_index=g, mem_pct=90)
                    for s in range(60, 320, 20) for g in (0, 1)])
    evaluate(T0 + timedelta(seconds=311))
    assert len(hook.requests) == 2 and hook.requests[1].json["firing"] == 2  # repeated after 300 s


def test_acknowledged_alerts_are_not_repeated(project, hook, make_user):
    channel = webhook(project, hook, repeat_interval_seconds=60)
    rule = gpu_rule(project, channels=[channel])
    insert_samples([sample(project.pk, T0 + timedelta(seconds=s), mem_pct=90) for s in range(-5, 200, 10)])
    evaluate(T0)
    series_acknowledge(series=AlertSeries.objects.get(rule=rule), user=make_user())
    evaluate(T0 + timedelta(seconds=70))
    evaluate(T0 + timedelta(seconds=140))
    assert len(hook.requests) == 1


def test_silenced_series_are_not_notified_until_the_silence_ends(project, hook):
    channel = webhook(project, hook)
    rule = gpu_rule(project, channels=[channel])
    silence_create(project=project, matchers=[{"label": "host", "op": "=~", "value": "gpu-.*"},
                                              {"label": "alertname", "op": "=", "value": rule.name}],
                   starts_at=T0 - timedelta(minutes=1), ends_at=T0 + timedelta(seconds=30))
    insert_samples([sample(project.pk, T0 + timedelta(seconds=s), mem_pct=90) for s in range(-5, 60, 5)])
    evaluate(T0)
    evaluate(T0 + timedelta(seconds=20))
    assert states(rule) == {"host=gpu-1,gpu=0": "firing"} and hook.requests == []
    evaluate(T0 + timedelta(seconds=35))
    assert len(hook.requests) == 1 and hook.requests[0].json["status"] == "firing"


def test_silence_matchers_are_validated():
    from alerts.silences import MatcherError, matchers_validate

    with pytest.raises(MatcherError, match=r"matchers\[0\]\.op"):
        matchers_validate([{"label": "host", "op": "~", "value": "x"}])
    with pytest.raises(MatcherError, match="regular expression"):
        matchers_validate([{"label": "host", "op": "=~", "value": "("}])


def test_retries_with_backoff_and_a_record_of_every_attempt(project, hook):
    rule = gpu_rule(project, channels=[webhook(project, hook)])
    hook.fail_next(503, 500)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    evaluate(T0)
    notification = Notification.objects.get(rule=rule)
    assert notification.status == "pending" and notification.attempts == 1
    assert notification.next_attempt_at == T0 + timedelta(seconds=services.BACKOFF_SECONDS[0])
    services.notifications_deliver_due(now=T0 + timedelta(seconds=1))  # not due yet
    assert Notification.objects.get(pk=notification.pk).attempts == 1
    services.notifications_deliver_due(now=T0 + timedelta(seconds=5))
    services.notifications_deliver_due(now=T0 + timedelta(seconds=5 + 15))
    notification.refresh_from_db()
    assert notification.status == "sent" and notification.attempts == 3
    assert [(a.ok, a.status_code) for a in DeliveryAttempt.objects.filter(notification=notification)] == \
        [(False, 503), (False, 500), (True, 200)]
    assert len(hook.requests) == 1


def test_a_refusing_receiver_fails_without_retries(project, hook):
    rule = gpu_rule(project, channels=[webhook(project, hook)])
    hook.fail_next(400)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    evaluate(T0)
    notification = Notification.objects.get(rule=rule)
    assert notification.status == "failed" and "HTTP 400" in notification.last_error


def test_unreachable_receiver_is_retried(project, closed_port_url):
    channel = channel_create(project=project, name="down", kind="webhook", url=closed_port_url, group_interval_seconds=0)
    rule = gpu_rule(project, channels=[channel])
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    evaluate(T0)
    notification = Notification.objects.get(rule=rule)
    assert notification.status == "pending" and notification.last_error


def test_slack_format_and_email_outbox(project, hook):
    slack = channel_create(project=project, name="slack", kind="slack", url=hook.url + "/slack", group_interval_seconds=0)
    email = channel_create(project=project, name="mail", kind="email", emails="oncall@example.com, b@example.com",
                           group_interval_seconds=0)
    rule = gpu_rule(project, channels=[slack, email], runbook="Add a replica.")
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    evaluate(T0)
    assert len(hook.requests) == 1 and hook.requests[0].path == "/slack"
    message = hook.requests[0].json
    assert message["text"].startswith(":rotating_light: [FIRING:1] GPU memory ≥ 85 %")
    assert message["attachments"][0]["color"] == "danger" and "host=gpu-1, gpu=0" in message["attachments"][0]["title"]
    assert message["attachments"][-1] == {"title": "Runbook", "text": "Add a replica."}
    assert len(mail.outbox) == 1
    sent = mail.outbox[0]
    assert sent.to == ["oncall@example.com", "b@example.com"]
    assert sent.subject.startswith("[tracedash FIRING] GPU memory ≥ 85 %") and "host=gpu-1" in sent.body
    insert_samples([sample(project.pk, T0 + timedelta(seconds=4), mem_pct=10)])
    evaluate(T0 + timedelta(seconds=5))
    assert len(mail.outbox) == 2 and mail.outbox[1].subject.startswith("[tracedash RESOLVED]")
    assert hook.requests[1].json["text"].startswith(":white_check_mark: [RESOLVED]")
    assert AlertSeries.objects.get(rule=rule).state == "resolved"


def test_a_failing_query_is_recorded_on_its_rules_and_the_others_still_run(project, monkeypatch):
    good = gpu_rule(project)
    bad = rule_create(project=project, name="p95", metric="e2e_p95_ms", aggregation="window", window_seconds=300,
                      comparator="gt", threshold=1500)
    real = metrics.fetch

    def fetch(**kwargs):
        if kwargs["source"] == "spans":
            raise RuntimeError("spans table unreadable")
        return real(**kwargs)

    monkeypatch.setattr(metrics, "fetch", fetch)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    report = evaluate(T0)
    assert report.errors == {bad.pk: "RuntimeError: spans table unreadable"}
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.last_error == "RuntimeError: spans table unreadable" and bad.last_error_at == T0
    assert good.last_error == "" and good.last_evaluated_at == T0
    assert states(good) == {"host=gpu-1,gpu=0": "firing"}


def test_process_leak_ratio_against_its_first_ten_minutes(project):
    rule = rule_create(project=project, name="leak", metric="process_leak_ratio", aggregation="window",
                       window_seconds=120, comparator="gt", threshold=1.5)
    start = T0 - timedelta(minutes=30)
    rows = []
    for minute in range(31):
        grown = 10 * GiB if minute < 10 else int(10 * GiB * (1 + minute / 30 * 0.8))  # ends at 1.8× baseline
        steady = 4 * GiB
        rows.append(sample(project.pk, start + timedelta(minutes=minute), mem_pct=50,
                           processes=[(101, "vllm", grown), (202, "embedder", steady)]))
    insert_samples(rows)
    evaluate(T0)
    series = {s.labels["pid"]: s for s in AlertSeries.objects.filter(rule=rule)}
    assert series["101"].state == "firing" and series["101"].value == pytest.approx(1.8, rel=0.01)
    assert series["101"].labels["process"] == "vllm"
    assert series["202"].state == "inactive" and series["202"].value == pytest.approx(1.0)


def test_latency_rules_from_raw_spans(project):
    p95 = rule_create(project=project, name="p95", metric="e2e_p95_ms", aggregation="window", window_seconds=300,
                      comparator="gt", threshold=1500)
    share = rule_create(project=project, name="share", metric="phase_share_percent", phase="inference",
                        aggregation="window", window_seconds=300, comparator="gt", threshold=60)
    net = rule_create(project=project, name="net", metric="network_p95_ms", aggregation="window", window_seconds=300,
                      comparator="gt", threshold=200)
    errors = rule_create(project=project, name="errors", metric="error_rate_percent", aggregation="window",
                         window_seconds=300, comparator="gt", threshold=5)
    rate = rule_create(project=project, name="rate", metric="request_rate", aggregation="window", window_seconds=300,
                       comparator="lt", threshold=0.001)
    ttft = rule_create(project=project, name="ttft", metric="ttft_p95_ms", aggregation="window", window_seconds=300,
                       comparator="gt", threshold=400, service="chat-api")
    rows = []
    for i in range(20):  # chat-api: e2e 1000 … 2900 ms, inference 70 % of it, network 100 ms, 2 errors
        e2e = 1000 + 100 * i
        rows += request(project.pk, start=T0 - timedelta(seconds=250 - i * 10), e2e_ms=e2e, network_ms=100,
                        inference_ms=0.7 * e2e, status="error" if i < 2 else "ok", ttft_ms=300 + i)
    rows += request(project.pk, start=T0 - timedelta(seconds=100), e2e_ms=100, network_ms=50, service="search")
    rows += request(project.pk, start=T0 - timedelta(seconds=400), e2e_ms=9000, service="search")  # before the window
    dup = rows[0]
    rows.append(dict(dup))  # a re-sent span counts once
    insert_spans(rows)
    evaluate(T0)
    values = {(s.rule.name, s.key): (s.state, s.value) for s in AlertSeries.objects.filter(project=project).select_related("rule")}
    e2e_sorted = sorted(1000 + 100 * i for i in range(20))
    pos = 0.95 * 19
    expected_p95 = e2e_sorted[int(pos)] + (e2e_sorted[int(pos) + 1] - e2e_sorted[int(pos)]) * (pos - int(pos))
    assert values[("p95", "service=chat-api")] == ("firing", pytest.approx(expected_p95))
    assert values[("p95", "service=search")] == ("inactive", pytest.approx(100))
    assert values[("share", "service=chat-api")] == ("firing", pytest.approx(70, abs=0.01))
    assert values[("net", "service=chat-api")] == ("inactive", pytest.approx(100))
    assert values[("errors", "service=chat-api")] == ("firing", pytest.approx(10))
    assert values[("rate", "service=search")] == ("inactive", pytest.approx(1 / 300))
    assert values[("ttft", "service=chat-api")][0] == "inactive" and ("ttft", "service=search") not in values
    assert values[("ttft", "service=chat-api")][1] == pytest.approx(300 + 0.95 * 19)


def test_default_rules_are_installed_for_each_new_project(project_with_key):
    project, _ = project_with_key()
    rules = {r.metric: r for r in AlertRule.objects.filter(project=project)}
    assert set(rules) >= {"gpu_memory_percent", "host_cpu_percent", "gpu_utilization", "process_leak_ratio",
                          "e2e_p95_ms", "phase_share_percent", "network_p95_ms"}
    gpu = rules["gpu_memory_percent"]
    assert (gpu.comparator, gpu.threshold, gpu.for_seconds, gpu.is_default) == ("gte", 85, 60, True)
    assert "used / total" in gpu.explanation and "out-of-memory" in gpu.explanation
    assert all(r.explanation for r in rules.values())
    assert rules["host_cpu_percent"].threshold == 70 and rules["e2e_p95_ms"].threshold == 1500
    evaluate(T0)  # they evaluate without data and without error
    assert not AlertRule.objects.filter(project=project).exclude(last_error="").exists()


def test_the_lease_lets_one_round_run_at_a_time(project):
    from server.leases import leases_claim, leases_release

    gpu_rule(project)
    assert leases_claim(job=services.LEASE_NAME, project_ids=[project.pk], holder="a") == [project.pk]
    assert leases_claim(job=services.LEASE_NAME, project_ids=[project.pk], holder="b") == []
    report = alerts_evaluate_round(now=T0, holder="b", deliver="none")
    assert report.skipped and report.projects == 0 and report.rules == 0
    leases_release(job=services.LEASE_NAME, project_ids=[project.pk], holder="a")
    report = alerts_evaluate_round(now=T0, holder="b", deliver="none")
    assert not report.skipped and report.projects == 1 and report.rules == 1


def test_payload_round_trips_through_json(project, hook):
    gpu_rule(project, channels=[webhook(project, hook)])
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    evaluate(T0)
    payload = Notification.objects.get().payload
    assert json.loads(json.dumps(payload)) == payload


@pytest.mark.django_db(transaction=True)
def test_concurrent_rounds_evaluate_and_notify_once(project_with_key, hook):
    import threading

    project, _ = project_with_key()
    AlertRule.objects.filter(project=project).delete()
    gpu_rule(project, channels=[webhook(project, hook)])
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    barrier = threading.Barrier(4)
    reports = []

    def worker():
        from django.db import connection

        barrier.wait()
        try:
            reports.append(alerts_evaluate_round(now=T0, deliver="inline"))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ran = [r for r in reports if not r.skipped]
    assert len(reports) == 4 and len(ran) >= 1
    assert AlertEvent.objects.filter(to_state="firing").count() == 1
    assert Notification.objects.count() == 1 and len(hook.requests) == 1


@pytest.mark.django_db
def test_a_dead_holders_lease_expires(project):
    from django.utils import timezone

    from alerts.models import EvaluationLease
    from server.leases import lease_name, leases_claim

    assert leases_claim(job=services.LEASE_NAME, project_ids=[project.pk], holder="dead") == [project.pk]
    assert alerts_evaluate_round(now=T0, holder="alive", deliver="none").skipped
    EvaluationLease.objects.filter(name=lease_name(services.LEASE_NAME, project.pk)) \
        .update(expires_at=timezone.now() - timedelta(seconds=1))
    assert alerts_evaluate_round(now=T0, holder="alive", deliver="none").projects == 1


def test_disabling_a_firing_rule_resolves_its_series(project):
    rule = gpu_rule(project)
    insert_samples([sample(project.pk, T0 - timedelta(seconds=1), mem_pct=90)])
    evaluate(T0)
    assert states(rule) == {"host=gpu-1,gpu=0": "firing"}
    AlertRule.objects.filter(pk=rule.pk).update(enabled=False)
    evaluate(T0 + timedelta(seconds=5))
    assert states(rule) == {"host=gpu-1,gpu=0": "resolved"}
    assert AlertEvent.objects.filter(rule=rule).first().reason == "rule disabled"
    from alerts.selectors import alerts_firing

    assert alerts_firing(project_id=project.pk) == []


def test_alert_policy_fires_when_nothing_reports_at_all_and_resolves_when_data_comes(project, hook):
    rule = rule_create(project=project, name="checkout traffic", metric="request_rate", aggregation="window",
                       window_seconds=60, comparator="lt", threshold=0.05, service="checkout", missing_data="alert",
                       channels=[webhook(project, hook)])
    evaluate(T0)
    assert states(rule) == {"": "firing"}
    assert hook.requests[0].json["alerts"][0]["noData"] is True
    assert hook.requests[0].json["alerts"][0]["labels"]["service"] == "checkout"
    rows = []
    for i in range(10):
        rows += request(project.pk, start=T0 + timedelta(seconds=i), e2e_ms=50, service="checkout")
    insert_spans(rows)
    evaluate(T0 + timedelta(seconds=20))
    assert states(rule) == {"": "resolved", "service=checkout": "inactive"}
    assert [r.json["status"] for r in hook.requests] == ["firing", "resolved"]


def test_other_policies_do_not_invent_a_series_without_data(project):
    rule = gpu_rule(project, missing_data="keep_last")
    resolve = gpu_rule(project, name="resolve", missing_data="resolve")
    evaluate(T0)
    assert states(rule) == {} and states(resolve) == {}


def _tiered(project_id, *, start, e2e_ms, tier, service="chat-api"):
    """A request whose inference span carries ``user.tier`` (None: no tier)."""
    rows = request(project_id, start=start, e2e_ms=e2e_ms, inference_ms=0.5 * e2e_ms, service=service)
    if tier is not None:
        rows[1]["attributes"] = {"user.tier": tier}
    return rows


def test_grouped_latency_rule_fires_for_premium_only_and_resolves(project, hook):
    from alerts.preview import rule_preview_figure

    channel = webhook(project, hook)
    premium = rule_create(project=project, name="premium p95", metric="e2e_p95_ms", aggregation="window",
                          window_seconds=300, comparator="gt", threshold=800, for_seconds=60, group_by="user.tier",
                          group_value="premium", channels=[channel])
    every = rule_create(project=project, name="tier p95", metric="e2e_p95_ms", aggregation="window",
                        window_seconds=300, comparator="gt", threshold=800, for_seconds=60, group_by="user.tier")
    assert premium.condition == "P95 end-to-end latency (ms) of user.tier=premium > 800"
    assert every.condition == "P95 end-to-end latency (ms) of user.tier=each value > 800"
    rows = []
    for i in range(21):  # every 10 s from T0-100 s: premium slow (1000 ms, two services), standard fast, untiered slow
        at = T0 + timedelta(seconds=-100 + 10 * i)
        rows += _tiered(project.pk, start=at, e2e_ms=1000, tier="premium", service="chat-api" if i % 2 else "search")
        rows += _tiered(project.pk, start=at + timedelta(seconds=2), e2e_ms=300, tier="standard")
        rows += _tiered(project.pk, start=at + timedelta(seconds=4), e2e_ms=5000, tier=None)
    for i in range(26):  # then premium turns fast, from T0+150 s
        rows += _tiered(project.pk, start=T0 + timedelta(seconds=150 + 10 * i), e2e_ms=200, tier="premium")
    insert_spans(rows)
    evaluate(T0)
    assert states(premium) == {"user.tier=premium": "pending"}
    assert states(every) == {"user.tier=premium": "pending", "user.tier=standard": "inactive"}
    evaluate(T0 + timedelta(seconds=30))
    evaluate(T0 + timedelta(seconds=61))
    assert states(premium) == {"user.tier=premium": "firing"}
    assert states(every) == {"user.tier=premium": "firing", "user.tier=standard": "inactive"}
    series = AlertSeries.objects.get(rule=premium)
    assert series.value == pytest.approx(1000) and series.labels == {"user.tier": "premium"}
    assert len(hook.requests) == 1 and "user.tier=premium" in json.dumps(hook.requests[0].json)
    assert "standard" not in json.dumps(hook.requests[0].json)
    # the preview draws the grouped series
    names = {t.get("name") for t in rule_preview_figure(rule=every, now=T0 + timedelta(seconds=61))["data"]}
    assert {"user.tier=premium", "user.tier=standard"} <= names
    # five minutes on, the window holds only premium's fast requests
    evaluate(T0 + timedelta(seconds=420))
    assert states(premium) == {"user.tier=premium": "resolved"}
    assert AlertSeries.objects.get(rule=premium).value == pytest.approx(200)
    assert len(hook.requests) == 2 and "RESOLVED" in json.dumps(hook.requests[1].json).upper()


def test_rule_form_group_by_validation(project):
    from alerts.forms import RuleForm

    base = {"name": "g", "metric": "e2e_p95_ms", "aggregation": "window", "window_seconds": 60, "comparator": "gt",
            "threshold": 800, "for_minutes": 1, "keep_firing_for_minutes": 0, "missing_grace_minutes": 5,
            "missing_data": "keep_last", "severity": "warning", "enabled": "on"}
    form = RuleForm(data={**base, "group_by": " user.tier ", "group_value": "premium"}, project=project)
    assert form.is_valid(), form.errors
    rule = form.save()
    assert (rule.group_by, rule.group_value) == ("user.tier", "premium")
    form = RuleForm(data={**base, "name": "h", "group_value": "premium"}, project=project)
    assert not form.is_valid() and "needs a group-by attribute" in str(form.errors["group_value"])
    form = RuleForm(data={**base, "name": "i", "metric": "gpu_memory_percent", "aggregation": "last",
                               "group_by": "user.tier"}, project=project)
    assert not form.is_valid() and "only latency rules" in str(form.errors["group_by"])
    form = RuleForm(data={**base, "name": "j", "group_by": "k" * 257}, project=project)
    assert not form.is_valid() and "group_by" in form.errors
