"""Projects, members and ingest keys."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from projects.models import ApiKey, Project
from projects.selectors import project_for_user, projects_for_user
from projects.services import api_key_authenticate, api_key_create, api_key_revoke, local_admin_ensure

pytestmark = pytest.mark.django_db


def test_create_project_prints_the_key_on_its_last_line_and_stores_only_a_hash():
    out = StringIO()
    call_command("create_project", "checkout-api", stdout=out)
    key = out.getvalue().strip().splitlines()[-1]
    assert key.startswith("td_")
    project = Project.objects.get(name="checkout-api")
    stored = ApiKey.objects.get(project=project)
    assert stored.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in {stored.prefix, stored.key_hash, stored.name}  # the secret is nowhere in the row
    authenticated = api_key_authenticate(raw_key=key)
    assert authenticated is not None and authenticated.project == project


def test_create_project_refuses_duplicates_and_unknown_members(make_user):
    call_command("create_project", "dup", stdout=StringIO())
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_project", "dup", stdout=StringIO())
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_project", "other", "--member", "ghost", stdout=StringIO())
    assert not Project.objects.filter(name="other").exists()
    alice = make_user("alice")
    call_command("create_project", "with-alice", "--member", "alice", stdout=StringIO())
    assert [p.name for p in projects_for_user(user=alice)] == ["with-alice"]


def test_wrong_secret_with_a_valid_prefix_is_refused(project_with_key):
    _, key = project_with_key()
    prefix = key.rsplit("_", 1)[0]
    assert api_key_authenticate(raw_key=prefix + "_" + "A" * 32) is None
    assert api_key_authenticate(raw_key=key[:-1] + ("a" if key[-1] != "a" else "b")) is None
    for junk in ("", "td_", "td_short_x", "Bearer x", key + "x"):
        assert api_key_authenticate(raw_key=junk) is None


def test_revoked_keys_stop_working_at_once(project_with_key):
    project, key = project_with_key()
    second, second_raw = api_key_create(project=project, name="ci")
    api_key_revoke(key=ApiKey.objects.get(project=project, name="default"))
    assert api_key_authenticate(raw_key=key) is None
    assert api_key_authenticate(raw_key=second_raw) == second


def test_users_see_only_projects_they_belong_to(project_with_key, make_user):
    alice, bob = make_user("alice"), make_user("bob")
    a, _ = project_with_key("a", members=[alice])
    b, _ = project_with_key("b", members=[bob])
    assert list(projects_for_user(user=alice)) == [a]
    assert project_for_user(user=alice, project_id=b.pk) is None
    assert project_for_user(user=bob, project_id=b.pk) == b
    assert project_for_user(user=bob, project_id="not-a-number") is None


def test_first_start_creates_an_admin_once_with_a_first_project():
    created = local_admin_ensure()
    user, password = created["user"], created["password"]
    assert password and user.is_superuser and user.check_password(password)
    assert [p.name for p in projects_for_user(user=user)] == ["default"]
    assert api_key_authenticate(raw_key=created["key"]).project == created["project"]
    again = local_admin_ensure()
    assert again == {"user": user, "password": None, "project": None, "key": None}  # a second start reuses all
    assert Project.objects.count() == 1
