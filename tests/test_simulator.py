"""The OpenAI-compatible LLM simulator (demo.simulator): schema, timing, errors, capacity.

Plain tests: no Django database, no ClickHouse. Each test starts its own simulator with serve() on a
free port and talks to it with http.client, timing the bytes as they arrive.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from demo.simulator import ModelProfile, SimulatorConfig, serve
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
CHAT = "/v1/chat/completions"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    elapsed_ms: float = 0.0
    # streamed replies: (ms since the request was sent, the text after "data: ")
    events: list[tuple[float, str]] = field(default_factory=list)

    def json(self):
        return json.loads(self.body)

    @property
    def chunks(self) -> list[dict]:
        assert self.events and self.events[-1][1] == "[DONE]", "a stream ends with data: [DONE]"
        return [json.loads(data) for _, data in self.events[:-1]]

    def content_times(self) -> list[float]:
        """Arrival times of the chunks that carry generated text."""
        return [t for t, data in self.events[:-1] if json.loads(data)["choices"]
                and json.loads(data)["choices"][0]["delta"].get("content")]


def call(port: int, method: str, path: str, payload=None, *, raw: bytes | None = None, stream: bool = False,
         close_after_first: bool = False, timeout: float = 120.0) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else None)
        t0 = time.perf_counter()
        conn.request(method, path, body=body, headers={"content-type": "application/json"} if body is not None else {})
        response = conn.getresponse()
        reply = Reply(response.status, {k.lower(): v for k, v in response.getheaders()})
        if not stream or response.status != 200:  # errors are JSON, streamed requests' too
            reply.body = response.read()
        else:
            expect_blank = False
            while True:
                line = response.readline()
                if not line:
                    break
                now = (time.perf_counter() - t0) * 1000.0
                if expect_blank:
                    assert line == b"\n", f"an SSE event ends with a blank line, got {line!r}"
                    expect_blank = False
                    continue
                assert line.startswith(b"data: ") and line.endswith(b"\n"), f"not an SSE data line: {line!r}"
                reply.events.append((now, line[6:-1].decode()))
                expect_blank = True
                if close_after_first:
                    break
            assert close_after_first or not expect_blank, "the stream ended inside an event"
        reply.elapsed_ms = (time.perf_counter() - t0) * 1000.0
        return reply
    finally:
        conn.close()


def chat(port: int, *, stream: bool = False, include_usage: bool = False, content: str = "Hello, simulator!",
         model: str = "sim-gpt", **extra) -> Reply:
    payload = {"model": model, "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": content}], **extra}
    if stream:
        payload["stream"] = True
        if include_usage:
            payload["stream_options"] = {"include_usage": True}
    return call(port, "POST", CHAT, payload, stream=stream)


def concurrently(n: int, fn):
    """Run fn(i) for i in range(n) in threads released together; results in order."""
    results: list = [None] * n
    errors: list = []
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if errors:
        raise errors[0]
    return results


def ceiling(configured_ms: float) -> float:
    """The most a timing may measure when ``configured_ms`` is what the simulator was told: a
    generous bound, relative to the configuration, that a loaded machine stays under (these tests
    check what the simulator does, not how fast the machine is: bench/ measures speed). The lower
    bounds, which a slow machine can only exceed, carry the precise checks."""
    return 3.0 * configured_ms + 1000.0


@pytest.fixture
def simulator():
    started = []

    def start(**settings):
        base = settings.pop("base", None)
        config = base if base is not None else SimulatorConfig.instant(**settings)
        sim = serve(config)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


# --------------------------------------------------------------------------------------------------
# Schema


def test_non_streamed_reply_follows_the_openai_schema(simulator):
    sim = simulator(seed=1, output_tokens_mean=12, output_tokens_std=0)
    content = "x" * 31  # "Be brief." (9) + 31 = 40 chars -> 10 prompt tokens
    reply = chat(sim.port, content=content, max_tokens=7)
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and abs(body["created"] - time.time()) < 60
    assert body["model"] == "sim-gpt"
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    assert isinstance(choice["message"]["content"], str) and len(choice["message"]["content"].split()) == 7
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}
    assert float(reply.headers["x-sim-ttft-ms"]) < ceiling(0)

    # No max_tokens: the configured length distribution (here exactly 12) and a natural stop.
    body = chat(sim.port, content=content).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}
    # max_completion_tokens is the newer name of max_tokens.
    assert chat(sim.port, max_completion_tokens=3).json()["usage"]["completion_tokens"] == 3


def test_streamed_reply_follows_the_openai_schema(simulator):
    sim = simulator(seed=2)
    reply = chat(sim.port, stream=True, include_usage=True, content="y" * 35, max_tokens=9)  # 44 chars -> 11 tokens
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    chunks = reply.chunks
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["model"] == "sim-gpt" and isinstance(c["created"], int) for c in chunks)
    *choice_chunks, usage_chunk = chunks
    assert choice_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = [c["choices"][0]["delta"].get("content") for c in choice_chunks]
    assert len([p for p in pieces if p]) == 9
    text = "".join(p for p in pieces if p)
    assert len(text.split()) == 9 and not text.startswith(" ")
    assert [c["choices"][0]["finish_reason"] for c in choice_chunks] == [None] * 10 + ["length"]
    assert choice_chunks[-1]["choices"][0]["delta"] == {}
    assert all(c["usage"] is None for c in choice_chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}

    # Without stream_options.include_usage: no usage chunk, no usage key.
    chunks = chat(sim.port, stream=True, max_tokens=4).chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)
    assert len([c for c in chunks if c["choices"][0]["delta"].get("content")]) == 4


def test_models_health_and_stats(simulator):
    sim = simulator(base=SimulatorConfig.instant(default_model="sim-default", models={"sim-big": ModelProfile()}))
    models = call(sim.port, "GET", "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["sim-default", "sim-big"]
    assert all(m["object"] == "model" for m in models["data"])
    assert call(sim.port, "GET", "/health").json() == {"status": "ok"}

    chat(sim.port, max_tokens=5, content="z" * 23)  # 32 chars -> 8 prompt tokens
    chat(sim.port, stream=True, max_tokens=6, content="z" * 23)
    stats = call(sim.port, "GET", "/stats").json()
    assert stats["requests"] == 2 and stats["completed"] == 2 and stats["streamed"] == 1
    assert stats["in_flight"] == 0 and stats["queued"] == 0 and stats["active"] == 0 and stats["errors"] == 0
    assert stats["tokens"] == {"prompt": 16, "completion": 11, "total": 27}
    assert sim.stats()["tokens"]["completion"] == 11


# --------------------------------------------------------------------------------------------------
# Timing


def test_first_token_arrives_after_the_configured_ttft(simulator):
    sim = simulator(prefill_ms=100)
    reply = chat(sim.port, stream=True, max_tokens=3)
    first = reply.content_times()[0]
    assert 95 <= first <= ceiling(100), first
    assert 99 <= float(reply.headers["x-sim-ttft-ms"]) < ceiling(100)

    # TTFT = fixed queueing delay + prefill (fixed + per prompt token); 391 + 9 chars = 100 tokens.
    sim = simulator(queue_delay_ms=20, prefill_ms=30, prefill_ms_per_token=0.5)
    reply = chat(sim.port, stream=True, max_tokens=2, content="p" * 391)
    first = reply.content_times()[0]
    assert 95 <= first <= ceiling(100), first
    assert 99 <= float(reply.headers["x-sim-ttft-ms"]) < ceiling(100)
    # A non-streamed reply comes after its TTFT plus the decode time.
    reply = chat(sim.port, max_tokens=1, content="p" * 391)
    assert 95 <= reply.elapsed_ms <= ceiling(100), reply.elapsed_ms


def test_tokens_are_paced_by_the_decode_time(simulator):
    # Token k is due prefill + k x decode after the request arrives (and the client sent it before):
    # it may come late on a busy machine, never early. (A late token makes the next gap shorter: the
    # schedule is absolute, so gaps are not checked one by one.)
    sim = simulator(prefill_ms=30, decode_ms_per_token=20)
    times = chat(sim.port, stream=True, max_tokens=8).content_times()
    assert len(times) == 8
    assert all(t >= 30 + 20 * k - 1 for k, t in enumerate(times)), times
    assert times[-1] <= ceiling(30 + 7 * 20), times

    reply = chat(sim.port, max_tokens=8)  # not streamed: the whole answer after TTFT + 7 intervals
    assert 165 <= reply.elapsed_ms <= ceiling(170), reply.elapsed_ms


def test_jitter_varies_latencies_around_the_configured_mean(simulator):
    sim = simulator(seed=3, prefill_ms=40, jitter=0.3)
    ttfts = [float(chat(sim.port, max_tokens=1).headers["x-sim-ttft-ms"]) for _ in range(30)]
    assert len(set(ttfts)) > 20
    assert 30 <= statistics.mean(ttfts) <= ceiling(40), ttfts


# --------------------------------------------------------------------------------------------------
# Errors


def test_error_rate_and_mix_follow_the_configuration(simulator):
    settings = dict(seed=7, error_rate=0.25, error_mix={500: 1, 429: 1, 503: 1})
    sim = simulator(**settings)
    replies = [chat(sim.port, max_tokens=2) for _ in range(200)]
    failed = [r for r in replies if r.status != 200]
    assert 30 <= len(failed) <= 70, len(failed)
    assert {r.status for r in failed} == {500, 429, 503}
    for reply in failed:
        error = reply.json()["error"]
        assert error["message"] and error["type"] in ("server_error", "requests")
        assert reply.headers["x-sim-injected-error"] == "1"
    assert all(r.headers.get("retry-after") for r in failed if r.status in (429, 503))
    stats = sim.stats()
    assert stats["errors"] == len(failed) and stats["completed"] == 200 - len(failed)
    assert sum(stats["errors_by_status"].values()) == len(failed)

    # Seeded: the same sequence again on a fresh simulator.
    again = simulator(**settings)
    assert [chat(again.port, max_tokens=2).status for _ in range(200)] == [r.status for r in replies]


def test_malformed_requests_get_openai_style_400s(simulator):
    sim = simulator()
    cases = [
        (b"this is not json", None),
        (b"[1, 2]", None),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "model"),
        (json.dumps({"model": "m"}).encode(), "messages"),
        (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        (json.dumps({"model": "m", "messages": ["hi"]}).encode(), "messages[0]"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).encode(),
         "max_tokens"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}).encode(),
         "stream"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                     "stream_options": {"include_usage": True}}).encode(), "stream_options"),
    ]
    for raw, param in cases:
        reply = call(sim.port, "POST", CHAT, raw=raw)
        assert reply.status == 400, raw
        assert reply.headers["content-type"] == "application/json"
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param, (raw, error)
    assert sim.stats()["rejected"] == len(cases) and sim.stats()["completed"] == 0

    assert call(sim.port, "GET", CHAT).status == 405
    missing = call(sim.port, "GET", "/v1/nothing")
    assert missing.status == 404 and missing.json()["error"]["message"]


# --------------------------------------------------------------------------------------------------
# Capacity and load


class HeldStream:
    """A streamed request that holds its simulator slot until ``release()`` closes the connection
    (the simulator frees the slot of a client that leaves). With a decode time per token it holds for
    minutes, far longer than any test waits for."""

    def __init__(self, port: int, max_tokens: int = 20_000):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        payload = {"model": "m", "messages": [{"role": "user", "content": "hold"}], "max_tokens": max_tokens,
                   "stream": True}
        self.conn.request("POST", CHAT, body=json.dumps(payload).encode(), headers={"content-type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        assert self.response.readline().startswith(b"data: ")  # it holds a slot and is decoding

    def release(self):
        self.conn.close()


def test_requests_beyond_capacity_wait_for_a_slot(simulator):
    """Condition-driven, no wall-clock speed: two long streams hold both slots until the test has
    seen the other four queued, so the order (not the machine's speed) decides who waits."""
    # Each queued request holds its slot for at least 50 ms prefill + 4 x 10 ms decode = 90 ms.
    hold_ms = 50 + 4 * 10
    sim = simulator(capacity=2, prefill_ms=50, decode_ms_per_token=10)
    blockers = [HeldStream(sim.port), HeldStream(sim.port)]
    assert sim.stats()["active"] == 2 and sim.stats()["queued"] == 0
    replies: list = []
    waiting = threading.Thread(target=lambda: replies.extend(
        concurrently(4, lambda i: chat(sim.port, stream=True, max_tokens=5))))
    waiting.start()
    try:
        seen = wait_until(lambda: (lambda st: st if st["queued"] == 4 else None)(sim.stats()), timeout=90,
                          interval=0.01, message="four requests queued behind the two busy slots")
        assert seen["active"] == 2 and seen["in_flight"] == 6 and seen["completed"] == 0
    finally:
        for blocker in blockers:
            blocker.release()
    waiting.join(120)
    assert len(replies) == 4 and all(r.status == 200 for r in replies)

    queued = sorted(float(r.headers["x-sim-queue-ms"]) for r in replies)
    # All four waited for a slot; two slots for four requests: the last two also waited for one of
    # the first two to finish (queued before the release, served at least one hold after it).
    assert all(q > 0 for q in queued), queued
    assert all(q >= hold_ms - 1 for q in queued[2:]), queued
    for reply in replies:  # the intended TTFT includes the wait: queue + prefill at least
        assert float(reply.headers["x-sim-ttft-ms"]) >= float(reply.headers["x-sim-queue-ms"]) + 50 - 1
        assert reply.content_times()[0] >= float(reply.headers["x-sim-ttft-ms"]) - 1  # nothing arrives early
    done = wait_until(lambda: (lambda st: st if st["in_flight"] == 0 else None)(sim.stats()), timeout=60,
                      message="the simulator to be idle")
    assert done["completed"] == 4 and done["disconnects"] == 2 and done["active"] == 0 and done["queued"] == 0


def test_max_queue_turns_away_excess_requests_with_503(simulator):
    sim = simulator(capacity=1, max_queue=1, prefill_ms=150, decode_ms_per_token=5)  # a held stream: 100 s
    blocker = HeldStream(sim.port)  # the one slot is busy
    queued: list = []
    waiter = threading.Thread(target=lambda: queued.append(chat(sim.port, max_tokens=1)))
    waiter.start()
    try:
        wait_until(lambda: sim.stats()["queued"] == 1, timeout=90, interval=0.01, message="one request queued")
        overloaded = concurrently(2, lambda i: chat(sim.port, max_tokens=1))  # the queue is full
    finally:
        blocker.release()
    waiter.join(120)
    assert [r.status for r in queued] == [200]
    assert [r.status for r in overloaded] == [503, 503]
    assert all(r.headers["x-sim-injected-error"] == "0" and r.json()["error"]["type"] == "server_error"
               for r in overloaded)


def test_decode_slows_down_with_load(simulator):
    # 10 intervals of 10 ms alone; with 4 of 4 slots busy each interval is 10 * (1 + 1.0 * 3/4) = 17.5 ms.
    sim = simulator(capacity=4, load_slowdown=1.0, decode_ms_per_token=10)
    alone = chat(sim.port, max_tokens=11, stream=True).content_times()
    assert all(t >= 10 * k - 1 for k, t in enumerate(alone)) and alone[-1] <= ceiling(100), alone
    blockers = [HeldStream(sim.port) for _ in range(3)]  # the other three slots stay busy throughout
    try:
        assert sim.stats()["active"] == 3
        loaded = chat(sim.port, max_tokens=11, stream=True).content_times()
    finally:
        for blocker in blockers:
            blocker.release()
    assert all(t >= 17.5 * k - 1 for k, t in enumerate(loaded)), loaded  # never earlier than a full pool allows
    assert loaded[-1] <= ceiling(175), loaded


def test_a_client_that_disconnects_frees_its_slot(simulator):
    sim = simulator(capacity=1, decode_ms_per_token=50)
    # 40 tokens x 50 ms = 2 s of decode; the client leaves after the first chunk.
    gone = call(sim.port, "POST", CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 40, "stream": True}, stream=True, close_after_first=True)
    assert gone.status == 200
    left = wait_until(lambda: (lambda st: st if st["disconnects"] == 1 else None)(sim.stats()), timeout=60,
                      message="the simulator to notice the client left")
    # noticed on its next token, long before the 2 s of decode it had left: the slot is free
    assert left["in_flight"] == 0 and left["active"] == 0 and left["completed"] == 0
    reply = chat(sim.port, stream=True, max_tokens=1)
    assert reply.status == 200 and sim.stats()["completed"] == 1


