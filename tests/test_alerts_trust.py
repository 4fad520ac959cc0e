"""Alerts a user can trust: ``for`` needs breaching samples that span it (a single sample never
fires a 5-minute rule, a gap restarts it), informational rules stay off the banner, load-test and
demo traffic do not trip the default rules, and the rule / channel forms speak human (labels,
units, URL checks per channel kind, a test notification that shows what happened)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from alerts.models import AlertEvent, AlertRule, AlertSeries, NotificationChannel
from alerts.services import DEFAULT_RULES, alerts_evaluate_round, channel_create, rule_create
from tests.alerts_support import T0, insert_samples, insert_spans, request, sample
from tests.support.webhook_receiver import WebhookReceiver


@pytest.fixture
def member(make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client = Client()
    client.force_login(user)
    return client, project, user


def only_default(project, name):
    AlertRule.objects.filter(project=project).exclude(name=name).delete()
    return AlertRule.objects.get(project=project, name=name)


def host(project, at, cpu):
    return sample(project.pk, at, host="box", gpu_index=-1, cpu=cpu)


def evaluate_every(project, start, seconds, step=5):
    for t in range(0, seconds + 1, step):
        alerts_evaluate_round(now=start + timedelta(seconds=t), deliver="none", project_ids=[project.pk])


CPU_RULE = "Host CPU > 70 % for 5 min"


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_the_default_cpu_rule_never_fires_on_its_first_sample(project_with_key):
    project, _ = project_with_key()
    rule = only_default(project, CPU_RULE)
    insert_samples([host(project, T0, 99.0)])  # the server's own start-up burst: one sample
    evaluate_every(project, T0 + timedelta(seconds=1), 600, step=15)
    states = list(AlertEvent.objects.filter(rule=rule).order_by("at", "pk").values_list("from_state", "to_state", "reason"))
    # pending at once, then (no sample for the grace period) back to inactive: never firing
    assert [s[:2] for s in states] == [("inactive", "pending"), ("pending", "inactive")]
    assert states[1][2] == "no data for the grace period"


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_the_default_cpu_rule_fires_after_five_minutes_of_samples_and_a_gap_restarts_it(project_with_key):
    project, _ = project_with_key()
    rule = only_default(project, CPU_RULE)
    # samples every 10 s for 200 s, none for 100 s (the agent was down), then every 10 s again
    times = [t for t in range(0, 200, 10)] + [t for t in range(300, 700, 10)]
    insert_samples([host(project, T0 + timedelta(seconds=t), 90.0) for t in times])
    for t in range(5, 700, 10):
        alerts_evaluate_round(now=T0 + timedelta(seconds=t), deliver="none", project_ids=[project.pk])
    series = AlertSeries.objects.get(rule=rule)
    assert series.state == "firing"
    # without the gap it would have fired at ~300 s; after it, 300 s after the sample of 300 s
    assert series.fired_at >= T0 + timedelta(seconds=600)
    assert series.fired_at <= T0 + timedelta(seconds=620)


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_load_test_traffic_does_not_count_toward_the_latency_rules(project_with_key):
    project, _ = project_with_key()
    rule = only_default(project, "P95 end-to-end > 1500 ms")
    now = timezone.now()
    rows = []
    for i in range(30):  # a load test pushing the service to 4 s per request
        trace = request(project.pk, start=now - timedelta(seconds=100 - i), e2e_ms=4000, inference_ms=3500,
                        service="loaded")
        for one in trace:
            one["attributes"] = {"loadtest.run_id": "run-1", "loadtest.step": "3"}
        rows += trace
    for i in range(30):  # and real users at 300 ms on another service
        rows += request(project.pk, start=now - timedelta(seconds=100 - i), e2e_ms=300, inference_ms=200,
                        service="real")
    insert_spans(rows)
    alerts_evaluate_round(now=now, deliver="none", project_ids=[project.pk])
    series = {s.key: s for s in AlertSeries.objects.filter(rule=rule)}
    assert set(series) == {"service=real"}  # the load-tested service has no series at all
    assert series["service=real"].state == "inactive"


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_info_rules_show_on_the_alerts_page_but_never_in_the_banner(member):
    client, project, _ = member
    AlertRule.objects.filter(project=project).delete()
    rule_create(project=project, name="quiet info rule", metric="gpu_memory_percent", aggregation="last",
                window_seconds=60, comparator="gte", threshold=85, severity="info")
    insert_samples([sample(project.pk, timezone.now() - timedelta(seconds=2), mem_pct=95)])
    alerts_evaluate_round(deliver="none", project_ids=[project.pk])
    assert AlertSeries.objects.get(rule__name="quiet info rule").state == "firing"
    page = client.get(f"/alerts/?project={project.pk}").content.decode()
    assert 'id="alerts-firing"' in page and "quiet info rule" in page.split('id="alerts-firing"')[1]
    banner = page.split('id="alerts-banner"')[1].split("</div>")[0]
    assert "quiet info rule" not in banner and "0 alerts firing" in banner and "hidden" in banner
    # a warning rule next to it does show
    rule_create(project=project, name="loud rule", metric="gpu_memory_percent", aggregation="last",
                window_seconds=60, comparator="gte", threshold=85, severity="warning")
    alerts_evaluate_round(deliver="none", project_ids=[project.pk])
    traces = client.get(f"/traces/?project={project.pk}").content.decode()
    banner = traces.split('id="alerts-banner"')[1].split("</div>")[0]
    assert "1 alert firing" in banner and "loud rule" in banner and "quiet info rule" not in banner


def test_default_paging_rules_all_hold_for_a_while():
    # a default rule that pages must never fire on a single sample
    for spec in DEFAULT_RULES:
        assert spec["for_seconds"] >= 60, spec["name"]
    assert {s["name"] for s in DEFAULT_RULES if s["severity"] == "info"} == {
        "GPU utilisation < 50 % for 30 min", "Inference share > 60 %"}


@pytest.mark.django_db
def test_inference_share_rule_is_installed_switched_off(project_with_key):
    # most healthy LLM apps spend over 60 % in inference: on by default it would always be firing
    project, _ = project_with_key()
    rules = {r.name: r.enabled for r in AlertRule.objects.filter(project=project)}
    assert rules.pop("Inference share > 60 %") is False
    assert rules and all(rules.values())


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_seeded_demo_traffic_trips_no_default_rule(asgi_server, project_with_key):
    import tracedash_sdk as td
    from demo.simulator import serve
    from demo.workload import DemoApp, simulator_config

    project, key = project_with_key()
    tracer = td.Tracer(endpoint=asgi_server.url, api_key=key, service="chat-api")
    with serve(simulator_config(seed=11)) as sim:
        app = DemoApp(tracer, sim.url, seed=11)
        with ThreadPoolExecutor(3) as pool:  # the demo loop's three threads
            list(pool.map(lambda _: app.handle_request(), range(60)))
    assert tracer.flush(30.0)
    tracer.shutdown()
    now = timezone.now() + timedelta(seconds=1)
    alerts_evaluate_round(now=now, deliver="none", project_ids=[project.pk])
    series = list(AlertSeries.objects.filter(project=project).select_related("rule"))
    seen = {s.rule.name: s for s in series}
    # every enabled default latency rule saw the demo's requests (inference share is off by default) …
    for name in ("P95 end-to-end > 1500 ms", "Network P95 > 200 ms"):
        assert name in seen and seen[name].value is not None, name
    assert "Inference share > 60 %" not in seen
    # … and no default rule is even pending (breaching)
    breaching = {(s.rule.name, s.key, s.value) for s in series if s.state in ("pending", "firing")}
    assert breaching == set()
    # with room to spare: a demo whose P95 sits near 1500 ms (it used to be ~1450 ms) crosses it in
    # some 5-minute windows and pages; a healthy demo stays far from the line
    assert seen["P95 end-to-end > 1500 ms"].value < 1250 and seen["Network P95 > 200 ms"].value < 200


# --- forms ------------------------------------------------------------------------------------------

CHANNEL = {"group_wait_seconds": 0, "group_interval_seconds": 60, "repeat_interval_seconds": 3600,
           "send_resolved": "on", "enabled": "on"}


@pytest.mark.django_db
@pytest.mark.parametrize("kind, url, error", [
    ("slack", "ftp://hooks.slack.com/services/x", "must start with https://"),
    ("webhook", "ftp://example.com/hook", "must start with http:// or https://"),
    ("slack", "http://hooks.slack.com/services/x", "must start with https://"),
    ("webhook", "", "a webhook URL is required"),
])
def test_channel_urls_are_checked_per_kind(member, kind, url, error):
    client, project, _ = member
    response = client.post(f"/alerts/channels/new/?project={project.pk}",
                           {"name": "ops", "kind": kind, "url": url, **CHANNEL}, follow=True)
    assert not NotificationChannel.objects.filter(project=project).exists()
    assert error in response.content.decode()


@pytest.mark.django_db
def test_channel_urls_that_fit_their_kind_and_emails_are_accepted(member):
    client, project, _ = member
    for name, kind, extra in (("a", "slack", {"url": "https://hooks.slack.com/services/T/B/x"}),
                              ("b", "slack", {"url": "https://chat.example.com/hooks/abc"}),
                              ("c", "webhook", {"url": "http://10.0.0.5:9000/alerts"}),
                              ("d", "email", {"emails": "ops@example.com, oncall@example.com"})):
        client.post(f"/alerts/channels/new/?project={project.pk}", {"name": name, "kind": kind, **extra, **CHANNEL})
    assert sorted(NotificationChannel.objects.filter(project=project).values_list("name", flat=True)) == ["a", "b", "c", "d"]
    bad = client.post(f"/alerts/channels/new/?project={project.pk}",
                      {"name": "e", "kind": "email", "emails": "ops@example.com, nope", **CHANNEL}, follow=True)
    assert "&#x27;nope&#x27; is not an email address" in bad.content.decode()


@pytest.mark.clickhouse  # the rule editor draws its preview from the store
@pytest.mark.django_db
def test_forms_show_human_labels_and_units(member):
    client, project, _ = member
    page = client.get(f"/alerts/?project={project.pk}").content.decode()
    for text in ("Wait before the first notification (seconds)", "Signing secret (webhook)", "Email addresses",
                 "For (hours)", "Matching alerts"):
        assert text in page, text
    editor = client.get(f"/alerts/rules/new/?project={project.pk}").content.decode()
    for text in ("Window (seconds)", "Hold for (minutes)", "Keep firing for (minutes)", "GPU number",
                 "— (not a phase-share rule)", "info shows on this page only", "alerts-rule-form.js"):
        assert text in editor, text
    assert "Gpu index" not in editor and "For seconds" not in editor and "---------" not in editor
    cpu = AlertRule.objects.get(project=project, name=CPU_RULE)
    edit = client.get(f"/alerts/rules/{cpu.pk}/?project={project.pk}").content.decode()
    assert "Threshold (%)" in edit and 'name="for_minutes" value="5"' in edit
    p95 = AlertRule.objects.get(project=project, name="P95 end-to-end > 1500 ms")
    assert "Threshold (ms)" in client.get(f"/alerts/rules/{p95.pk}/?project={project.pk}").content.decode()


@pytest.mark.django_db
def test_send_test_notification_reports_delivery_and_errors(member, closed_port_url):
    client, project, _ = member
    with WebhookReceiver() as hook:
        channel = channel_create(project=project, name="hook", kind="webhook", url=hook.url + "/alerts", secret="k")
        page = client.post(f"/alerts/channels/{channel.pk}/test/?project={project.pk}", follow=True)
        assert "Test notification to &#x27;hook&#x27; delivered (HTTP 200)" in page.content.decode()
        assert len(hook.requests) == 1
        body = hook.requests[0].json
        assert body["test"] is True and body["status"] == "firing" and body["project"]["name"] == project.name
        assert hook.requests[0].headers["X-Tracedash-Signature"].startswith("sha256=")
        hook.fail_next(503)
        page = client.post(f"/alerts/channels/{channel.pk}/test/?project={project.pk}", follow=True).content.decode()
        assert "Test notification to &#x27;hook&#x27; failed: HTTP 503" in page
    down = channel_create(project=project, name="down", kind="slack", url=closed_port_url)
    page = client.post(f"/alerts/channels/{down.pk}/test/?project={project.pk}", follow=True).content.decode()
    assert "Test notification to &#x27;down&#x27; failed: URLError" in page


@pytest.mark.django_db
def test_the_migration_updates_untouched_old_default_rules_only(project_with_key):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("alerts.migrations.0003_default_rules_sustained")
    project, _ = project_with_key()
    other, _ = project_with_key()
    AlertRule.objects.filter(project=project, name=CPU_RULE).update(window_seconds=300, for_seconds=0)  # as installed before
    AlertRule.objects.filter(project=other, name=CPU_RULE).update(window_seconds=300, for_seconds=0, threshold=90)
    AlertRule.objects.filter(project=other, name="P95 end-to-end > 1500 ms").update(for_seconds=120)  # edited
    migration.forwards(apps, None)
    cpu = AlertRule.objects.get(project=project, name=CPU_RULE)
    assert (cpu.window_seconds, cpu.for_seconds) == (60, 300)
    assert AlertRule.objects.get(project=other, name="P95 end-to-end > 1500 ms").for_seconds == 120
    share = "Inference share > 60 %"
    AlertRule.objects.filter(name=share).update(enabled=True)  # as installed before
    AlertRule.objects.filter(project=other, name=share).update(enabled=True, threshold=75)  # edited
    migration.forwards(apps, None)
    assert AlertRule.objects.get(project=project, name=share).enabled is False
    assert AlertRule.objects.get(project=other, name=share).enabled is True
    edited = AlertRule.objects.get(project=other, name=CPU_RULE)  # its owner changed the threshold: left alone
    assert (edited.window_seconds, edited.for_seconds, edited.threshold) == (300, 0, 90)


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_gpu_memory_for_one_minute_fires_after_a_minute_of_agent_samples(project_with_key):
    project, _ = project_with_key()
    rule = only_default(project, "GPU memory ≥ 85 %")
    # an agent sampling every 3 s crosses 85 % at T0 and stays there; rounds every 5 s see the newest sample
    insert_samples([sample(project.pk, T0 + timedelta(seconds=t), mem_pct=91) for t in range(0, 90, 3)])
    fired = None
    for t in range(1, 90, 5):
        alerts_evaluate_round(now=T0 + timedelta(seconds=t), deliver="none", project_ids=[project.pk])
        if fired is None and AlertSeries.objects.get(rule=rule).state == "firing":
            fired = t
    assert fired is not None and 60 <= fired <= 66  # the first round after the sample of 60 s
