"""The settings page's indexed attribute keys (analytics.attribute_index): listed with their state,
added and removed by a member, scoped to the project, capped, escaped, and the page still renders
while ClickHouse is down."""

from __future__ import annotations

import pytest
from django.test import Client

from analytics import attribute_index
from store import Store
from store.errors import StoreUnavailable

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

XSS = '<script>window.__xss=1</script>'


@pytest.fixture
def member(make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    other, _ = project_with_key()
    client = Client()
    client.force_login(user)
    return client, project, other


def _page(client, project) -> str:
    response = client.get(f"/settings/?project={project.pk}")
    assert response.status_code == 200
    return response.content.decode()


def test_a_member_adds_lists_and_removes_keys_of_their_project_only(member):
    client, project, other = member
    assert 'id="index-keys-none"' in _page(client, project)
    response = client.post(f"/settings/index-keys/new/?project={project.pk}", {"key": " user.tier "})
    assert response.status_code == 302 and response["Location"].endswith("#index-keys")
    assert [k.key for k in attribute_index.indexed_keys(project_id=project.pk)] == ["user.tier"]
    assert attribute_index.indexed_keys(project_id=other.pk) == []
    body = _page(client, project)
    assert "<code>user.tier</code>" in body and "backfilling (reads scan the spans)" in body
    attribute_index.index_backfill(project_ids=[project.pk], delay_seconds=0)
    assert "<td>indexed</td>" in _page(client, project)
    # Adding it again changes nothing; removing it under another project's id is that project's 404.
    assert client.post(f"/settings/index-keys/new/?project={project.pk}", {"key": "user.tier"}).status_code == 302
    assert len(attribute_index.indexed_keys(project_id=project.pk)) == 1
    assert client.post(f"/settings/index-keys/remove/?project={other.pk}", {"key": "user.tier"}).status_code == 404
    assert len(attribute_index.indexed_keys(project_id=project.pk)) == 1
    response = client.post(f"/settings/index-keys/remove/?project={project.pk}", {"key": "user.tier"})
    assert response.status_code == 302
    assert attribute_index.indexed_keys(project_id=project.pk) == []
    response = client.post(f"/settings/index-keys/remove/?project={project.pk}", {"key": "user.tier"})
    assert response.status_code == 404 and "is not indexed in this project" in response.content.decode()


def test_bad_keys_and_the_cap_are_clear_400s_and_keys_are_escaped(member, monkeypatch):
    client, project, _ = member
    for key, message in (("", "This field is required."), ("k" * 257, "at most 256 characters")):
        response = client.post(f"/settings/index-keys/new/?project={project.pk}", {"key": key})
        assert response.status_code == 400 and message in response.content.decode(), key
    assert client.post(f"/settings/index-keys/new/?project={project.pk}", {"key": XSS}).status_code == 302
    body = _page(client, project)
    assert XSS not in body and "&lt;script&gt;window.__xss=1&lt;/script&gt;" in body
    monkeypatch.setattr(attribute_index, "MAX_KEYS", 1)
    response = client.post(f"/settings/index-keys/new/?project={project.pk}", {"key": "user.tier"})
    assert response.status_code == 400 and "already indexes 1 keys" in response.content.decode()
    assert [k.key for k in attribute_index.indexed_keys(project_id=project.pk)] == [XSS]


def test_the_page_renders_and_changes_nothing_while_clickhouse_is_down(member, monkeypatch):
    client, project, _ = member
    attribute_index.key_declare(project_id=project.pk, key="user.tier")

    def down(self, *args, **kwargs):
        raise StoreUnavailable("ClickHouse is down (test outage)", tag=kwargs.get("tag"))

    for name in ("query", "command", "insert"):
        monkeypatch.setattr(Store, name, down)
    body = _page(client, project)
    assert 'id="index-keys-unavailable"' in body and 'id="retention-form"' in body
    response = client.post(f"/settings/index-keys/new/?project={project.pk}", {"key": "llm.quantization"})
    assert response.status_code == 400 and "nothing was changed" in response.content.decode()
    response = client.post(f"/settings/index-keys/remove/?project={project.pk}", {"key": "user.tier"})
    assert response.status_code == 503 and "nothing was changed" in response.content.decode()
    monkeypatch.undo()
    assert [k.key for k in attribute_index.indexed_keys(project_id=project.pk)] == ["user.tier"]
