"""Ingest POSTs served by config.fast_path.ApiFastPath (issue 15, item 4): through the real ASGI
application, past Django's page middleware — no thread started per request, the same answers
(validation errors, 401s, the handler500's 503 for a lost database), the security headers, the
host check — and everything else still served by Django."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.testing import ApplicationCommunicator
from django.db import OperationalError

from tests.spans import llm_trace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.clickhouse,
              pytest.mark.usefixtures("remembered_keys")]



def _call(method: str, path: str, body: bytes = b"", headers: dict | None = None, host: str = "localhost",
          query: bytes = b""):
    from config.asgi import application

    headers = {"host": host, "content-type": "application/json", **(headers or {})}
    if body:
        headers["content-length"] = str(len(body))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}

    async def run():
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await comm.receive_output(60)
        chunks = []
        while True:
            message = await comm.receive_output(60)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await comm.wait(60)
        return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, b"".join(chunks)

    return asyncio.run(run())


def _spans(n: int = 1) -> bytes:
    return json.dumps({"spans": [s for _ in range(n) for s in llm_trace()]}).encode()


def _counting_threads(monkeypatch) -> list:
    started = []
    original = threading.Thread.start

    def counting_start(self, *args, **kwargs):
        started.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    return started


def test_a_batch_is_stored_without_starting_a_thread_and_with_the_security_headers(project_with_key, monkeypatch):
    _, raw = project_with_key()
    auth = {"authorization": f"Bearer {raw}"}
    status, headers, body = _call("POST", "/api/v1/traces", _spans(), auth)  # first use: the key from the database
    assert status == 200 and json.loads(body)["accepted"] == len(llm_trace()), body

    started = _counting_threads(monkeypatch)
    for _ in range(5):
        status, headers, body = _call("POST", "/api/v1/traces", _spans(), auth)
        assert status == 200 and json.loads(body) == {"accepted": len(llm_trace()), "rejected": []}
    # Through Django's handler each request starts a thread for its sync middleware; here none does.
    assert started == []
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"
    assert int(headers["content-length"]) == len(body)
    assert "set-cookie" not in headers and "vary" not in headers  # no session, no CSRF cookie


def test_langfuses_path_with_a_key_pair_takes_the_fast_path(project_with_key, monkeypatch):
    """The Langfuse SDK's export (its path, Basic with the key pair) is served like any ingest POST."""
    import base64

    from projects.services import api_key_public_key

    _, raw = project_with_key()
    auth = {"authorization": "Basic " + base64.b64encode(f"{api_key_public_key(raw_key=raw)}:{raw}".encode()).decode()}
    assert _call("POST", "/api/public/otel/v1/traces", b"{}", auth)[0] == 200  # first use: the key from the database
    started = _counting_threads(monkeypatch)
    status, headers, body = _call("POST", "/api/public/otel/v1/traces", b"{}", auth)
    assert (status, json.loads(body)) == (200, {}) and started == []
    assert headers["x-content-type-options"] == "nosniff" and "set-cookie" not in headers


def test_errors_answer_as_through_django(project_with_key):
    _, raw = project_with_key()
    auth = {"authorization": f"Bearer {raw}"}
    status, _, body = _call("POST", "/api/v1/traces", b'{"spans": 3}', auth)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_payload"
    status, _, body = _call("POST", "/api/v1/traces", _spans(), {"authorization": "Bearer td_000000000000_nope"})
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_key"
    status, headers, body = _call("POST", "/api/v1/traces", _spans())
    assert status == 401 and json.loads(body)["error"]["code"] == "missing_key" and headers["www-authenticate"] == "Bearer"
    status, _, body = _call("POST", "/api/v1/traces", _spans(), auth, host="evil.example")
    assert status == 400 and json.loads(body)["error"]["code"] == "bad_host"
    # Not POST, or not an ingest view: Django answers, as before.
    status, headers, body = _call("GET", "/api/v1/traces", headers=auth)
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
    status, _, body = _call("POST", "/api/v1/nothing-here", _spans(), auth)
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def test_a_lost_metadata_database_is_a_json_503(project_with_key, monkeypatch):
    _, raw = project_with_key()

    def down(**kwargs):
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr("ingest.auth.api_key_authenticate", down)
    status, headers, body = _call("POST", "/v1/traces", b"{}", {"authorization": f"Bearer {raw}"})
    assert status == 503, body
    assert json.loads(body)["error"]["code"] == "database_unavailable" and "retry-after" in headers


def test_reads_with_a_key_take_the_fast_path_and_reads_with_a_session_go_to_django(project_with_key, monkeypatch):
    _, raw = project_with_key()
    auth = {"authorization": f"Bearer {raw}"}
    spans = llm_trace()
    assert _call("POST", "/api/v1/traces", json.dumps({"spans": spans}).encode(), auth)[0] == 200
    from analytics.summarizer import traces_summarize

    traces_summarize()
    path = f"/api/v1/traces/{spans[0]['trace_id']}"
    status, _, body = _call("GET", path, headers=auth)  # the first read may start Django's thread for sync code
    assert status == 200 and len(json.loads(body)["spans"]) == len(spans)
    started = _counting_threads(monkeypatch)
    status, headers, body = _call("GET", path, headers=auth)
    assert status == 200 and json.loads(body)["trace_id"] == spans[0]["trace_id"]
    status, _, body = _call("GET", "/api/v1/series/overview", headers=auth, query=b"range=1h")
    assert status == 200 and json.loads(body)["project_id"]
    # The product's bounded reader pools may add a worker (up to their size) when a read is submitted
    # before the previous one's worker has marked itself idle, a race a busy machine makes likely;
    # what must not happen is a thread per request (Django's sync thread).
    bounded = ("tracedash-trace-events_", "panel-read_")
    assert [name for name in started if not name.startswith(bounded)] == [], f"threads started by the reads: {started}"
    assert headers["x-content-type-options"] == "nosniff"
    # The same reads with a bad key, no key or a blank header: Django's path, the same JSON errors.
    status, _, body = _call("GET", path, headers={"authorization": "Bearer td_000000000000_nope"})
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_key"
    for headers, code in (({}, "missing_key"), ({"authorization": "  "}, "bad_authorization")):
        status, _, body = _call("GET", path, headers=headers)
        assert status == 401 and json.loads(body)["error"]["code"] == code, body
    status, _, body = _call("GET", "/api/v1/series/overview", headers=auth, query=b"range=2y")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_parameter"
