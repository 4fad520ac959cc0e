"""The trace page's "not found" (issue 14, item 7): an unknown id, a malformed one and another
project's trace all answer 404 with an in-app page (navigation, the id asked for, escaped, a
search box and the way to the explorer), never Django's bare "Not Found"."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.spans import llm_trace, trace_id
from tests.trace_seed import seed

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


@pytest.fixture
def alice_and_bob(make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    theirs, _ = project_with_key(members=[bob])
    client = Client()
    client.force_login(alice)
    return client, mine, theirs


def in_app_404(response) -> str:
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert 'id="trace-not-found"' in html
    assert 'class="topbar"' in html and 'href="/traces/"' in html  # the base layout's navigation
    assert 'action="/traces/"' in html and 'name="trace_id"' in html  # the search box
    assert 'id="to-explorer"' in html
    return html


def test_unknown_trace_id_says_it_may_not_have_arrived_yet(alice_and_bob):
    client, mine, _ = alice_and_bob
    unknown = trace_id()
    html = in_app_404(client.get(f"/traces/{unknown}/"))
    assert f'<code class="asked-id">{unknown}</code>' in html
    assert f"not found in <strong>{mine.name}</strong>" in html
    assert "it may not have\n  arrived yet (spans are summarised within seconds)" in html


def test_uppercase_id_is_looked_up_lowercased(alice_and_bob):
    client, mine, _ = alice_and_bob
    tid = seed(llm_trace(), project_id=mine.pk)
    assert client.get(f"/traces/{tid.upper()}/").status_code == 200


@pytest.mark.parametrize("malformed", ["xyz", "1234", "g" * 32, "ab" * 40, "%3Cscript%3Ealert(1)%3C%2Fscript%3E"])
def test_malformed_id_is_an_in_app_404_echoing_it_escaped(alice_and_bob, malformed):
    client, _, _ = alice_and_bob
    html = in_app_404(client.get(f"/traces/{malformed}/"))
    assert "Not a trace id" in html and "32 hex characters" in html
    assert "<script>" not in html.split("</header>", 1)[1]
    if "script" in malformed:
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_another_projects_trace_is_not_found_and_not_revealed(alice_and_bob):
    client, mine, theirs = alice_and_bob
    tid = seed(llm_trace(name="their secret endpoint"), project_id=theirs.pk)
    for url in (f"/traces/{tid}/", f"/traces/{tid}/?project={theirs.pk}"):
        html = in_app_404(client.get(url))
        assert tid in html and "their secret endpoint" not in html and theirs.name not in html
    assert "a project you are not a member of" in in_app_404(client.get(f"/traces/{tid}/?project={theirs.pk}"))


def test_a_path_with_more_segments_under_traces_is_the_same_in_app_404(alice_and_bob):
    client, _, theirs = alice_and_bob
    html = in_app_404(client.get(f"/traces/abc/def/?project={theirs.pk}"))
    assert '<code class="asked-id">abc/def</code>' in html and theirs.name not in html
