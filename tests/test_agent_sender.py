"""The agent's sender against a tiny local HTTP server (200, 503 + Retry-After, 400, 413, down)."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.sender import MAX_RETRY_AFTER, ResourceSender, parse_retry_after, resources_url

AGENT_LOG = "tracedash.agent"
T0 = 1_800_000_000 * 10**9


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        server: Recorder = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        raw = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
        samples = json.loads(raw)["samples"]
        with server.lock:
            status, headers, answer = server.script.pop(0) if server.script else (200, {}, None)
            server.requests.append({"path": self.path, "headers": dict(self.headers), "samples": samples, "status": status})
        if answer is None:
            answer = {"accepted": len(samples), "rejected": []}
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.script: list[tuple[int, dict, object]] = []  # answers to give, in order; then 200
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def received(self) -> list[dict]:
        """The samples of the requests answered 2xx."""
        return [s for r in self.requests if 200 <= r["status"] < 300 for s in r["samples"]]

    def close(self):
        self.shutdown()
        self.server_close()


@pytest.fixture
def server():
    recorder = Recorder()
    yield recorder
    recorder.close()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _samples(n, start=0):
    return [{"host": "h", "time": T0 + i, "gpu_index": -1, "cpu_percent": 1.0} for i in range(start, start + n)]


def _error(code, message, details=()):
    return {"error": {"code": code, "message": message, "details": list(details)}}


def test_flush_posts_gzip_batches_of_at_most_1000_in_order(server):
    sender = ResourceSender(server.url, "td_secret_key")
    sender.add(_samples(2500))
    assert sender.stats["buffered"] == 2500
    assert sender.flush() is True
    assert [len(r["samples"]) for r in server.requests] == [1000, 1000, 500]
    assert [s["time"] for s in server.received] == [T0 + i for i in range(2500)]
    first = server.requests[0]
    assert first["path"] == "/api/v1/resources"
    assert first["headers"]["Authorization"] == "Bearer td_secret_key"
    assert first["headers"]["Content-Encoding"] == "gzip" and first["headers"]["Content-Type"] == "application/json"
    assert sender.stats == {"sent": 2500, "dropped": 0, "failed": 0, "retries": 0, "buffered": 0, "requests": 3,
                            "last_error": None}
    assert sender.flush() is True and len(server.requests) == 3  # nothing left: no request


def test_sampler_rows_are_sent_as_api_samples(server):
    row = {"time": T0, "host": "gpu-1", "gpu_index": 0, "gpu_uuid": "GPU-1", "gpu_name": "H100", "gpu_utilization": 97.0,
           "gpu_memory_used": 7, "gpu_memory_total": 8, "gpu_temperature": None, "gpu_power_watts": 350.5,
           "cpu_percent": None, "memory_used": None, "memory_total": None,
           "process_pids": [42], "process_names": ["python"], "process_gpu_memory": [6]}
    sender = ResourceSender(server.url + "/", "k")
    sender.add([row])
    assert sender.flush()
    assert server.received == [{"host": "gpu-1", "time": T0, "gpu_index": 0, "gpu_uuid": "GPU-1", "gpu_name": "H100",
                                "gpu_utilization": 97.0, "gpu_memory_used": 7, "gpu_memory_total": 8,
                                "gpu_power_watts": 350.5, "processes": [{"pid": 42, "name": "python", "gpu_memory": 6}]}]


def test_503_with_retry_after_keeps_samples_and_waits(server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    clock = Clock()
    server.script = [(503, {"Retry-After": "30"}, _error("spool_full", "the local spool is full; retry later"))]
    sender = ResourceSender(server.url, "k", clock=clock)
    sender.add(_samples(3))
    assert sender.flush() is False
    stats = sender.stats
    assert (stats["sent"], stats["buffered"], stats["retries"], stats["failed"]) == (0, 3, 1, 0)
    assert "spool_full" in stats["last_error"]
    assert sender.retry_in() == pytest.approx(30)
    clock.now += 29
    assert sender.flush() is False and len(server.requests) == 1  # Retry-After not over: no request at all
    clock.now += 1.5
    assert sender.flush() is True and len(server.requests) == 2
    assert [s["time"] for s in server.requests[1]["samples"]] == [T0, T0 + 1, T0 + 2]  # the same samples, again
    assert server.received == server.requests[1]["samples"]
    assert sender.stats["sent"] == 3 and sender.stats["buffered"] == 0 and sender.stats["last_error"] is None
    messages = [r.getMessage() for r in caplog.records if r.name == AGENT_LOG]
    assert any("HTTP 503" in m and "Retry-After" in m for m in messages)
    assert any("reachable again" in m for m in messages)


def test_429_and_other_5xx_keep_samples(server):
    clock = Clock()
    server.script = [(429, {"Retry-After": "2"}, _error("rate_limited", "slow down")), (502, {}, "bad gateway")]
    sender = ResourceSender(server.url, "k", clock=clock)
    sender.add(_samples(2))
    assert not sender.flush()
    clock.now += 2
    assert not sender.flush()  # 502, no Retry-After: the next flush may try at once
    assert sender.flush()
    assert sender.stats["retries"] == 2 and sender.stats["sent"] == 2 and len(server.requests) == 3


def test_400_drops_that_batch_logs_the_server_message_and_goes_on(server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    server.script = [(400, {}, _error("invalid_samples", "all 2 samples were rejected",
                                      [{"index": 0, "field": "gpu_memory_used", "message": "exceeds gpu_memory_total"}]))]
    sender = ResourceSender(server.url, "k", batch_size=2)
    sender.add(_samples(4))
    assert sender.flush() is True
    assert [len(r["samples"]) for r in server.requests] == [2, 2]
    stats = sender.stats
    assert (stats["sent"], stats["failed"], stats["buffered"], stats["retries"]) == (2, 2, 0, 0)
    errors = [r.getMessage() for r in caplog.records if r.name == AGENT_LOG and r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "all 2 samples were rejected" in errors[0] and "exceeds gpu_memory_total" in errors[0]


def test_a_400_that_is_not_the_api_answering_keeps_the_samples(server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    server.script = [(400, {"Content-Type": "text/html"}, b"<h1>Bad Request (400)</h1>")]  # e.g. Django's DisallowedHost
    sender = ResourceSender(server.url, "k")
    sender.add(_samples(2))
    assert sender.flush() is False
    assert sender.stats["buffered"] == 2 and sender.stats["failed"] == 0 and sender.stats["retries"] == 1
    [error] = [r.getMessage() for r in caplog.records if r.name == AGENT_LOG and r.levelno == logging.ERROR]
    assert "Bad Request (400)" in error and "TRACEDASH_ALLOWED_HOSTS" in error
    assert sender.flush() is True and sender.stats["sent"] == 2


def test_a_200_with_rejected_samples_counts_them_failed(server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    server.script = [(200, {}, {"accepted": 2, "rejected": [{"index": 1, "field": "time", "message": "time is outside"}]})]
    sender = ResourceSender(server.url, "k")
    sender.add(_samples(3))
    assert sender.flush()
    assert sender.stats["sent"] == 2 and sender.stats["failed"] == 1
    assert any("time is outside" in r.getMessage() for r in caplog.records if r.name == AGENT_LOG)


def test_413_halves_the_batch(server):
    server.script = [(413, {}, _error("too_many_items", "at most 2 samples per request, got 8")),
                     (413, {}, _error("too_many_items", "at most 2 samples per request, got 4"))]
    sender = ResourceSender(server.url, "k", batch_size=8)
    sender.add(_samples(8))
    assert sender.flush()
    assert [len(r["samples"]) for r in server.requests] == [8, 4, 2, 2, 2, 2]
    assert sender.stats["sent"] == 8 and sender.stats["failed"] == 0 and sender.batch_size == 2


def test_401_keeps_samples_and_says_to_check_the_key(server, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    server.script = [(401, {}, _error("unauthorized", "invalid ingest key"))] * 2
    sender = ResourceSender(server.url, "wrong")
    sender.add(_samples(1))
    assert not sender.flush() and not sender.flush()
    assert sender.stats["buffered"] == 1 and sender.stats["failed"] == 0
    errors = [r.getMessage() for r in caplog.records if r.name == AGENT_LOG and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "invalid ingest key" in errors[0] and "--api-key" in errors[0]  # said once


def test_server_down_keeps_samples_then_delivers_them(server, closed_port_url, caplog):
    caplog.set_level(logging.INFO, AGENT_LOG)
    sender = ResourceSender(closed_port_url, "k", timeout=2)
    sender.add(_samples(5))
    assert sender.flush() is False
    sender.add(_samples(5, start=5))
    assert sender.flush() is False
    stats = sender.stats
    assert (stats["buffered"], stats["retries"], stats["sent"], stats["dropped"]) == (10, 2, 0, 0)
    assert "cannot reach" in stats["last_error"]
    warnings = [r for r in caplog.records if r.name == AGENT_LOG and r.levelno == logging.WARNING]
    assert len(warnings) == 1  # an outage is logged when it starts, not at every try
    sender.url = resources_url(server.url)  # the server is back
    assert sender.flush() is True
    assert [s["time"] for s in server.received] == [T0 + i for i in range(10)]


def test_the_buffer_is_bounded_and_drops_the_oldest(server, closed_port_url):
    sender = ResourceSender(closed_port_url, "k", max_buffer_samples=5)
    for i in range(8):
        sender.add(_samples(1, start=i))
        sender.flush()
    stats = sender.stats
    assert (stats["buffered"], stats["dropped"], stats["sent"]) == (5, 3, 0)
    assert sender.add(_samples(4, start=8)) == 4 and sender.stats["dropped"] == 7
    sender.url = resources_url(server.url)
    assert sender.flush()
    assert [s["time"] - T0 for s in server.received] == [7, 8, 9, 10, 11]  # the newest five
    assert sender.stats["sent"] == 5 and sender.stats["buffered"] == 0


def test_a_server_that_never_answers_times_out_and_keeps_samples():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection (backlog) but never answers
    try:
        sender = ResourceSender(f"http://127.0.0.1:{listener.getsockname()[1]}", "k", timeout=0.3)
        sender.add(_samples(2))
        assert sender.flush() is False
        assert sender.stats["buffered"] == 2 and sender.stats["retries"] == 1
        assert "timed out" in sender.stats["last_error"]
    finally:
        listener.close()


def test_retry_after_parsing():
    assert parse_retry_after("5") == 5 and parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0 and parse_retry_after("99999") == MAX_RETRY_AFTER
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0


def test_endpoint_forms():
    assert resources_url("http://tracedash:8000") == "http://tracedash:8000/api/v1/resources"
    assert resources_url("https://td.example.com/") == "https://td.example.com/api/v1/resources"
    assert resources_url("http://td/api/v1/resources") == "http://td/api/v1/resources"
    with pytest.raises(ValueError):
        ResourceSender("http://td", "k", max_buffer_samples=0)
