"""Ingest keys, members and projects on the settings page (issue 14, item 1): the services, the
views (CSRF, membership scoping), revocation taking effect at once and "last used" written at most
once a minute per key."""

from __future__ import annotations

import hashlib
import html
import json
import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from projects.models import ApiKey, Membership, Project
from projects.services import (LAST_USED_RESOLUTION, api_key_authenticate, api_key_create, membership_add_by_username,
                               membership_remove, project_create)
from tests.spans import llm_trace

pytestmark = pytest.mark.django_db

XSS = '<script>window.__xss=1</script>'


def _client(user, **kwargs):
    client = Client(**kwargs)
    client.force_login(user)
    return client


def _secret_in(body: str) -> str:
    match = re.search(r'<pre id="new-key-secret"><code>(td_[0-9a-f]{12}_[A-Za-z0-9_-]+)</code></pre>', body)
    assert match, "the new key is not shown"
    return match.group(1)


# --- services --------------------------------------------------------------------------------------
def test_key_names_are_checked_and_only_the_hash_is_kept(project_with_key):
    project, _ = project_with_key()
    for bad in ("", "   ", "x" * 201):
        with pytest.raises(ValidationError) as err:
            api_key_create(project=project, name=bad)
        assert "name" in err.value.message_dict
    key, raw = api_key_create(project=project, name="  ci  ")
    assert key.name == "ci" and key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert key.last_used_at is None
    assert ApiKey.objects.filter(project=project).count() == 2


def test_a_caller_provided_secret_is_formatted_and_hashed_like_any_key(project_with_key):
    from projects.services import api_key_with_secret

    project, _ = project_with_key()
    secret = "A" * 31 + "-"
    key, raw = api_key_create(project=project, name="derived", secret=secret)
    assert raw == f"td_{key.prefix}_{secret}" and key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert api_key_authenticate(raw_key=raw) == key
    assert api_key_with_secret(key=key, secret=secret) == raw
    assert api_key_with_secret(key=key, secret="B" * 32) is None
    for weak in ("short", "A" * 31, "A" * 31 + "/", "A" * 40 + " "):
        with pytest.raises(ValueError, match="URL-safe"):
            api_key_create(project=project, name="weak", secret=weak)
    assert not ApiKey.objects.filter(name="weak").exists()


def test_last_used_is_written_at_most_once_a_minute_per_key(project_with_key):
    project, raw = project_with_key()
    _, other_raw = api_key_create(project=project, name="other")
    with CaptureQueriesContext(connection) as queries:
        for _ in range(200):
            assert api_key_authenticate(raw_key=raw) is not None
        assert api_key_authenticate(raw_key=other_raw) is not None
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 2, updates  # one per key, not one per request
    first = ApiKey.objects.get(project=project, name="default").last_used_at
    assert first is not None and timezone.now() - first < timedelta(seconds=30)

    # A minute later the next use writes once more, and again only once.
    later = timezone.now() + LAST_USED_RESOLUTION + timedelta(seconds=1)
    from unittest import mock

    with mock.patch("projects.services.timezone.now", return_value=later), \
            CaptureQueriesContext(connection) as queries:
        for _ in range(50):
            assert api_key_authenticate(raw_key=raw) is not None
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 1, updates
    assert ApiKey.objects.get(project=project, name="default").last_used_at == later


def test_a_failed_last_used_write_does_not_fail_the_request(project_with_key, monkeypatch):
    from django.db import OperationalError
    from django.db.models.query import QuerySet

    project, raw = project_with_key()

    attempts = []

    def locked(self, **kwargs):
        attempts.append(kwargs)
        raise OperationalError("database is locked")

    monkeypatch.setattr(QuerySet, "update", locked)
    for _ in range(20):
        assert api_key_authenticate(raw_key=raw).project == project  # still authenticated
    assert len(attempts) == 1  # a locked database is not retried on every request
    monkeypatch.undo()
    assert ApiKey.objects.get(project=project).last_used_at is None


