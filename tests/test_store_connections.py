"""The served app's pages do not leave a store connection behind per request (each page request
runs in a thread of its own; the store once kept a connection per thread, and the embedded
server's memory grew with every page served)."""

from __future__ import annotations

import urllib.request

import pytest

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def test_page_requests_reuse_the_store_connections(asgi_server, project_with_key, make_user, client):
    from store import get_store

    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    pool = get_store().backend._pool
    before = pool.open  # the test session's store: earlier tests' idle connections are reused
    for _ in range(40):
        request = urllib.request.Request(f"{asgi_server.url}/traces/rows.json", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=120) as response:  # a ceiling, for a loaded machine
            assert response.status == 200
            response.read()
    # One request at a time: a connection or two (the page's reads run side by side) serve all
    # forty; a connection per request thread would leave forty more.
    assert pool.open - before <= 6, (before, pool.open)
