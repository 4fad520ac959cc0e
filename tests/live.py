"""A real ASGI server (uvicorn) serving the app in a background thread of the test process.

In-process because the embedded ClickHouse (chdb) can be opened by one process only, and the test
process already holds it. Tests that use it need ``django_db(transaction=True)`` so the server's
threads see the rows the test created.
"""

from __future__ import annotations

import socket
import threading
import time


class AsgiServer:
    """uvicorn serving ``config.asgi.application`` in a background thread of this process."""

    def __init__(self):
        import uvicorn

        from config.asgi import application

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # the OS picks a free port; no bind race
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        config = uvicorn.Config(application, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="uvicorn-browser-tests", daemon=True)

    def start(self, timeout=60.0):  # a ceiling: a loaded machine starts it later
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def wait_idle(self, timeout=30.0):
        """Wait until no connection is open and no request is being handled (a ceiling, not an
        error): a page's teardown closes the browser, and the requests and websockets it had open
        finish on the server's thread after that; the test database is flushed next, and a handler
        still reading a table then makes SQLite refuse the flush ("database table is locked")."""
        state = self.server.server_state
        deadline = time.monotonic() + timeout
        while (state.connections or state.tasks) and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