def test_project_names_are_checked_and_duplicates_refused(make_user):
    alice = make_user("alice")
    project, raw = project_create(name=" checkout ", owner=alice)
    assert project.name == "checkout" and api_key_authenticate(raw_key=raw).project == project
    assert Membership.objects.get(project=project, user=alice).role == Membership.Role.OWNER
    for bad, message in (("checkout", "already exists"), ("", "empty"), ("y" * 201, "longer than")):
        with pytest.raises(ValidationError, match=message):
            project_create(name=bad, owner=alice)
    assert Project.objects.count() == 1 and ApiKey.objects.count() == 1  # nothing half-written


def test_members_by_username(make_user, project_with_key):
    alice, bob = make_user("alice"), make_user("bob")
    project, _ = project_with_key(members=[alice])
    with pytest.raises(ValidationError, match="no user named 'ghost'"):
        membership_add_by_username(project=project, username="ghost")
    with pytest.raises(ValidationError, match="already a member"):
        membership_add_by_username(project=project, username="alice")
    membership = membership_add_by_username(project=project, username=" bob ")
    assert membership.user == bob and membership.role == Membership.Role.MEMBER
    membership_remove(membership=membership)
    with pytest.raises(ValidationError, match="last member"):
        membership_remove(membership=Membership.objects.get(project=project, user=alice))
    assert list(project.members.all()) == [alice]


# --- views -----------------------------------------------------------------------------------------
@pytest.fixture
def two_projects(make_user, project_with_key):
    alice, bob = make_user("alice"), make_user("bob")
    a, a_raw = project_with_key("A", members=[alice])
    b, b_raw = project_with_key("B", members=[bob])
    return alice, bob, a, b, a_raw, b_raw


@pytest.mark.clickhouse  # the page lists the project's indexed attribute keys (ClickHouse)
def test_member_sees_the_keys_and_creates_one_shown_once_with_snippets(two_projects):
    alice, _, a, b, a_raw, _ = two_projects
    client = _client(alice)
    page = client.get(f"/settings/?project={a.pk}")
    assert page.status_code == 200
    body = page.content.decode()
    a_key = ApiKey.objects.get(project=a)
    b_key = ApiKey.objects.get(project=b)
    assert f"td_{a_key.prefix}_…" in body and "never" in body
    # Its public part, the Langfuse SDK's public key, is listed on its own (copyable whole).
    assert f'<code class="key-public">td_{a_key.prefix}</code>' in body and "Public key (Langfuse)" in body
    assert b_key.prefix not in body and a_key.key_hash not in body and a_raw not in body
    assert 'id="key_name"' in body and 'id="project_name"' in body and 'id="member_username"' in body

    created = client.post(f"/settings/keys/new/?project={a.pk}", {"name": XSS})
    assert created.status_code == 200 and created["Cache-Control"] == "no-store"
    body = created.content.decode()
    raw = _secret_in(body)
    key = api_key_authenticate(raw_key=raw)
    assert key.project == a and key.name == XSS
    assert XSS not in body and "&lt;script&gt;window.__xss=1&lt;/script&gt;" in body
    # The snippets carry this server's base URL and the new key.
    assert f"export TRACEDASH_ENDPOINT=http://testserver\nexport TRACEDASH_API_KEY={raw}" in body
    assert "export OTEL_EXPORTER_OTLP_ENDPOINT=http://testserver" in body
    assert f"OTEL_EXPORTER_OTLP_HEADERS=&quot;Authorization=Bearer%20{raw}&quot;" in body
    assert f"curl -X POST http://testserver/api/v1/traces" in body and f"Authorization: Bearer {raw}" in body
    assert (f"export LANGFUSE_BASE_URL=http://testserver\nexport LANGFUSE_HOST=http://testserver\n"
            f"export LANGFUSE_PUBLIC_KEY={key.public_key}\nexport LANGFUSE_SECRET_KEY={raw}\n") in body
    assert 'src="/static/tracedash/settings.js"' in body and 'data-copy="new-key-secret"' in body
    # Shown once: the page afterwards lists the key but never its secret.
    again = client.get(f"/settings/?project={a.pk}").content.decode()
    assert raw not in again and f"td_{key.prefix}_…" in again