# --------------------------------------------------------------------------------------------------
# Configuration


def test_per_model_profiles_override_the_defaults(simulator):
    config = SimulatorConfig.instant(models={"slow-model": ModelProfile(prefill_ms=80), "plain": ModelProfile()},
                                     strict_models=True)
    sim = simulator(base=config)
    slow = chat(sim.port, model="slow-model", max_tokens=1)
    assert 79 <= float(slow.headers["x-sim-ttft-ms"]) < ceiling(80) and slow.elapsed_ms >= 78
    fast = chat(sim.port, model="plain", max_tokens=1)
    assert float(fast.headers["x-sim-ttft-ms"]) < 79 and fast.status == 200  # no prefill: under the slow one's
    unknown = chat(sim.port, model="gpt-nonexistent", max_tokens=1)
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_same_seed_same_answers():
    def answers(seed):
        with serve(SimulatorConfig.instant(seed=seed)) as sim:
            return [chat(sim.port).json()["choices"][0]["message"]["content"] for _ in range(5)]

    first = answers(11)
    assert first == answers(11)
    assert first != answers(12)
    assert len({len(a.split()) for a in first}) > 1  # output lengths drawn from the distribution


def test_config_validation_and_from_dict():
    with pytest.raises(ValueError):
        SimulatorConfig(error_rate=1.5)
    with pytest.raises(ValueError):
        SimulatorConfig(models={"m": ModelProfile(decode_ms_per_token=-1)})
    with pytest.raises(ValueError):
        SimulatorConfig.from_dict({"prefil_ms": 3})
    config = SimulatorConfig.from_dict({"prefill_ms": 7, "error_mix": {"429": 1}, "error_rate": 0.1,
                                        "models": {"big": {"decode_ms_per_token": 40}}})
    assert config.error_mix == {429: 1.0}
    big = config.profile("big")
    assert big.decode_ms_per_token == 40 and big.prefill_ms == 7 and big.error_rate == 0.1
    assert config.profile("anything-else").decode_ms_per_token == SimulatorConfig().decode_ms_per_token


def test_command_line(tmp_path):
    settings = tmp_path / "sim.json"
    settings.write_text(json.dumps({"models": {"cli-model": {"prefill_ms": 60}}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "demo.simulator", "--port", "0", "--instant", "--config",
                             str(settings), "--log-level", "warning", "--seed", "5"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, line
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        deadline = time.monotonic() + 90
        while True:
            try:
                assert call(port, "GET", "/health").status == 200
                break
            except ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        reply = chat(port, model="cli-model", max_tokens=2)
        assert reply.status == 200 and 59 <= float(reply.headers["x-sim-ttft-ms"]) < ceiling(60)
        assert [m["id"] for m in call(port, "GET", "/v1/models").json()["data"]] == ["sim-gpt", "cli-model"]
    finally:
        proc.terminate()
        proc.wait(10)
