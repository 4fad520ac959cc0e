"""Ingest keys never reach the logs (issue 9, point 3): requests with a valid key, a wrong key
with a real prefix, a malformed header and a refused body, in-process and through a real uvicorn
server with its access log on, every logger at DEBUG (SQL included): the secret part of a key
appears in no log record, its message, arguments or extra fields. Django's error report (what
AdminEmailHandler mails and the DEBUG page shows) hides the Authorization header too."""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.db import connection
from django.test import Client, RequestFactory

from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def _secret(raw_key: str) -> str:
    return raw_key.split("_", 2)[2]


def _wrong(raw_key: str) -> str:
    prefix = raw_key.split("_", 2)[1]
    return f"td_{prefix}_{'W' * 20}wrongsecretpart"


def _everything_logged(records) -> str:
    parts = []
    for record in records:
        parts.append(record.getMessage())
        parts.append(repr(record.args))
        parts.append(repr({k: v for k, v in vars(record).items() if k not in ("args", "msg")}))
        if record.exc_info:
            parts.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(parts)


@pytest.fixture
def everything_at_debug(caplog):
    caplog.set_level(logging.DEBUG)
    for name in ("django", "django.request", "django.server", "django.db.backends", "tracedash", "ingest",
                 "uvicorn", "uvicorn.error", "uvicorn.access", "store"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    extra = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]  # do not propagate
    for logger in extra:
        logger.addHandler(caplog.handler)
    previous = connection.force_debug_cursor
    connection.force_debug_cursor = True  # SQL is logged even with DEBUG off
    yield caplog
    connection.force_debug_cursor = previous
    for logger in extra:
        logger.removeHandler(caplog.handler)


def test_keys_are_not_logged_in_process(project_with_key, everything_at_debug):
    project, key = project_with_key()
    wrong = _wrong(key)
    client = Client()
    body = json.dumps({"spans": llm_trace()})
    statuses = [
        client.post("/api/v1/traces", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}").status_code,
        client.post("/api/v1/traces", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {wrong}").status_code,
        client.post("/api/v1/traces", data=body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {key}").status_code,
        client.post("/api/v1/traces", data=b"{not json", content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {key}").status_code,
        client.post("/api/v1/resources", data=b"{}", content_type="application/json",
                    HTTP_AUTHORIZATION=f"Bearer {key}").status_code,
        client.get(f"/api/v1/traces/{'0' * 32}", HTTP_AUTHORIZATION=f"Bearer {key}").status_code,
        client.get(f"/api/v1/traces/{'0' * 32}", HTTP_AUTHORIZATION=f"Bearer {wrong}").status_code,
    ]
    # The Langfuse SDK's Basic key pair: right, with a wrong secret, mismatched, and malformed.
    public = f"td_{key.split('_', 2)[1]}"
    basics = [_basic(public, key), _basic(public, wrong), _basic("td_000000000000", key), f"Basic {key}"]
    statuses += [client.post("/api/public/otel/v1/traces", data=b"{}", content_type="application/json",
                             HTTP_AUTHORIZATION=auth).status_code for auth in basics]
    assert statuses == [200, 401, 401, 400, 400, 404, 401, 200, 401, 401, 401]
    logged = _everything_logged(everything_at_debug.records)
    assert "Unauthorized" in logged and "SELECT" in logged  # the capture does see these requests and their SQL
    for secret in (_secret(key), _secret(wrong), *(auth.split(" ", 1)[1] for auth in basics)):
        assert secret not in logged
        assert secret not in everything_at_debug.text


def _basic(public: str, secret: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{public}:{secret}".encode()).decode()


def _error_report(request, reporter_class) -> tuple[str, str]:
    """The text and HTML report of an error raised while handling ``request`` (from a frame that
    holds no key in its local variables, as a view's would not)."""
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        reporter = reporter_class(request, *sys.exc_info())
        return reporter.get_traceback_text(), reporter.get_traceback_html()


def test_error_report_hides_the_authorization_header(project_with_key):
    from django.views.debug import ExceptionReporter

    _, key = project_with_key()
    request = RequestFactory().post("/api/v1/traces", data=b"{}", content_type="application/json",
                                    HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_API_KEY=key)
    text, html = _error_report(request, ExceptionReporter)
    assert "HTTP_AUTHORIZATION" in text  # the header is listed, its value replaced
    assert _secret(key) not in text and _secret(key) not in html


def _free_port() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def test_keys_are_not_logged_through_the_server_access_path(project_with_key, everything_at_debug):
    """The real ASGI server, as ``manage.py serve`` runs it but with its access log on and at
    DEBUG (``serve`` itself keeps the access log off)."""
    import uvicorn

    from config.asgi import application

    project, key = project_with_key()
    wrong = _wrong(key)
    sock = _free_port()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, log_level="debug",
                                           access_log=True, lifespan="off", log_config=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        statuses = []
        for auth in (key, wrong):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/traces", method="POST",
                                             data=json.dumps({"spans": llm_trace()}).encode(),
                                             headers={"Authorization": f"Bearer {auth}",
                                                      "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    statuses.append(response.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
        assert statuses == [200, 401]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    logged = _everything_logged(everything_at_debug.records)
    assert "/api/v1/traces" in logged and " 401" in logged  # the access lines were captured
    for secret in (_secret(key), _secret(wrong)):
        assert secret not in logged
