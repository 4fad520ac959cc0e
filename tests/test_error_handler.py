"""handler500 (config/errors.py): only a database that cannot be reached is an outage (503); a
database that refused what the request asked for (IntegrityError, DataError) is the request's
fault (400), and SQL bugs stay a 500."""

from __future__ import annotations

import json

import pytest
from django.db import (DatabaseError, DataError, IntegrityError, InterfaceError, InternalError, NotSupportedError,
                       OperationalError, ProgrammingError)

from config.errors import is_database_outage, server_error


def _answer(rf, path, exc, **headers):
    try:
        raise exc
    except Exception:  # noqa: BLE001 - handler500 runs inside the exception, as Django calls it
        return server_error(rf.get(path, **headers))


@pytest.mark.parametrize("exc", [OperationalError("server closed the connection unexpectedly"),
                                 InterfaceError("connection already closed"), InternalError("x"),
                                 DatabaseError("unclassified")])
def test_lost_connections_are_outages(rf, exc):
    assert is_database_outage(exc)
    page = _answer(rf, "/settings/", exc)
    assert page.status_code == 503 and page["Retry-After"]
    api = _answer(rf, "/api/v1/traces", exc)
    assert api.status_code == 503 and json.loads(api.content)["error"]["code"] == "database_unavailable"


@pytest.mark.parametrize("exc", [IntegrityError("NOT NULL constraint failed: projects_apikey.project_id"),
                                 DataError("value too long for type character varying(16)")])
def test_integrity_and_data_errors_are_a_400_not_an_outage(rf, exc):
    assert not is_database_outage(exc)
    page = _answer(rf, "/admin/projects/apikey/add/", exc)
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
    assert b"unavailable" not in page.content and b"refused" in page.content
    assert b"NOT NULL" not in page.content and b"varying" not in page.content  # no database detail leaks
    assert not page.has_header("Retry-After")
    api = _answer(rf, "/api/v1/traces", exc)
    assert api.status_code == 400 and json.loads(api.content)["error"]["code"] == "conflict"


@pytest.mark.parametrize("exc", [ProgrammingError("no such column"), NotSupportedError("x")])
def test_sql_bugs_stay_a_500(rf, exc):
    assert not is_database_outage(exc)
    page = _answer(rf, "/traces/", exc)
    assert page.status_code == 500 and b"no such column" not in page.content


@pytest.mark.django_db
def test_an_integrity_error_in_a_real_request_is_a_400(client, admin_user, project_with_key, monkeypatch):
    """End to end through Django's handler: a view that hits a unique constraint answers 400, not the
    503 "metadata database unavailable" it used to."""
    from django.test import Client

    from projects.models import Project

    project, _ = project_with_key("taken")
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)

    def duplicate(self, request, obj, form, change):
        Project.objects.create(name="taken")  # bypasses the form's own unique check: a real IntegrityError

    monkeypatch.setattr("projects.admin.ProjectAdmin.save_model", duplicate)
    response = client.post("/admin/projects/project/add/", {
        "name": "fresh", "retention_days": "30",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0"})
    assert response.status_code == 400, response.status_code
    assert b"metadata database" not in response.content
    assert list(Project.objects.values_list("name", flat=True)) == ["taken"]  # nothing half-written
