"""Ingest keys remembered in process memory (issue 15, item 4): a remembered key costs no database
query, and revocation still takes effect — at once in the revoking process, within
TRACEDASH_KEY_CACHE_MS in any other (a change of KeyRevision made elsewhere)."""

from __future__ import annotations

import json
import time

import pytest
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from projects.keycache import CACHE
from projects.models import ApiKey, KeyRevision, Project
from projects.services import api_key_authenticate, api_key_authenticate_cached, api_key_create, api_key_revoke
from tests.spans import llm_trace

pytestmark = [pytest.mark.django_db, pytest.mark.clickhouse, pytest.mark.usefixtures("remembered_keys")]



def _foreign_revoke(key: ApiKey) -> None:
    """What another process's revocation looks like from here: the rows change, no signal runs here."""
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    KeyRevision.objects.filter(pk=1).update(version=F("version") + 1)


def _post(client, raw):
    return client.post("/api/v1/traces", data=json.dumps({"spans": llm_trace()}), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_a_checked_key_is_answered_from_memory_without_a_query(project_with_key):
    project, raw = project_with_key()
    assert api_key_authenticate_cached(raw_key=raw) is None  # never checked: the database must be asked
    assert api_key_authenticate(raw_key=raw).project == project
    with CaptureQueriesContext(connection) as queries:
        for _ in range(100):
            assert api_key_authenticate_cached(raw_key=raw).project == project
            assert api_key_authenticate(raw_key=raw).project == project
    assert queries.captured_queries == []
    # Unknown keys and malformed ones are not remembered: each is asked again (a new key works at once).
    assert api_key_authenticate_cached(raw_key=raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None
    assert api_key_authenticate_cached(raw_key="not-a-key") is None


def test_revoking_in_this_process_refuses_the_next_request(project_with_key):
    project, raw = project_with_key()
    client = Client()
    assert _post(client, raw).status_code == 200
    assert api_key_authenticate_cached(raw_key=raw) is not None
    api_key_revoke(key=ApiKey.objects.get(project=project))
    assert api_key_authenticate_cached(raw_key=raw) is None
    assert api_key_authenticate(raw_key=raw) is None
    answer = _post(client, raw)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_key"


def test_a_revocation_by_another_process_is_honoured_after_the_cache_interval(project_with_key, settings):
    project, raw = project_with_key()
    key = api_key_authenticate(raw_key=raw)
    _foreign_revoke(key)
    # Inside the interval this process still trusts its memory (the documented window) ...
    assert api_key_authenticate_cached(raw_key=raw) is not None
    # ... and once it has passed, the moved revision makes it forget every key.
    settings.TRACEDASH_KEY_CACHE_MS = 20
    time.sleep(0.05)
    assert api_key_authenticate_cached(raw_key=raw) is None
    assert api_key_authenticate(raw_key=raw) is None
    answer = _post(Client(), raw)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_key"


def test_the_ingest_view_answers_a_remembered_key_without_a_query_and_refuses_a_revoked_one(project_with_key):
    project, raw = project_with_key()
    client = Client()  # drives the async view; its thread hop for the database comes back to this thread
    assert _post(client, raw).status_code == 200  # first use: the database, then remembered
    with CaptureQueriesContext(connection) as queries:
        assert _post(client, raw).status_code == 200
    assert [q for q in queries.captured_queries if "projects_" in q["sql"]] == []
    api_key_revoke(key=ApiKey.objects.get(project=project))
    answer = _post(client, raw)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_key"


def test_deleting_the_project_or_editing_the_key_makes_every_process_forget(project_with_key):
    project, raw = project_with_key()
    before = KeyRevision.objects.get(pk=1).version
    api_key_authenticate(raw_key=raw)
    key = ApiKey.objects.get(project=project)
    key.name = "renamed"
    key.save()  # an edit (admin) moves the revision
    assert KeyRevision.objects.get(pk=1).version == before + 1
    assert api_key_authenticate(raw_key=raw).name == "renamed"
    api_key_create(project=project, name="another")  # a new key moves nothing (misses are not remembered)
    assert KeyRevision.objects.get(pk=1).version == before + 1
    Project.objects.filter(pk=project.pk).delete()
    assert KeyRevision.objects.get(pk=1).version > before + 1
    assert api_key_authenticate_cached(raw_key=raw) is None
    assert api_key_authenticate(raw_key=raw) is None


def test_no_memory_when_the_interval_is_zero(project_with_key, settings):
    settings.TRACEDASH_KEY_CACHE_MS = 0
    project, raw = project_with_key()
    assert api_key_authenticate(raw_key=raw) is not None
    assert api_key_authenticate_cached(raw_key=raw) is None
    with CaptureQueriesContext(connection) as queries:
        assert api_key_authenticate(raw_key=raw) is not None
    assert any("projects_apikey" in q["sql"] for q in queries.captured_queries)
