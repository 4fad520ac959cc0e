"""Security matrix (issue 9, point 3): every URL of the app, taken from the URL resolver, against
{anonymous, member, non-member}. Pages send anonymous users to the login page, JSON endpoints
answer 401 JSON; a member gets the page; a non-member gets 404 for the other project's objects;
ingest keys only reach their own project; websockets close with 4403 for non-members; admin is
for staff only; every POST form refuses a request without a CSRF token.

A URL added to the app without a row in ``MATRIX`` fails ``test_every_url_is_in_the_matrix``, so
the matrix cannot go stale."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from tests.spans import llm_trace
from tests.trace_seed import seed

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


@dataclass(frozen=True)
class Row:
    """How one URL is reached and protected. ``path(world)`` builds the URL of project A's object
    (world = the fixture below); ``kind``: page (login redirect), json (401 JSON), form (POST-only,
    login redirect), key (ingest-key API), public, auth (login/logout), admin."""

    kind: str
    path: object
    member_status: int = 200
    note: str = ""
    extra: dict = field(default_factory=dict)


def _q(world):
    return f"?project={world.a.pk}"


def _a_key(world):
    from projects.models import ApiKey

    return ApiKey.objects.filter(project=world.a).first()


def _a_membership(world):
    from projects.models import Membership

    return Membership.objects.get(project=world.a, user=world.alice)


MATRIX: dict[str, Row] = {
    "healthz": Row("public", lambda w: "/healthz"),
    "login": Row("auth", lambda w: "/login/"),
    "logout": Row("auth", lambda w: "/logout/"),
    "ingest:traces": Row("key", lambda w: "/api/v1/traces"),
    "ingest:resources": Row("key", lambda w: "/api/v1/resources"),
    "ingest:engine-samples": Row("key", lambda w: "/api/v1/engine_samples"),
    "ingest:scores": Row("key", lambda w: "/api/v1/scores"),
    "ingest:otlp-traces": Row("key", lambda w: "/v1/traces"),
    "ingest:langfuse-otlp-traces": Row("key", lambda w: "/api/public/otel/v1/traces"),
    "ingest:otlp-metrics": Row("key", lambda w: "/v1/metrics"),
    "ingest:otlp-logs": Row("key", lambda w: "/v1/logs"),
    "ingest:openapi": Row("public", lambda w: "/api/openapi.json", note="the API description, no data"),
    "alerts:index": Row("page", lambda w: "/alerts/" + _q(w)),
    "alerts:rule_new": Row("page", lambda w: "/alerts/rules/new/" + _q(w)),
    "alerts:rule_edit": Row("page", lambda w: f"/alerts/rules/{w.rule.pk}/" + _q(w)),
    "alerts:rule_delete": Row("form", lambda w: f"/alerts/rules/{w.rule.pk}/delete/" + _q(w), 302),
    "alerts:channel_new": Row("form", lambda w: "/alerts/channels/new/" + _q(w), 302),
    "alerts:channel_delete": Row("form", lambda w: f"/alerts/channels/{w.channel.pk}/delete/" + _q(w), 302),
    "alerts:channel_test": Row("form", lambda w: f"/alerts/channels/{w.channel.pk}/test/" + _q(w), 302),
    "alerts:silence_new": Row("form", lambda w: "/alerts/silences/new/" + _q(w), 302),
    "alerts:silence_expire": Row("form", lambda w: f"/alerts/silences/{w.silence.pk}/expire/" + _q(w), 302),
    "alerts:series_ack": Row("form", lambda w: f"/alerts/series/{w.series.pk}/ack/" + _q(w), 302),
    "alerts:firing_json": Row("page", lambda w: "/alerts/firing.json" + _q(w)),
    "loadtests:list": Row("page", lambda w: "/loadtests/" + _q(w)),
    "loadtests:detail": Row("page", lambda w: f"/loadtests/{w.run.pk}/" + _q(w)),
    "loadtests:start": Row("form", lambda w: "/loadtests/start/" + _q(w), 400,
                           note="names the current project: a non-member's ?project= is a 404"),
    "loadtests:progress": Row("json", lambda w: f"/loadtests/{w.run.pk}/progress.json" + _q(w)),
    "loadtests:report_json": Row("page", lambda w: f"/loadtests/{w.run.pk}/report.json" + _q(w), 409,
                                 note="the seeded run is still running: 409 'no report yet' (members only)"),
    "dashboard:home": Row("page", lambda w: "/" + _q(w)),
    "dashboard:overview-json": Row("json", lambda w: "/overview.json" + _q(w)),
    "dashboard:costs": Row("page", lambda w: "/costs/" + _q(w)),
    "dashboard:costs-json": Row("json", lambda w: "/costs.json" + _q(w)),
    "dashboard:compare": Row("page", lambda w: "/compare/" + _q(w)),
    "dashboard:compare-json": Row("json", lambda w: "/compare.json" + _q(w)),
    "dashboard:variants": Row("page", lambda w: "/variants/" + _q(w)),
    "dashboard:variants-json": Row("json", lambda w: "/variants.json" + _q(w)),
    "dashboard:traces": Row("page", lambda w: "/traces/" + _q(w)),
    "dashboard:traces-rows": Row("json", lambda w: "/traces/rows.json" + _q(w)),
    "dashboard:trace-compare": Row("page", lambda w: f"/traces/compare/?a={w.trace}&b={w.trace}&project={w.a.pk}"),
    "dashboard:trace": Row("page", lambda w: f"/traces/{w.trace}/" + _q(w)),
    "dashboard:trace-api": Row("json", lambda w: f"/api/v1/traces/{w.trace}" + _q(w)),
    "dashboard:trace-review": Row("form", lambda w: f"/traces/{w.trace}/scores/" + _q(w), 302,
                                  note="a review of project A's trace; its scores are checked in tests/test_scores_browser.py"),
    "dashboard:series-overview": Row("json", lambda w: "/api/v1/series/overview" + _q(w)),
    "dashboard:series-latency": Row("json", lambda w: "/api/v1/series/latency" + _q(w)),
    "dashboard:series-costs": Row("json", lambda w: "/api/v1/series/costs" + _q(w)),
    "dashboard:series-compare": Row("json", lambda w: "/api/v1/series/compare" + _q(w)),
    "dashboard:resources": Row("page", lambda w: "/resources/" + _q(w)),
    "dashboard:resources-series": Row("json", lambda w: "/resources/series.json" + _q(w)),
    "dashboard:engines": Row("page", lambda w: "/engines/" + _q(w)),
    "dashboard:engines-series": Row("json", lambda w: "/engines/series.json" + _q(w)),
    "dashboard:settings": Row("page", lambda w: "/settings/" + _q(w)),
    "projects:key_create": Row("form", lambda w: "/settings/keys/new/" + _q(w), 200),
    "projects:key_revoke": Row("form", lambda w: f"/settings/keys/{_a_key(w).pk}/revoke/" + _q(w), 302),
    "projects:member_add": Row("form", lambda w: "/settings/members/new/" + _q(w), 302),
    "projects:member_remove": Row("form", lambda w: f"/settings/members/{_a_membership(w).pk}/remove/" + _q(w), 302),
    "projects:index_key_add": Row("form", lambda w: "/settings/index-keys/new/" + _q(w), 302),
    "projects:index_key_remove": Row("form", lambda w: "/settings/index-keys/remove/" + _q(w), 302),
    "projects:project_create": Row("form", lambda w: "/settings/projects/new/" + _q(w), 200,
                                   note="names the current project: a non-member's ?project= is a 404 too"),
}

# URLs naming one object of project A (a rule, a trace, a load test run, …).
OBJECT_URLS = {"alerts:rule_edit", "alerts:rule_delete", "alerts:channel_delete", "alerts:channel_test",
               "alerts:silence_expire",
               "alerts:series_ack", "loadtests:detail", "loadtests:report_json", "loadtests:progress", "dashboard:trace-compare",
               "dashboard:trace", "dashboard:trace-review", "dashboard:trace-api", "projects:key_revoke", "projects:member_remove"}
PROTECTED = [name for name, row in MATRIX.items() if row.kind in ("page", "json", "form")]


def _url_names(patterns=None, prefix=""):
    names = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":
                names.append("admin")
                continue
            ns = f"{prefix}{entry.namespace}:" if entry.namespace else prefix
            names.extend(_url_names(entry.url_patterns, ns))
        elif isinstance(entry, URLPattern):
            names.append(f"{prefix}{entry.name}" if entry.name else f"{prefix}<unnamed {entry.pattern}>")
    return names


def test_every_url_is_in_the_matrix():
    names = _url_names()
    assert "admin" in names
    missing = sorted(set(names) - set(MATRIX) - {"admin"})
    assert not missing, f"URLs with no row in the security matrix: {missing}"
    assert not sorted(set(MATRIX) - set(names)), "matrix rows for URLs that no longer exist"


@dataclass
class World:
    alice: object
    bob: object
    a: object
    b: object
    a_key: str
    b_key: str
    trace: str
    b_trace: str
    rule: object
    channel: object
    silence: object
    series: object
    run: object


@pytest.fixture
def world(make_user, project_with_key):
    from alerts.models import AlertSeries
    from alerts.services import channel_create, rule_create, silence_create
    from loadtests.services import load_test_run_create

    alice, bob = make_user("alice"), make_user("bob")
    a, a_key = project_with_key("A", members=[alice])
    b, b_key = project_with_key("B", members=[bob])
    trace = seed(llm_trace(name="alice-secret-span"), project_id=a.pk)
    b_trace = seed(llm_trace(name="bob-span"), project_id=b.pk)
    channel = channel_create(project=a, name="hook", kind="webhook", url="http://127.0.0.1:9/hook")
    rule = rule_create(project=a, name="matrix rule", metric="gpu_memory_percent", aggregation="last",
                       window_seconds=60, comparator="gte", threshold=85, for_seconds=0, severity="critical")
    now = timezone.now()
    silence = silence_create(project=a, matchers=[{"label": "host", "op": "=", "value": "gpu-1"}],
                             starts_at=now, ends_at=now + timedelta(hours=1))
    series = AlertSeries.objects.create(rule=rule, project=a, key="host=gpu-1", labels={"host": "gpu-1"},
                                        state="firing", fired_at=now)
    run = load_test_run_create(project=a, run_id="matrix-run", test_type="step", target_url="http://x", config={})
    return World(alice, bob, a, b, a_key, b_key, trace, b_trace, rule, channel, silence, series, run)


def _logged_in(user):
    client = Client()
    client.force_login(user)
    return client


def _objects_exist(w):
    from alerts.models import AlertRule, NotificationChannel, Silence

    from projects.models import ApiKey, Membership, Project

    silence = Silence.objects.get(pk=w.silence.pk)
    return (AlertRule.objects.filter(pk=w.rule.pk).exists(), NotificationChannel.objects.filter(pk=w.channel.pk).exists(),
            silence.ends_at, type(w.series).objects.get(pk=w.series.pk).acknowledged_at,
            sorted(ApiKey.objects.filter(revoked_at__isnull=True).values_list("pk", flat=True)),
            sorted(Membership.objects.values_list("pk", flat=True)), Project.objects.count())


@pytest.mark.parametrize("name", PROTECTED)
def test_anonymous_is_sent_to_login_or_gets_401_json(world, name):
    row = MATRIX[name]
    url = row.path(world)
    client = Client()
    response = client.post(url) if row.kind == "form" else client.get(url)
    if row.kind == "json":
        assert response.status_code == 401, (name, response.status_code)
        assert response["Content-Type"].startswith("application/json")
        assert response.json()["error"]["code"] in ("not_authenticated", "invalid_key", "missing_key")
    else:
        assert response.status_code == 302, (name, response.status_code)
        assert response["Location"].startswith("/login/")


@pytest.mark.parametrize("name", PROTECTED)
def test_non_member_gets_404_and_changes_nothing(world, name):
    row = MATRIX[name]
    url = row.path(world)
    before = _objects_exist(world)
    bob = _logged_in(world.bob)
    response = bob.post(url, {"name": "x", "kind": "webhook", "url": "http://127.0.0.1:9/x",
                              "matchers": "host=gpu-1"}) if row.kind == "form" else bob.get(url)
    assert response.status_code == 404, (name, response.status_code)
    assert b"alice-secret-span" not in response.content
    assert _objects_exist(world) == before
    # Without ?project=… the request is about bob's own project: alice's objects are still not found.
    if name in OBJECT_URLS:
        own = url.replace(f"project={world.a.pk}", f"project={world.b.pk}")
        response = bob.post(own) if row.kind == "form" else bob.get(own)
        assert response.status_code == 404, (name, "own project", response.status_code)
        assert _objects_exist(world) == before


@pytest.mark.parametrize("name", [n for n in PROTECTED if MATRIX[n].kind != "form"])
def test_member_gets_the_page(world, name):
    row = MATRIX[name]
    response = _logged_in(world.alice).get(row.path(world))
    assert response.status_code == row.member_status, (name, response.status_code)


def test_non_member_cannot_post_settings(world):
    from projects.models import Project

    before = Project.objects.get(pk=world.a.pk).retention_days
    response = _logged_in(world.bob).post(MATRIX["dashboard:settings"].path(world), {"retention_days": before + 1})
    assert response.status_code == 404
    assert Project.objects.get(pk=world.a.pk).retention_days == before


def test_member_forms_work(world):
    alice = _logged_in(world.alice)
    q = _q(world)
    assert alice.post(f"/alerts/series/{world.series.pk}/ack/{q}").status_code == 302
    assert alice.post(f"/alerts/silences/{world.silence.pk}/expire/{q}").status_code == 302
    assert alice.post(f"/alerts/channels/{world.channel.pk}/delete/{q}").status_code == 302
    assert alice.post(f"/alerts/rules/{world.rule.pk}/delete/{q}").status_code == 302
    from alerts.models import AlertRule, NotificationChannel

    assert not AlertRule.objects.filter(pk=world.rule.pk).exists()
    assert not NotificationChannel.objects.filter(pk=world.channel.pk).exists()
    from analytics.scores import trace_scores

    assert alice.post(f"/traces/{world.trace}/scores/{q}", {"rating": "5"}).status_code == 302
    assert [(s["name"], s["value"], s["author"]) for s in trace_scores(project_id=world.a.pk, trace_id=world.trace)] == [
        ("review.rating", 5.0, world.alice.username)]
    assert trace_scores(project_id=world.b.pk, trace_id=world.trace) == []


def test_trace_api_by_key_only_reaches_the_keys_project(world):
    client = Client()
    url = f"/api/v1/traces/{world.trace}"
    assert client.get(url, HTTP_AUTHORIZATION=f"Bearer {world.a_key}").status_code == 200
    other = client.get(url, HTTP_AUTHORIZATION=f"Bearer {world.b_key}")
    assert other.status_code == 404 and b"alice-secret-span" not in other.content
    # ?project= cannot widen a key's reach.
    other = client.get(url + _q(world), HTTP_AUTHORIZATION=f"Bearer {world.b_key}")
    assert other.status_code == 404 and b"alice-secret-span" not in other.content
    assert client.get(url, HTTP_AUTHORIZATION="Bearer td_not_a_key").status_code == 401


@pytest.mark.parametrize("name", [n for n, r in MATRIX.items() if r.kind == "key"])
def test_ingest_needs_a_key_and_writes_only_to_its_project(world, name):
    url = MATRIX[name].path(world)
    client = Client(enforce_csrf_checks=True)
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer td_not_a_key"}):
        response = client.post(url, data=b"{}", content_type="application/json", **headers)
        assert response.status_code == 401, (name, headers, response.status_code)
        assert response["Content-Type"].startswith("application/json")
    # A logged-in session is not a key.
    session = _logged_in(world.alice)
    assert session.post(url, data=b"{}", content_type="application/json").status_code == 401


def test_ingest_with_the_other_key_lands_in_the_other_project(world):
    from dashboard.trace_detail import trace_get

    spans = llm_trace(name="sent-with-b-key")
    response = Client().post("/api/v1/traces", data=json.dumps({"spans": spans}), content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {world.b_key}")
    assert response.status_code == 200
    tid = spans[0]["trace_id"]
    assert trace_get(project_id=world.b.pk, trace_id=tid) is not None
    assert trace_get(project_id=world.a.pk, trace_id=tid) is None


def test_admin_is_for_staff_only(world, django_user_model):
    assert Client().get("/admin/").status_code == 302
    assert Client().get("/admin/projects/project/").status_code == 302
    alice = _logged_in(world.alice)
    response = alice.get("/admin/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert alice.get("/admin/projects/project/").status_code == 302
    staff = django_user_model.objects.create_superuser("root", "root@example.com", "pw-for-tests-1")
    assert _logged_in(staff).get("/admin/").status_code == 200


def test_every_post_form_refuses_a_request_without_csrf_token(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.alice)
    form_urls = [MATRIX[n].path(world) for n, r in MATRIX.items() if r.kind == "form"]
    form_urls += [MATRIX["alerts:rule_new"].path(world), MATRIX["alerts:rule_edit"].path(world),
                  MATRIX["dashboard:settings"].path(world), "/logout/"]
    before = _objects_exist(world)
    for url in form_urls:
        response = client.post(url, {"name": "x"})
        assert response.status_code == 403, (url, response.status_code)
    assert _objects_exist(world) == before
    anonymous = Client(enforce_csrf_checks=True)
    assert anonymous.post("/login/", {"username": "alice", "password": "pw-for-tests-1"}).status_code == 403


def test_public_urls_carry_no_project_data(world):
    for name in ("healthz", "ingest:openapi"):
        response = Client().get(MATRIX[name].path(world))
        assert response.status_code in (200, 503)
        assert b"alice-secret-span" not in response.content and world.a_key.encode() not in response.content


def _session_headers(user):
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    return [(b"cookie", f"sessionid={cookie}".encode()), (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["traces", "alerts"])
def test_websockets_close_4403_for_non_members(make_user, project_with_key, kind):
    async_to_sync(_websocket_scenario)(make_user, project_with_key, kind)


async def _websocket_scenario(make_user, project_with_key, kind):
    from config.asgi import application

    alice, bob = await sync_to_async(make_user)("ws-alice"), await sync_to_async(make_user)("ws-bob")
    a, _ = await sync_to_async(project_with_key)("ws-A", members=[alice])
    await sync_to_async(project_with_key)("ws-B", members=[bob])
    path = f"/ws/projects/{a.pk}/{kind}/"
    for headers in (await sync_to_async(_session_headers)(bob), [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]):
        socket = WebsocketCommunicator(application, path, headers=headers)
        assert (await socket.connect())[0]
        assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    member = WebsocketCommunicator(application, path, headers=await sync_to_async(_session_headers)(alice))
    connected, _ = await member.connect()
    assert connected
    assert await member.receive_nothing(timeout=0.3)
    await member.disconnect()


@pytest.mark.parametrize("name", [n for n in PROTECTED if MATRIX[n].kind in ("page", "json")])
def test_no_session_url_accepts_a_post_without_csrf_token(world, name):
    """Pages and JSON endpoints that take no form refuse a cross-site POST too (403 CSRF or 405)."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.alice)
    response = client.post(MATRIX[name].path(world), {"retention_days": 1, "name": "x"})
    assert response.status_code in (403, 405), (name, response.status_code)


@pytest.mark.django_db(transaction=True)
def test_websocket_from_another_site_is_refused_even_with_a_members_cookie(make_user, project_with_key):
    """Cross-site websocket hijacking: a page on another origin cannot open the member's socket."""
    async_to_sync(_cross_site_scenario)(make_user, project_with_key)


async def _cross_site_scenario(make_user, project_with_key):
    from config.asgi import application

    alice = await sync_to_async(make_user)("xs-alice")
    a, _ = await sync_to_async(project_with_key)("xs-A", members=[alice])
    headers = [h for h in await sync_to_async(_session_headers)(alice) if h[0] != b"origin"]
    socket = WebsocketCommunicator(application, f"/ws/projects/{a.pk}/traces/",
                                   headers=headers + [(b"origin", b"http://evil.example")])
    connected, _ = await socket.connect()
    assert not connected
    await socket.disconnect()
