"""A real local HTTP receiver for alert notifications (an http.server thread).

    with WebhookReceiver() as hook:
        hook.fail_next(500, 500)      # the next two requests get HTTP 500, then 200
        ... hook.url ...
        hook.requests                 # [Received(path, headers, body, json, at)]
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict
    body: bytes
    json: object
    at: float  # time.time() when it arrived


class WebhookReceiver:
    def __init__(self):
        receiver = self
        self.requests: list[Received] = []
        self._failures: list[int] = []
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                with receiver._lock:
                    status = receiver._failures.pop(0) if receiver._failures else 200
                    if status == 200:
                        try:
                            parsed = json.loads(body)
                        except ValueError:
                            parsed = None
                        receiver.requests.append(Received(self.path, dict(self.headers), body, parsed, time.time()))
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"try again")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)

    def fail_next(self, *statuses: int) -> None:
        with self._lock:
            self._failures.extend(statuses)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
