"""404s: API and JSON URLs answer the API's JSON error, pages Django's 404 page."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = [pytest.mark.django_db]


def test_unknown_api_path_is_a_json_404_naming_it(project_with_key):
    _, key = project_with_key()
    answer = Client().get("/api/v1/nothing-here", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("application/json")
    error = answer.json()["error"]
    assert error["code"] == "not_found" and "no such endpoint: /api/v1/nothing-here" in error["message"]


def test_a_trailing_slash_gets_a_hint(project_with_key):
    _, key = project_with_key()
    path = f"/api/v1/traces/{'ab' * 16}/"
    answer = Client().get(path, HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 404 and answer.json()["error"]["message"].endswith(
        f"(without the trailing slash: {path[:-1]})")


def test_user_text_in_the_path_stays_data(project_with_key):
    answer = Client().get("/api/v1/<script>alert(1)</script>")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("application/json")
    assert "<script>" in answer.json()["error"]["message"]  # JSON string, never rendered as HTML


def test_unknown_page_is_an_html_404():
    answer = Client().get("/no-such-page/")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("text/html")