@pytest.mark.clickhouse
def test_the_curl_snippet_works_and_revoking_refuses_the_next_request(two_projects):
    alice, _, a, _, _, _ = two_projects
    client = _client(alice)
    body = client.post(f"/settings/keys/new/?project={a.pk}", {"name": "curl"}).content.decode()
    raw = _secret_in(body)
    curl = re.search(r'<pre id="snippet-curl"><code>(.*?)</code></pre>', body, re.S).group(1)
    curl = html.unescape(curl)
    assert curl.startswith("curl -X POST http://testserver/api/v1/traces")
    payload = re.search(r"-d '(.*)'", curl, re.S).group(1)
    ingest = Client()
    answer = ingest.post("/api/v1/traces", data=payload, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert answer.status_code == 200 and answer.json() == {"accepted": 1, "rejected": []}
    key = ApiKey.objects.get(prefix=raw.split("_")[1])
    assert key.last_used_at is not None  # the list shows when it was last used
    assert key.last_used_at.strftime("%Y-%m-%d %H:%M") in client.get(f"/settings/?project={a.pk}").content.decode()

    revoked = client.post(f"/settings/keys/{key.pk}/revoke/?project={a.pk}")
    assert revoked.status_code == 302 and revoked["Location"] == f"/settings/?project={a.pk}"
    after = ingest.post("/api/v1/traces", data=json.dumps({"spans": llm_trace()}), content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert after.status_code == 401 and after.json()["error"]["code"] == "invalid_key"
    page = client.get(revoked["Location"]).content.decode()
    assert "revoked" in page and f"Revoked td_{key.prefix}_…" in page


@pytest.mark.clickhouse  # the page lists the project's indexed attribute keys (ClickHouse)
def test_a_non_member_can_neither_see_nor_revoke_nor_add_keys(two_projects):
    _, bob, a, b, a_raw, _ = two_projects
    a_key = ApiKey.objects.get(project=a)
    client = _client(bob)
    assert client.get(f"/settings/?project={a.pk}").status_code == 404
    assert a_key.prefix not in client.get("/settings/").content.decode()
    for url in (f"/settings/keys/{a_key.pk}/revoke/?project={a.pk}",  # naming A: not a member
                f"/settings/keys/{a_key.pk}/revoke/?project={b.pk}",  # A's key inside bob's own project
                f"/settings/keys/{a_key.pk}/revoke/",
                f"/settings/keys/new/?project={a.pk}",
                f"/settings/members/new/?project={a.pk}",
                f"/settings/projects/new/?project={a.pk}"):
        response = client.post(url, {"name": "x", "username": "bob"})
        assert response.status_code == 404, (url, response.status_code)
    assert api_key_authenticate(raw_key=a_raw) is not None
    assert ApiKey.objects.filter(project=a).count() == 1
    assert list(a.members.values_list("username", flat=True)) == ["alice"]
    assert not Project.objects.filter(name="x").exists()
    membership = Membership.objects.get(project=a)
    for url in (f"/settings/members/{membership.pk}/remove/?project={a.pk}",
                f"/settings/members/{membership.pk}/remove/?project={b.pk}"):
        assert client.post(url).status_code == 404
    assert Membership.objects.filter(pk=membership.pk).exists()


def test_forms_need_post_and_a_csrf_token(two_projects):
    alice, _, a, _, a_raw, _ = two_projects
    key = ApiKey.objects.get(project=a)
    membership = Membership.objects.get(project=a)
    urls = [f"/settings/keys/new/?project={a.pk}", f"/settings/keys/{key.pk}/revoke/?project={a.pk}",
            f"/settings/members/new/?project={a.pk}", f"/settings/members/{membership.pk}/remove/?project={a.pk}",
            f"/settings/projects/new/?project={a.pk}"]
    csrf = _client(alice, enforce_csrf_checks=True)
    for url in urls:
        assert csrf.post(url, {"name": "x", "username": "alice"}).status_code == 403, url
        assert _client(alice).get(url).status_code == 405, url
    assert api_key_authenticate(raw_key=a_raw) is not None and ApiKey.objects.count() == 2
    assert Project.objects.count() == 2 and Membership.objects.filter(pk=membership.pk).exists()
    assert Client().post(urls[0], {"name": "x"}).status_code == 302  # anonymous: to the login page


@pytest.mark.clickhouse  # the page lists the project's indexed attribute keys (ClickHouse)
def test_members_are_added_by_username_with_clear_errors(two_projects, make_user):
    alice, bob, a, _, _, _ = two_projects
    client = _client(alice)
    url = f"/settings/members/new/?project={a.pk}"
    for username, message in ((XSS, "no user named"), ("ghost", "no user named &#x27;ghost&#x27;"),
                              ("alice", "&#x27;alice&#x27; is already a member of &#x27;A&#x27;"), ("", "required")):
        refused = client.post(url, {"username": username})
        assert refused.status_code == 400, username
        body = refused.content.decode()
        assert message in body and 'class="errorlist' in body and XSS not in body
    added = client.post(url, {"username": "bob"})
    assert added.status_code == 302
    page = client.get(added["Location"]).content.decode()
    assert "Added bob to A." in page and ">bob<" in page
    assert _client(bob).get(f"/settings/?project={a.pk}").status_code == 200  # bob sees A now

    bob_membership = Membership.objects.get(project=a, user=bob)
    assert client.post(f"/settings/members/{bob_membership.pk}/remove/?project={a.pk}").status_code == 302
    assert _client(bob).get(f"/settings/?project={a.pk}").status_code == 404  # and no longer
    last = client.post(f"/settings/members/{Membership.objects.get(project=a, user=alice).pk}/remove/?project={a.pk}")
    assert last.status_code == 400 and "last member" in last.content.decode()
    assert Membership.objects.filter(project=a, user=alice).exists()

    # Removing yourself (someone else stays) leaves the project: back to your own settings, A is gone.
    assert client.post(url, {"username": "bob"}).status_code == 302
    left = client.post(f"/settings/members/{Membership.objects.get(project=a, user=alice).pk}/remove/?project={a.pk}")
    assert left.status_code == 302 and left["Location"] == "/settings/"
    assert client.get(f"/settings/?project={a.pk}").status_code == 404
    assert "not a member of any project" in client.get("/settings/").content.decode()
    assert list(a.members.values_list("username", flat=True)) == ["bob"]


@pytest.mark.clickhouse  # the page lists the project's indexed attribute keys (ClickHouse)
def test_projects_are_created_with_a_first_key_and_duplicates_refused(two_projects, make_user):
    alice, _, a, b, _, _ = two_projects
    client = _client(alice)
    duplicate = client.post(f"/settings/projects/new/?project={a.pk}", {"name": "B"})  # alice cannot see B, but the name is taken
    assert duplicate.status_code == 400
    assert "a project named &#x27;B&#x27; already exists" in duplicate.content.decode()
    assert client.post("/settings/projects/new/", {"name": "  "}).status_code == 400
    assert Project.objects.count() == 2

    created = client.post(f"/settings/projects/new/?project={a.pk}", {"name": "checkout-api"})
    assert created.status_code == 200 and created["Cache-Control"] == "no-store"
    body = created.content.decode()
    project = Project.objects.get(name="checkout-api")
    assert api_key_authenticate(raw_key=_secret_in(body)).project == project
    assert "Created project checkout-api" in body
    assert Membership.objects.get(project=project, user=alice).role == Membership.Role.OWNER
    # The new project is now the current one.
    assert "Project settings: checkout-api" in client.get("/settings/").content.decode()


@pytest.mark.clickhouse  # the page lists the project's indexed attribute keys (ClickHouse)
def test_a_user_without_a_project_can_create_one(make_user):
    carol = make_user("carol")
    client = _client(carol)
    page = client.get("/settings/").content.decode()
    assert "not a member of any project" in page and 'id="project-form"' in page
    assert client.post("/settings/keys/new/", {"name": "x"}).status_code == 404  # no project to add it to
    created = client.post("/settings/projects/new/", {"name": "carols"})
    assert created.status_code == 200
    assert [p.name for p in Project.objects.filter(members=carol)] == ["carols"]
