"""The /alerts/ pages, the editor's preview, acknowledgements and silences from the UI, the banner
on every page, and the live push over the alerts websocket."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from alerts.models import AlertRule, AlertSeries, NotificationChannel, Silence
from alerts.services import alerts_evaluate_round, rule_create
from config.asgi import application
from tests.alerts_support import insert_samples, sample

XSS = "<script>alert(1)</script>"


@pytest.fixture
def member(make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client = Client()
    client.force_login(user)
    return client, project, user


def _fire(project, name=XSS):
    rule = rule_create(project=project, name=name, metric="gpu_memory_percent", aggregation="last", window_seconds=60,
                       comparator="gte", threshold=85)
    insert_samples([sample(project.pk, timezone.now() - timedelta(seconds=2), host=f"h{XSS}", mem_pct=95)])
    alerts_evaluate_round(deliver="none")
    return rule


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_alerts_page_lists_firing_rules_escaped_and_the_banner_shows_on_every_page(member):
    client, project, _ = member
    _fire(project)
    page = client.get(f"/alerts/?project={project.pk}")
    assert page.status_code == 200
    html = page.content.decode()
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'id="alerts-firing"' in html and "GPU memory ≥ 85 %" in html  # a default rule is listed too
    assert "scale out before out-of-memory errors" in html  # with why it matters
    traces = client.get("/traces/").content.decode()
    assert 'id="alerts-banner"' in traces and "1 alert firing" in traces and XSS not in traces
    firing = client.get("/alerts/firing.json").json()
    assert firing["firing"][0]["rule"] == XSS and firing["firing"][0]["labels"]["host"] == f"h{XSS}"


@pytest.mark.django_db
def test_banner_is_hidden_when_nothing_fires(member):
    client, project, _ = member
    html = client.get("/alerts/").content.decode()
    assert 'id="alerts-banner"' in html and 'hidden>' in html.split('id="alerts-banner"')[1].split("</div>")[0] + ">"


@pytest.mark.django_db
def test_other_projects_rules_and_pages_are_404(member, project_with_key):
    client, project, _ = member
    other, _ = project_with_key()
    rule = AlertRule.objects.filter(project=other).first()
    assert client.get(f"/alerts/?project={other.pk}").status_code == 404
    assert client.get(f"/alerts/rules/{rule.pk}/").status_code == 404
    assert client.post(f"/alerts/rules/{rule.pk}/delete/").status_code == 404
    assert AlertRule.objects.filter(pk=rule.pk).exists()
    assert Client().get("/alerts/").status_code == 302  # anonymous: to the login page


@pytest.mark.django_db
def test_rule_editor_creates_and_validates(member):
    client, project, _ = member
    response = client.post(f"/alerts/rules/new/?project={project.pk}", {
        "name": "hot GPU", "metric": "gpu_temperature", "aggregation": "max", "window_seconds": 120,
        "comparator": "gt", "threshold": 83, "for_minutes": 1, "keep_firing_for_minutes": 0.5,
        "missing_data": "keep_last", "missing_grace_minutes": 5, "severity": "warning", "enabled": "on"})
    assert response.status_code == 302
    rule = AlertRule.objects.get(project=project, name="hot GPU")
    assert (rule.metric, rule.aggregation, rule.threshold) == ("gpu_temperature", "max", 83)
    assert (rule.for_seconds, rule.keep_firing_for_seconds, rule.missing_grace_seconds) == (60, 30, 300)
    bad = client.post(f"/alerts/rules/new/?project={project.pk}", {
        "name": "hot GPU", "metric": "gpu_temperature", "aggregation": "window", "window_seconds": 1,
        "comparator": "gt", "threshold": "x", "missing_data": "keep_last", "severity": "warning"})
    assert bad.status_code == 200
    errors = bad.context["form"].errors
    assert {"name", "aggregation", "window_seconds", "threshold"} <= set(errors)


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_rule_editor_preview_draws_the_metric_against_the_threshold(member):
    client, project, _ = member
    now = timezone.now()
    insert_samples([sample(project.pk, now - timedelta(minutes=m), mem_pct=60 + m) for m in range(0, 30, 3)])
    rule = AlertRule.objects.get(project=project, metric="gpu_memory_percent")
    page = client.get(f"/alerts/rules/{rule.pk}/")
    assert page.status_code == 200
    figure = page.context["figure"]
    assert figure["data"][0]["name"] == "host=gpu-1,gpu=0" and len(figure["data"][0]["y"]) == 10
    assert max(figure["data"][0]["y"]) == pytest.approx(87, abs=0.01)
    assert figure["layout"]["shapes"][0]["y0"] == 85  # the threshold line
    assert 'id="fig-rule-preview"' in page.content.decode() and "plotly" in page.content.decode()
    # an unsaved rule previews from a POST with preview=1 (the CSRF token stays out of URLs); nothing is saved
    rules = AlertRule.objects.filter(project=project).count()
    preview = client.post(f"/alerts/rules/new/?project={project.pk}", {
        "preview": "1", "name": "x", "metric": "host_cpu_percent", "aggregation": "avg", "window_seconds": 60,
        "comparator": "gt", "threshold": 70, "missing_data": "keep_last", "severity": "info", "for_minutes": 0,
        "keep_firing_for_minutes": 0, "missing_grace_minutes": 5})
    assert preview.status_code == 200 and preview.context["figure"]["layout"]["shapes"][0]["y0"] == 70
    assert AlertRule.objects.filter(project=project).count() == rules
    html = preview.content.decode()
    assert 'formmethod="get"' not in html and 'name="preview"' in html


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_acknowledge_and_silence_from_the_ui(member):
    client, project, user = member
    rule = _fire(project, name="hot")
    series = AlertSeries.objects.get(rule=rule)
    assert client.post(f"/alerts/series/{series.pk}/ack/?project={project.pk}").status_code == 302
    series.refresh_from_db()
    assert series.acknowledged_by == user and series.acknowledged_at
    response = client.post(f"/alerts/silences/new/?project={project.pk}",
                           {"matchers": "alertname=hot\nhost=~h.*", "hours": "1", "comment": "maintenance"})
    assert response.status_code == 302
    silence = Silence.objects.get(project=project)
    assert silence.matchers == [{"label": "alertname", "op": "=", "value": "hot"},
                                {"label": "host", "op": "=~", "value": "h.*"}]
    page = client.get("/alerts/")
    assert [s.pk for s in page.context["overview"]["silenced"]] == [series.pk]
    assert page.context["overview"]["firing"] == []
    assert 'id="alerts-banner"' in page.content.decode() and "0 alerts firing" in page.content.decode()
    bad = client.post("/alerts/silences/new/", {"matchers": "host ~ x", "hours": "1"}, follow=True)
    assert "line 1: expected label=value" in bad.content.decode()
    assert client.post(f"/alerts/silences/{silence.pk}/expire/").status_code == 302
    silence.refresh_from_db()
    assert silence.ends_at <= timezone.now()


@pytest.mark.django_db
def test_channels_from_the_ui_are_validated(member):
    client, project, _ = member
    client.post("/alerts/channels/new/", {"name": "ops", "kind": "email", "emails": "not-an-address",
                                          "group_wait_seconds": 0, "group_interval_seconds": 60,
                                          "repeat_interval_seconds": 3600})
    assert not NotificationChannel.objects.filter(project=project).exists()
    client.post("/alerts/channels/new/", {"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/x",
                                          "group_wait_seconds": 0, "group_interval_seconds": 60,
                                          "repeat_interval_seconds": 3600, "send_resolved": "on", "enabled": "on"})
    assert NotificationChannel.objects.get(project=project).url == "https://hooks.example.com/x"


def _session_headers(user):
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
            (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]


@pytest.mark.clickhouse
@pytest.mark.django_db(transaction=True)
def test_live_push_to_members_only(make_user, project_with_key):
    async_to_sync(_live)(make_user, project_with_key)


async def _live(make_user, project_with_key):
    alice, mallory = await sync_to_async(make_user)(), await sync_to_async(make_user)()
    project, _ = await sync_to_async(project_with_key)(members=[alice])
    path = f"/ws/projects/{project.pk}/alerts/"
    intruder = WebsocketCommunicator(application, path, headers=await sync_to_async(_session_headers)(mallory))
    assert (await intruder.connect())[0]
    assert await intruder.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    socket = WebsocketCommunicator(application, path, headers=await sync_to_async(_session_headers)(alice))
    assert (await socket.connect())[0]
    await sync_to_async(_fire)(project, name="live")
    event = await socket.receive_json_from(timeout=10)
    assert event["type"] == "alerts.changed"
    assert [(a["rule"], a["series"]) for a in event["firing"]] == [("live", f"host=h{XSS},gpu=0")]
    json.dumps(event)
    await socket.disconnect()


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_a_failed_round_is_shown_on_the_page(member, monkeypatch):
    from alerts import services

    client, project, _ = member

    def broken(*args, **kwargs):
        raise RuntimeError("metadata database went away")

    monkeypatch.setattr(services, "_disabled_rules_settle", broken)
    with pytest.raises(RuntimeError):
        alerts_evaluate_round(deliver="none")
    html = client.get("/alerts/").content.decode()
    assert "failed: RuntimeError: metadata database went away" in html
    monkeypatch.undo()
    alerts_evaluate_round(deliver="none")
    assert "failed:" not in client.get("/alerts/").content.decode()
