"""SDK test helpers: the SDK on the import path, and a tiny scriptable HTTP server that stands in
for tracedash's ``POST /api/v1/traces`` (503/429/400/slow/hanging answers on demand)."""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "sdk") not in sys.path:
    sys.path.insert(0, str(ROOT / "sdk"))


class Answer:
    """One scripted answer: status, headers, JSON body (default: everything accepted), and an
    optional delay before answering (``hang=True`` waits until the server is released)."""

    def __init__(self, status=200, headers=None, body=None, delay=0.0, hang=False, close=False):
        self.status, self.headers, self.body, self.delay, self.hang = status, headers or {}, body, delay, hang
        self.close = close  # close the connection after answering, without saying so (a stale keep-alive)


class FakeTraceServer:
    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[Answer] = []
        self.default = Answer()
        self.release = threading.Event()
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real server
            disable_nagle_algorithm = True  # no delayed-ACK stalls (uvicorn sets TCP_NODELAY too)

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                payload = json.loads(body)
                with fake.lock:
                    fake.requests.append({"time": time.monotonic(), "path": self.path, "headers": dict(self.headers),
                                          "raw": raw, "payload": payload})
                    answer = fake.script.pop(0) if fake.script else fake.default
                if answer.hang:
                    fake.release.wait(30)
                if answer.delay:
                    time.sleep(answer.delay)
                body = answer.body if answer.body is not None else (
                    {"accepted": len(payload.get("spans", payload.get("scores", []))), "rejected": []} if answer.status == 200
                    else {"error": {"code": "scripted", "message": f"scripted {answer.status}", "details": []}})
                data = json.dumps(body).encode()
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in answer.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                    if answer.close:
                        self.wfile.flush()
                        self.close_connection = True
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def spans(self) -> list[dict]:
        with self.lock:
            return [span for request in self.requests for span in request["payload"]["spans"]]

    def answer(self, *answers: Answer) -> None:
        with self.lock:
            self.script.extend(answers)

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def trace_server():
    server = FakeTraceServer()
    yield server
    server.close()


@pytest.fixture
def make_tracer():
    """Tracers (and exporters) made by a test, shut down at its end."""
    import tracedash_sdk as td

    made = []

    def make(endpoint, api_key="td_test_key", exporter_kwargs=None, **kwargs):
        if exporter_kwargs is not None:
            exporter = td.BatchExporter(endpoint, api_key, **exporter_kwargs)
            tracer = td.Tracer(exporter=exporter, **kwargs)
        else:
            tracer = td.Tracer(endpoint=endpoint, api_key=api_key, **kwargs)
        made.append(tracer)
        return tracer

    yield make
    for tracer in made:
        tracer.shutdown(timeout=0.5)
