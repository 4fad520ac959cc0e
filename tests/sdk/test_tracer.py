"""Tracer semantics without a server (InMemoryExporter): nesting, context across tasks and
threads, sampling, traceparent, decorators, streams, limits (checked with the server's own
validator), and ``instrument_openai`` on duck-typed fake clients."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import tracedash_sdk as td
from ingest.schemas import Limits, parse_span
from tests.sdk.fakes import FakeAsyncClient, FakeClient


@pytest.fixture
def memory():
    exporter = td.InMemoryExporter()
    return td.Tracer(exporter=exporter, service="svc"), exporter


def by_name(exporter):
    return {s.name: s for s in exporter.spans}


def test_nesting_phases_and_errors(memory):
    tracer, exporter = memory
    with pytest.raises(KeyError):
        with tracer.trace("POST /chat") as t:
            assert td.current_span() is t and tracer.current_span() is t
            for phase in ("network", "preprocess", "inference", "postprocess"):
                with t.phase(phase) as p:
                    assert td.current_span() is p
            with tracer.span("retrieve", phase="preprocess", model="emb", attributes={"k": 1}) as s:
                s.set_attribute("a", "b").set_attributes({"c": True, "d": 1.5})
                s.add_event("hit", attributes={"n": 2})
            raise KeyError("missing")
    assert td.current_span() is None
    spans = by_name(exporter)
    root = spans["POST /chat"]
    assert root.parent_span_id is None and root.status == "error" and root.status_message == "KeyError: 'missing'"
    assert root.events[0][0] == "exception" and "KeyError" in root.events[0][2]["exception.stacktrace"]
    for phase in ("network", "preprocess", "inference", "postprocess"):
        assert spans[phase].phase_name == phase and spans[phase].parent_span_id == root.span_id
    retrieve = spans["retrieve"]
    assert retrieve.attributes == {"k": 1, "a": "b", "c": True, "d": 1.5} and retrieve.model == "emb"
    assert {s.trace_id for s in exporter.spans} == {root.trace_id}
    assert all(s.service == "svc" and s.end_time >= s.start_time for s in exporter.spans)
    with pytest.raises(ValueError):
        tracer.span("x", phase="thinking")


def test_durations_are_monotonic_exact(memory):
    tracer, exporter = memory
    with tracer.span("sleep"):
        time.sleep(0.05)
    (span,) = exporter.spans
    assert 50e6 <= span.duration_ns < 400e6


def test_children_always_lie_within_their_parents(memory):
    tracer, exporter = memory
    for _ in range(500):
        with tracer.span("parent") as parent:
            with tracer.span("child") as child:
                pass
        assert parent.start_time <= child.start_time and child.end_time <= parent.end_time
    assert abs(exporter.spans[-1].start_time - time.time_ns()) < 50_000_000  # unix time


def test_wall_clock_steps_move_the_timeline_jitter_does_not(memory, monkeypatch):
    from tracedash_sdk import _span

    tracer, _ = memory
    before = _span._clock_offset
    monkeypatch.setattr(_span, "_next_clock_check", 0)
    monkeypatch.setattr(_span, "_time_ns", lambda: time.time_ns() + 100_000)  # 0.1 ms: jitter, ignored
    tracer.span("a").end()
    assert abs(_span._clock_offset - before) < 1_000_000
    monkeypatch.setattr(_span, "_next_clock_check", 0)
    monkeypatch.setattr(_span, "_time_ns", lambda: time.time_ns() + 5 * 10**9)  # NTP stepped the clock 5 s
    span = tracer.span("b")
    span.end()
    assert abs(span.start_time - time.time_ns() - 5 * 10**9) < 50_000_000
    monkeypatch.setattr(_span, "_clock_offset", before)


def test_setters_after_end_are_ignored_and_end_is_idempotent(memory):
    tracer, exporter = memory
    span = tracer.span("x")
    span.end()
    span.set_attribute("late", 1).set_tokens(input=3).add_event("late")
    span.end()
    assert len(exporter.spans) == 1 and span.attributes is None and span.input_tokens is None and span.events is None


def test_context_follows_asyncio_tasks_and_threads(memory):
    tracer, exporter = memory

    async def child(i):
        await asyncio.sleep(0.01)
        with tracer.span(f"task-{i}", phase="network"):
            await asyncio.sleep(0.01)

    async def both():
        await asyncio.gather(child(0), child(1))  # each task starts with a copy of the context

    def in_thread(name):
        with tracer.span(name):
            pass

    with tracer.trace("root") as root:
        asyncio.run(both())
        thread = threading.Thread(target=td.wrap(in_thread), args=("wrapped",))
        thread.start()
        thread.join()
        ctx = tracer.context()

        def with_captured():
            with ctx:
                in_thread("captured")
            ctx.run(in_thread, "run")

        thread = threading.Thread(target=with_captured)
        thread.start()
        thread.join()
        with ThreadPoolExecutor(2) as pool:  # one wrapped function, run in two threads at once
            fn = td.wrap(in_thread)
            list(pool.map(fn, ["pool-a", "pool-b"]))
        plain = threading.Thread(target=in_thread, args=("plain",))  # no helper: a new trace
        plain.start()
        plain.join()
    spans = by_name(exporter)
    for name in ("task-0", "task-1", "wrapped", "captured", "run", "pool-a", "pool-b"):
        assert spans[name].parent_span_id == root.span_id and spans[name].trace_id == root.trace_id, name
    assert spans["plain"].parent_span_id is None and spans["plain"].trace_id != root.trace_id


def test_traced_decorator_sync_async_and_generators(memory):
    tracer, exporter = memory

    @tracer.traced
    def plain(x):
        return x + 1

    @tracer.traced("named", phase="postprocess")
    async def coro(x):
        await asyncio.sleep(0)
        return x * 2

    @tracer.traced(phase="inference")
    def tokens():
        with tracer.span("inside-gen"):
            pass
        yield "a"
        yield "b"

    @tracer.traced(phase="inference")
    async def atokens():
        yield "x"
        await asyncio.sleep(0)
        yield "y"

    @tracer.traced()
    def fails():
        raise RuntimeError("nope")

    async def consume():
        return [t async for t in atokens()]

    with tracer.trace("root") as root:
        assert plain(1) == 2
        assert asyncio.run(coro(2)) == 4
        gen = tokens()
        assert next(gen) == "a"
        assert td.current_span() is root  # the generator's span does not leak between items
        assert list(gen) == ["b"]
        assert asyncio.run(consume()) == ["x", "y"]
        with pytest.raises(RuntimeError):
            fails()
    spans = by_name(exporter)
    q = "test_traced_decorator_sync_async_and_generators.<locals>."
    assert spans[q + "plain"].parent_span_id == root.span_id
    assert spans["named"].phase_name == "postprocess"
    assert spans[q + "tokens"].phase_name == "inference"
    assert spans["inside-gen"].parent_span_id == spans[q + "tokens"].span_id
    assert spans[q + "atokens"].ended
    assert spans[q + "fails"].status == "error" and spans[q + "fails"].status_message == "RuntimeError: nope"


def test_sampling_is_decided_at_the_root_and_inherited():
    exporter = td.InMemoryExporter()
    none = td.Tracer(exporter=exporter, sample_rate=0.0)
    with none.trace("root") as root:
        assert not root.sampled and not root.is_recording
        with none.span("child") as child:
            child.set_attribute("k", "v")
            assert child.trace_id == root.trace_id and not child.sampled
            headers = none.inject({})
    assert exporter.spans == [] and headers["traceparent"].endswith("-00")
    # the decision travels: an unsampled parent keeps a fully sampled tracer from recording
    every = td.Tracer(exporter=exporter, sample_rate=1.0)
    with every.span("downstream", parent=every.extract(headers)) as span:
        assert not span.sampled
    assert exporter.spans == []
    # ...and a sampled one makes an unsampled tracer record
    with none.span("downstream", parent=none.extract({"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})):
        pass
    assert [s.name for s in exporter.spans] == ["downstream"]

    half = td.Tracer(exporter=exporter, sample_rate=0.5)
    exporter.clear()
    for _ in range(2000):
        with half.trace("t"):
            with half.span("c"):
                pass
    roots = sum(1 for s in exporter.spans if s.parent_span_id is None)
    assert 800 < roots < 1200 and len(exporter.spans) == 2 * roots  # children follow their root
    with pytest.raises(ValueError):
        td.Tracer(exporter=exporter, sample_rate=1.5)


def test_traceparent_inject_extract(memory):
    tracer, _ = memory
    assert tracer.inject({}) == {}
    with tracer.span("a") as span:
        headers = tracer.inject({"x": "1"})
    assert headers == {"x": "1", "traceparent": f"00-{span.trace_id}-{span.span_id}-01"}
    ctx = tracer.extract(headers)
    assert (ctx.trace_id, ctx.span_id, ctx.sampled, ctx.remote) == (span.trace_id, span.span_id, True, True)
    value = headers["traceparent"]
    assert tracer.extract({"Traceparent": value}) == ctx
    assert tracer.extract({"HTTP_TRACEPARENT": value}) == ctx  # WSGI environ
    assert tracer.extract([(b"traceparent", value.encode())]) == ctx  # ASGI scope headers
    assert tracer.extract({"TraceParent": value}) == ctx
    assert tracer.extract({"traceparent": f" {value} "}) == ctx  # header whitespace
    assert tracer.extract("01-" + value[3:] + "-future") is None  # not a mapping of headers
    assert tracer.extract({"traceparent": "01-" + value[3:] + "-future"}).span_id == span.span_id
    for bad in (None, {}, {"traceparent": ""}, {"traceparent": "garbage"},
                {"traceparent": value.upper()}, {"traceparent": value + "-extra"},
                {"traceparent": "ff" + value[2:]}, {"traceparent": "00-" + "0" * 32 + "-" + span.span_id + "-01"},
                {"traceparent": f"00-{span.trace_id}-{'0' * 16}-01"}, {"traceparent": value[:-1] + "\n1"}):
        assert tracer.extract(bad) is None, bad


def test_stream_records_ttft_and_tokens(memory):
    tracer, exporter = memory

    def chunks():
        time.sleep(0.05)
        yield "Hello"
        yield " big"
        yield " world"

    with tracer.span("llm", phase="inference") as span:
        out = "".join(td.stream(chunks(), count_tokens=lambda c: len(c.split())))
    assert out == "Hello big world"
    assert 50 <= span.ttft_ms < 200 and span.output_tokens == 3
    assert [e[0] for e in span.events] == ["first_token"]
    assert span.events[0][1] - span.start_time == pytest.approx(span.ttft_ms * 1e6, abs=1)

    async def achunks():
        await asyncio.sleep(0.03)
        for c in ("a", "b"):
            yield c

    async def run():
        with tracer.span("allm", phase="inference") as aspan:
            return [c async for c in td.astream(achunks())], aspan

    result, aspan = asyncio.run(run())
    assert result == ["a", "b"] and 30 <= aspan.ttft_ms < 180 and aspan.output_tokens == 2
    assert list(td.stream(iter([1, 2]))) == [1, 2]  # no span: a plain pass-through


def test_encoded_spans_respect_the_server_limits(memory):
    tracer, exporter = memory
    with tracer.span("x" * 600, model="m" * 300, attributes={f"k{i}": i for i in range(200)}) as span:
        span.service = "s" * 300
        span.set_attribute("k0", "é" * 70_000)  # 140 KB of UTF-8
        span.set_attributes({"nan": math.nan, "inf": math.inf, "obj": object(), "none": None, "big": 10**30})
        for i in range(200):
            span.add_event("e" * 300, {"k" * 300: "v"})
        span.set_tokens(input=-1, output=2**40).set_cost(math.nan).set_ttft(-1.0)
        span.set_status("error", "m" * 100_000)
    from tracedash_sdk._encode import encode_span

    record = td.span_to_dict(span)
    assert json.loads(encode_span(span)) == record  # the exporter's fast encoder writes exactly this
    row = parse_span(encode_span(span), project_id=1, limits=Limits())  # the server's validator
    assert len(row["attributes"]) == 128 and len(row["attributes"]["k0"].encode()) <= 64 * 1024
    assert len(row["name"]) == 512 and len(row["model"]) == 256 and len(row["service"]) == 256
    assert len(row["event_names"]) == 128 and row["status"] == "error"
    # A negative count is dropped by the SDK: absent, stored as unknown (NULL), not as 0.
    assert row["input_tokens"] is None and row["ttft_ns"] is None and row["cost_usd"] is None
    unset = td.span_to_dict(tracer.span("plain"))
    assert parse_span(json.dumps(unset).encode(), project_id=1, limits=Limits())["name"] == "plain"
    odd = tracer.span("odd", attributes={"nan": math.nan, "obj": object(), "none": None, "big": 10**30, "bad": "\ud800"})
    odd.end()
    record = td.span_to_dict(odd)
    assert record["attributes"]["nan"] == "nan" and record["attributes"]["none"] == "None"
    row = parse_span(encode_span(odd), project_id=1, limits=Limits())
    assert row["attributes"]["bad"] == "?" and row["attributes"]["big"] == str(10**30)


def test_default_tracer_and_configure(monkeypatch):
    from tracedash_sdk import _tracer

    monkeypatch.setattr(_tracer, "_default", None)
    monkeypatch.delenv("TRACEDASH_ENDPOINT", raising=False)
    monkeypatch.setenv("TRACEDASH_SERVICE", "from-env")
    first = td.get_tracer()
    assert td.get_tracer() is first and first.service == "from-env"
    exporter = td.InMemoryExporter()
    second = td.configure(exporter=exporter, service="configured")
    assert td.get_tracer() is second and second is not first
    with td.get_tracer().span("x"):
        pass
    assert exporter.spans[0].service == "configured"


# -- instrument_openai --------------------------------------------------------------------------
def test_openai_non_stream(memory):
    tracer, exporter = memory
    client = td.instrument_openai(FakeClient(), tracer=tracer)
    assert td.instrument_openai(client, tracer=tracer) is client  # twice: still one wrapper
    with tracer.trace("root") as root:
        response = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert response.choices[0].message.content == "Hello there"
    call = by_name(exporter)["chat gpt-4o-mini"]
    assert call.parent_span_id == root.span_id and call.phase_name == "inference"
    assert (call.model, call.input_tokens, call.output_tokens) == ("gpt-4o-mini-2024-07-18", 12, 5)
    assert call.attributes["finish_reason"] == "stop" and call.ttft_ms is None
    assert "stream_options" not in client.chat.completions.calls[0]


def test_openai_stream_asks_for_usage_and_hides_it(memory):
    tracer, exporter = memory
    client = td.instrument_openai(FakeClient(first_token_delay=0.05), tracer=tracer)
    with tracer.trace("root"):
        stream = client.chat.completions.create(model="m", messages=[], stream=True)
        chunks = list(stream)
    assert client.chat.completions.calls[0]["stream_options"] == {"include_usage": True}
    assert all(c.choices for c in chunks)  # the usage-only chunk we asked for is not shown
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello there"
    call = by_name(exporter)["chat m"]
    assert (call.input_tokens, call.output_tokens, call.attributes["finish_reason"]) == (12, 5, "stop")
    assert 50 <= call.ttft_ms < 200 and call.events[0][0] == "first_token"
    assert stream.response_headers == {"x-request-id": "req-1"}  # the original stream's attributes


def test_openai_stream_without_usage_counts_content_chunks(memory):
    tracer, exporter = memory
    client = td.instrument_openai(FakeClient(), tracer=tracer)
    with client.chat.completions.create(model="m", messages=[], stream=True,
                                        stream_options={"include_usage": False}) as stream:
        chunks = list(stream)
    assert len(chunks) == 4  # role chunk + 2 content chunks + finish chunk
    call = by_name(exporter)["chat m"]
    assert call.output_tokens == 2 and call.input_tokens is None and call.ended


def test_openai_errors_are_recorded(memory):
    tracer, exporter = memory
    client = td.instrument_openai(FakeClient(fail=True), tracer=tracer)
    with pytest.raises(ConnectionError):
        client.chat.completions.create(model="m", messages=[])
    (call,) = exporter.spans
    assert call.status == "error" and call.status_message == "ConnectionError: upstream down"


def test_openai_async_client(memory):
    tracer, exporter = memory
    client = td.instrument_openai(FakeAsyncClient(first_token_delay=0.03), tracer=tracer)

    async def run():
        with tracer.trace("root") as root:
            response = await client.chat.completions.create(model="a", messages=[])
            stream = await client.chat.completions.create(model="b", messages=[], stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
        return root, response, text

    root, response, text = asyncio.run(run())
    assert text == "Hello there" and response.usage.completion_tokens == 5
    spans = by_name(exporter)
    assert spans["chat a"].output_tokens == 5 and spans["chat a"].parent_span_id == root.span_id
    # from the call's start to the first chunk: at least the client's 30 ms, within the call (no upper
    # bound in ms: a busy machine may run late, which is not what this checks)
    assert spans["chat b"].output_tokens == 5 and 30 <= spans["chat b"].ttft_ms <= spans["chat b"].duration_ns / 1e6
    assert spans["chat b"].parent_span_id == root.span_id


def test_cache_lookup_spans_say_hit_or_miss_only_when_told(memory, monkeypatch):
    tracer, exporter = memory
    with tracer.trace("POST /chat") as root:
        with tracer.cache("semantic") as hit:
            assert td.current_span() is hit.span and hit.hit is None
            answer = "42"
            hit.hit = answer is not None
        with root.cache("exact", attributes={"cache.backend": "redis"}) as miss:
            miss.hit = False
        with tracer.cache() as unstated:
            pass  # never told: says nothing about a hit
        with pytest.raises(TimeoutError):
            with tracer.cache("vectors") as failed:
                raise TimeoutError("vector store down")
        with tracer.cache("changed") as changed:
            changed.hit = True
            changed.hit = None  # taken back
        late = tracer.cache("late")
        late.end()
        late.hit = True  # after the end: ignored, as every setter
    records = {r["name"]: r for r in exporter.records()}
    assert (records["cache semantic"]["phase"], records["cache semantic"]["parent_span_id"]) == ("preprocess", root.span_id)
    assert records["cache semantic"]["attributes"] == {"tracedash.cache.name": "semantic", "tracedash.cache.hit": True}
    assert records["cache exact"]["attributes"] == {"cache.backend": "redis", "tracedash.cache.name": "exact",
                                                    "tracedash.cache.hit": False}
    assert "tracedash.cache.hit" not in (records["cache"]["attributes"] or {})
    assert records["cache"]["parent_span_id"] == root.span_id
    failed_record = records["cache vectors"]
    assert failed_record["status"] == "error" and "tracedash.cache.hit" not in failed_record["attributes"]
    assert "tracedash.cache.hit" not in records["cache changed"]["attributes"]
    assert "tracedash.cache.hit" not in (records["cache late"]["attributes"] or {})
    # what the server makes of them: hit, miss, nothing
    from ingest.schemas import cache_state

    states = [cache_state(parse_span(json.dumps(r).encode(), project_id=1, limits=Limits())["attributes"])
              for r in (records["cache semantic"], records["cache exact"], records["cache"])]
    assert states == [2, 1, 0]

    # module level, on the default tracer; unsampled traces record nothing
    monkeypatch.setattr(td._tracer, "_default", tracer)
    with td.cache("module") as module:
        module.hit = True
    assert by_name(exporter)["cache module"].attributes["tracedash.cache.hit"] is True
    quiet = td.Tracer(exporter=exporter, sample_rate=0.0)
    with quiet.trace("unsampled") as t, t.cache("semantic") as c:
        c.hit = True
        assert c.hit is None and not c.span.is_recording
    assert "unsampled" not in by_name(exporter)
