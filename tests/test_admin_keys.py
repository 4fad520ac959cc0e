"""Admin and ingest keys (issue 14, item 2): the add form creates keys through the same service as
the settings page and shows the secret once; the project inline cannot make a key without a prefix
or hash; nothing there answers 503."""

from __future__ import annotations

import html
import re

import pytest
from django.test import Client

from projects.models import ApiKey
from projects.services import api_key_authenticate

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(admin_user):
    client = Client(raise_request_exception=False)  # as in production: an exception becomes handler500's answer
    client.force_login(admin_user)
    return client


def test_admin_add_key_chooses_the_project_and_shows_the_key_once(staff, project_with_key):
    project, _ = project_with_key("checkout")
    form = staff.get("/admin/projects/apikey/add/")
    assert form.status_code == 200
    body = form.content.decode()
    assert '<select name="project"' in body and f'<option value="{project.pk}">checkout</option>' in body
    assert 'name="key_hash"' not in body and 'name="prefix"' not in body

    created = staff.post("/admin/projects/apikey/add/", {"project": project.pk, "name": "from-admin"})
    assert created.status_code == 200, created.status_code
    assert "no-store" in created["Cache-Control"]
    body = created.content.decode()
    raw = re.search(r'<pre id="new-key-secret"><code>(td_[0-9a-f]{12}_[A-Za-z0-9_-]+)</code>', body).group(1)
    key = api_key_authenticate(raw_key=raw)
    assert key is not None and key.project == project and key.name == "from-admin"
    assert len(key.prefix) == 12 and len(key.key_hash) == 64
    assert "export TRACEDASH_ENDPOINT=http://testserver" in html.unescape(body)
    assert f'href="/settings/?project={project.pk}"' in body
    # The list and the change page never show the secret or the hash.
    listing = staff.get("/admin/projects/apikey/").content.decode()
    assert key.prefix in listing and raw not in listing and key.key_hash not in listing
    change = staff.get(f"/admin/projects/apikey/{key.pk}/change/").content.decode()
    assert key.key_hash not in change and raw not in change


def test_admin_add_key_without_a_project_is_a_form_error_not_an_outage(staff):
    response = staff.post("/admin/projects/apikey/add/", {"name": "orphan"})
    assert response.status_code == 200  # the form again, with its error
    body = response.content.decode()
    assert "This field is required" in body and "unavailable" not in body
    assert not ApiKey.objects.exists()


def test_admin_revokes_a_key_by_setting_revoked_at(staff, project_with_key):
    project, raw = project_with_key()
    key = ApiKey.objects.get(project=project)
    response = staff.post(f"/admin/projects/apikey/{key.pk}/change/",
                          {"name": key.name, "revoked_at_0": "2026-01-01", "revoked_at_1": "00:00:00"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert api_key_authenticate(raw_key=raw) is None
    key.refresh_from_db()
    assert key.project == project and key.prefix == raw.split("_")[1]  # read-only fields unchanged
    # Once revoked, revoked_at is read-only: clearing it does not bring the key back.
    staff.post(f"/admin/projects/apikey/{key.pk}/change/", {"name": key.name, "revoked_at_0": "", "revoked_at_1": ""})
    assert api_key_authenticate(raw_key=raw) is None


def test_the_project_inline_cannot_add_a_key_without_prefix_or_hash(staff, project_with_key):
    project, _ = project_with_key("inline")
    key = ApiKey.objects.get(project=project)
    page = staff.get(f"/admin/projects/project/{project.pk}/change/").content.decode()
    # No empty key row to add ("Add another" is offered only below the maximum, which is 0).
    assert 'name="api_keys-MAX_NUM_FORMS" value="0"' in page and 'name="api_keys-__prefix__-name"' not in page
    assert "Settings page" in page
    # A crafted POST with an extra inline key row (what "Add another" used to send) makes no key.
    response = staff.post(f"/admin/projects/project/{project.pk}/change/", {
        "name": "inline", "retention_days": "30",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "api_keys-TOTAL_FORMS": "2", "api_keys-INITIAL_FORMS": "1",
        "api_keys-0-id": key.pk, "api_keys-0-project": project.pk,
        "api_keys-1-project": project.pk, "api_keys-1-name": "inline-key"})
    assert response.status_code in (200, 302), response.status_code
    assert list(ApiKey.objects.filter(project=project)) == [key]
    assert not ApiKey.objects.filter(prefix="").exists()
