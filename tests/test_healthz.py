import pytest
from django.conf import settings

import store
from config.env import parse_clickhouse_url
from store import Store
from store.backends import NativeBackend

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def test_healthz_reports_web_clickhouse_and_database(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    expected = {"web", "clickhouse", "database", "ingest"}
    if any(str(url).startswith(("redis://", "rediss://"))
           for url in (settings.ENV.broker_url, settings.ENV.channel_layer_url) if url):
        expected.add("redis")  # production mode on Redis (the CI's second run): checked too
    assert set(body["checks"]) == expected
    assert all(check["ok"] for check in body["checks"].values())
    parts = body["checks"]["clickhouse"]["active_parts"]
    assert isinstance(parts, int) and parts >= 0


def test_healthz_fails_when_clickhouse_is_down(client):
    down = Store(NativeBackend(parse_clickhouse_url("clickhouse://127.0.0.1:1/x?connect_timeout=0.5")))
    previous = store.set_store(down)
    try:
        response = client.get("/healthz")
    finally:
        store.set_store(previous)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["clickhouse"]["ok"] is False and "unreachable" in body["checks"]["clickhouse"]["error"]
    assert body["checks"]["database"]["ok"] is True


def test_traces_page_says_so_when_clickhouse_is_down(client, make_user, project_with_key):
    user = make_user()
    project_with_key(members=[user])
    client.force_login(user)
    previous = store.set_store(Store(NativeBackend(parse_clickhouse_url("clickhouse://127.0.0.1:1/x?connect_timeout=0.5"))))
    try:
        response = client.get("/traces/")
    finally:
        store.set_store(previous)
    assert response.status_code == 503
    assert "trace store is unavailable" in response.content.decode()


def test_healthz_reports_memory_of_the_process_and_of_clickhouse(client):
    """The figures an operator reads when a server's memory grows: the process's RSS, Python's
    allocated blocks (which climb with objects kept) and ClickHouse's own accounting and caches."""
    before = client.get("/healthz").json()["checks"]
    kept = [object() for _ in range(200_000)]
    block = bytearray(64 * 2**20)  # one malloc block of its own, written: resident, anonymous
    after = client.get("/healthz").json()["checks"]
    web, clickhouse = after["web"]["memory"], after["clickhouse"]["memory"]
    assert web["rss_bytes"] > 10 * 2**20 and web["max_rss_bytes"] >= web["rss_bytes"] // 2
    assert web["python_allocated_blocks"] - before["web"]["memory"]["python_allocated_blocks"] >= 150_000
    # glibc's malloc (where the C library is glibc 2.33 or later, as on the servers this runs on)
    # and the anonymous part of the RSS count the block; what the server frees shows up as free or
    # as nothing, never as in use.
    from config import memory

    if memory.heap() is not None:  # glibc 2.33 or later: the figures are there
        grew = {key: web[key] - before["web"]["memory"][key] for key in ("heap_in_use_bytes", "rss_anon_bytes")}
        assert grew["heap_in_use_bytes"] >= 64 * 2**20 and grew["rss_anon_bytes"] >= 48 * 2**20, grew
        assert web["heap_free_bytes"] >= 0 and web["rss_anon_bytes"] <= web["rss_bytes"]
    else:
        assert "heap_in_use_bytes" not in web
    assert set(clickhouse) == {"tracked_bytes", "mark_cache_bytes", "uncompressed_cache_bytes",
                               "primary_index_cache_bytes", "query_cache_bytes"}
    assert all(isinstance(value, int) and value >= 0 for value in clickhouse.values())
    assert clickhouse["tracked_bytes"] > 0
    del kept, block
