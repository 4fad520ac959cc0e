"""Outages (issue 9, point 2): a dependency goes away, the product says so clearly (a 503 page or
JSON error, ``/healthz`` 503 naming it), keeps acknowledging ingestion where it can (spool), and
recovers by itself when the dependency returns, losing nothing acknowledged.

ClickHouse is made unavailable the way ``tests/support/serve_with_outages.py`` does it: every
store call raises ``StoreUnavailable`` while the outage is on (the writer's threads included,
since they run in this process)."""

from __future__ import annotations

import json
import secrets
import time

import pytest
from django.test import Client

from store import StoreUnavailable
from store.client import Store
from tests.conftest import wait_until
from tests.test_security_matrix import MATRIX, World, world  # noqa: F401 - the fixture is used by name

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


@pytest.fixture
def clickhouse_outage(monkeypatch):
    """A switch: ``outage["on"] = True`` makes every store call fail as an unreachable server."""
    state = {"on": False}
    for name in ("query", "command", "insert"):
        original = getattr(Store, name)

        def guarded(self, *args, __original=original, **kwargs):
            if state["on"]:
                raise StoreUnavailable("ClickHouse is down (test outage)", tag=kwargs.get("tag"))
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(Store, name, guarded)
    original_ping = Store.ping

    def ping(self, *args, **kwargs):
        if state["on"]:
            raise StoreUnavailable("ClickHouse is down (test outage)", tag="ping")
        return original_ping(self, *args, **kwargs)

    monkeypatch.setattr(Store, "ping", ping)
    return state


def _batch(n_traces: int = 5) -> tuple[bytes, set[tuple[str, str]]]:
    now = time.time_ns()
    spans, ids = [], set()
    for _ in range(n_traces):
        trace_id, root = secrets.token_hex(16), secrets.token_hex(8)
        for i in range(3):
            span_id = root if i == 0 else secrets.token_hex(8)
            spans.append({"trace_id": trace_id, "span_id": span_id, "parent_span_id": None if i == 0 else root,
                          "name": f"outage-{i}", "start_time": now - 10**9, "duration_ms": 5.0 + i})
            ids.add((trace_id, span_id))
    return json.dumps({"spans": spans}).encode(), ids


def _stored(project_id: int) -> tuple[set, int]:
    from store import get_store

    where = "WHERE project_id = {p:UInt64} AND startsWith(name, {prefix:String})"
    params = {"p": project_id, "prefix": "outage-"}
    rows = get_store().query(f"SELECT trace_id, span_id FROM spans {where}", params, tag="tests.outages").rows
    final = get_store().query(f"SELECT trace_id, span_id FROM spans FINAL {where}", params, tag="tests.outages").rows
    return {tuple(r) for r in final}, len(rows)


READ_URLS = [name for name, row in MATRIX.items() if row.kind in ("page", "json")]
# Pages whose content comes from ClickHouse: they must answer the "store down" 503. (Settings,
# alerts and load tests are metadata pages: they may still render, but never with a 500.)
CLICKHOUSE_PAGES = [name for name in READ_URLS if name.startswith("dashboard:") and name != "dashboard:settings"]


def test_clickhouse_outage_gives_clear_503s_spools_ingest_and_recovers(world, clickhouse_outage, client):
    from ingest.writer import get_writer

    alice = Client()
    alice.force_login(world.alice)
    for name in READ_URLS:  # baseline: everything works
        response = alice.get(MATRIX[name].path(world))
        assert response.status_code == MATRIX[name].member_status, (name, response.status_code)

    clickhouse_outage["on"] = True
    # Every page and JSON endpoint: never a 500; the ClickHouse-backed ones a clear 503.
    for name in READ_URLS:
        row = MATRIX[name]
        response = alice.get(row.path(world))
        assert response.status_code != 500, name
        if name in CLICKHOUSE_PAGES:
            assert response.status_code == 503, (name, response.status_code)
            if row.kind == "json" or response["Content-Type"].startswith("application/json"):
                body = response.json()
                assert "error" in body, (name, body)
            else:
                assert "trace store is unavailable" in response.content.decode(), name
        else:
            assert response.status_code in (row.member_status, 503), (name, response.status_code)

    health = client.get("/healthz")
    assert health.status_code == 503
    checks = health.json()["checks"]
    assert checks["clickhouse"]["ok"] is False and "down" in checks["clickhouse"]["error"]
    assert checks["database"]["ok"] is True

    # Ingestion still acknowledges: the spans go to the spool.
    acknowledged: set[tuple[str, str]] = set()
    for _ in range(3):
        body, ids = _batch()
        response = client.post("/api/v1/traces", body, content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {world.a_key}")
        assert response.status_code in (200, 202), (response.status_code, response.content)
        assert response.json()["accepted"] == len(ids)
        acknowledged |= ids
    wait_until(lambda: get_writer().health()["spooled_segments"] > 0, timeout=30, message="spans spooled")

    # ClickHouse returns: the spool replays by itself, pages and healthz recover.
    clickhouse_outage["on"] = False
    wait_until(lambda: get_writer().health()["spooled_segments"] == 0 and get_writer().health()["queued_rows"] == 0,
               timeout=60, message="spool replayed")
    stored, raw = _stored(world.a.pk)
    assert stored == acknowledged
    assert raw == len(acknowledged)  # stored exactly once, not only after FINAL
    assert client.get("/healthz").status_code == 200
    for name in READ_URLS:
        response = alice.get(MATRIX[name].path(world))
        assert response.status_code == MATRIX[name].member_status, (name, response.status_code)
