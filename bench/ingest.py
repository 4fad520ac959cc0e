"""Ingestion throughput of a real `manage.py serve`, compared with a raw insert of the same rows.

    .venv/bin/python bench/ingest.py [--duration 20] [--concurrency 8] [--data-dir DIR] [--quick] [--json PATH]
    .venv/bin/python bench/ingest.py --compare-beat --scenarios json-100,json-1000 --duration 60   # the issue's ratios

What is measured, and why:

1. **End to end over HTTP.** The server runs as a subprocess on the embedded defaults (chdb,
   SQLite, in-process beat; rate limit off) on a fresh data dir. For each scenario — native JSON
   (``/api/v1/traces``) and OTLP protobuf (``/v1/traces``), in batches of 100 and 1,000 spans —
   ``--concurrency`` keep-alive client connections post pre-encoded bodies for ``--duration``
   seconds. A 200 means the spans are in ClickHouse (group commit, ``ingest.writer``), so the
   spans acknowledged per second are the spans *stored* per second. Latency is per request,
   send to last byte of the answer. Server CPU (from /proc) and client CPU are reported too:
   client and server share the machine's cores, so the client is kept cheap (bodies encoded up
   front; only a sample of answers is decoded).
2. **The ceiling: a raw insert.** The same spans, turned into rows by ``ingest.schemas.parse_spans``
   exactly as the server does, are inserted with ``Store.insert`` (Arrow into chdb) straight from
   this process, in batches of 1,000 and 10,000 rows, on a separate data path, while no server
   runs: once before the first server and once after the last (this shared 2-core machine's speed
   swings by a fifth within minutes; one measurement after the servers once read 41k rows/s and
   the next run's 60k). ``ratio`` = HTTP spans/s ÷ the mean of the two raw rates at 1,000-row
   batches: the share of the store's own speed that the HTTP path (parsing, validation, ASGI,
   group commit) keeps. Both rates are printed, with their spread.
   Single-threaded parse-only rates (native JSON and OTLP) show what validation alone costs.
   The insert's wall time leaves out the merges ClickHouse runs afterwards in its own threads, so
   the CPU of the whole raw phase is also taken until those merges have finished: the store's full
   cost per 1,000 rows, and the rows/s this machine could store with every core doing only that
   (the hard ceiling for the HTTP path, which must also receive and validate).
3. **Nothing is lost.** Every span id is unique across the run, so after the server has drained
   its queue and spool and stopped, ``count()`` and ``uniqExact(trace_id, span_id)`` of
   ``spans FINAL`` (read by a separate process: chdb opens one data path per process) must both
   equal the spans acknowledged.

4. **With the beat and without, by turns** (``--compare-beat``). Both servers run side by side,
   one with its in-process beat (summaries, rollups, alert rounds: as ``make run`` serves) and one
   without (the ingestion path alone), and take each scenario's load by turns of
   ``--turn-seconds`` (10 by default), in the order A B, B A, A B, …, the other server frozen
   meanwhile (SIGSTOP: no CPU at all, its beat and merges included; each server does its own work
   only in its own turns). Run one after the other, the two servers saw different machines: this
   shared 2-core machine's speed swings by a fifth to a third within minutes, and the ratio of
   the same code read 0.76 to 1.04 from run to run. By turns, a swing falls on both alike; the
   ratio of each pair of turns is printed too (its spread is the measurement's). The raw insert
   is sampled between the pairs of turns as well (2 s of 1,000-row batches, both servers frozen),
   and the ratios to raw divide by the mean of the samples beside json-1000's turns, not by the
   measurements before and after the servers (printed all the same). The first
   second of a turn carries what was due meanwhile (the beat's entries run on the wall clock, so
   a turn's runs come at its start instead of spread through it): the same work, bunched.
   Each server's CPU over the turns is split by thread too (``/proc/<pid>/task`` every 0.5 s,
   Linux: the request thread, the writers, the inserter, the beat's threads, ClickHouse's merges
   and the rest of its threads), per 1,000 spans acknowledged: where the beat's cost lands.

The traces are realistic LLM requests: 5–20 spans (root, network, preprocess, inference,
postprocess, some nested), ~3 % failing, inference spans carrying a 1–4 KB prompt and a few
hundred bytes of completion as attributes, several services and models.
Bodies are built once; before each request its trace and span ids get a fresh 4-byte prefix (an
8-byte marker replaced in the pre-encoded body), which keeps ids unique at no parsing cost, and a
native JSON body's times are moved to the request's own (its traces started 20-30 s before it is
sent, as a root span arrives from an exporter once its trace has ended: ``TIME_SLOT_NS``; before
2026-12-08 they started 2-60 minutes before the run, which ``--past-starts`` brings back).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ is sys.path[0] and this file would shadow the app's `ingest` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,  # noqa: E402
                                                                      ExportTraceServiceResponse)

from bench.common import (PRODUCTION_VARIABLES, THREAD_GROUPS, Server, ThreadCpu, machine, percentile,  # noqa: E402
                          process_cpu_seconds, table)

JSON_MARKER = b"@REQ_ID@"  # 8 characters of the hex ids in JSON bodies, replaced per request
PB_MARKER = b"\xff\xfe\xfd\xfc"  # 4 bytes of the binary ids in protobuf bodies, replaced per request
SAMPLE_EVERY = 16  # decode one answer in this many (and each connection's first)
SPAN_KIND_INTERNAL, SPAN_KIND_SERVER, SPAN_KIND_CLIENT = 1, 2, 3


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- realistic LLM traces ----------------------------------------------------------------------
VOCABULARY = """
the a an of to and in for on with by from about as at into over under after before while when why how what
which who please explain summarize compare draft translate review refactor classify extract answer list
user customer agent assistant system context document policy refund invoice order shipment delivery account
password login subscription plan upgrade downgrade pricing discount coupon warranty return exchange product
feature release note changelog ticket incident outage latency error timeout retry queue cache database index
query vector embedding retrieval chunk passage source citation memory tool function call result json schema
field value table row column report metric dashboard trace span service model token prompt completion
stream response request header payload budget cost usage limit quota region cluster node gpu batch throughput
kubernetes deployment rollout config secret certificate domain email phone address name date time week month
quarter year revenue forecast churn cohort segment campaign survey feedback sentiment rating score priority
severity owner team manager engineer analyst contract clause term renewal invoice tax currency euro dollar
""".split()
SERVICES = ("chat-api", "support-bot", "search-api", "summarizer", "agent-runner", "code-assist")
ROUTES = {"chat-api": "/v1/chat", "support-bot": "/v1/tickets/reply", "search-api": "/v1/answer",
          "summarizer": "/v1/summarize", "agent-runner": "/v1/agents/run", "code-assist": "/v1/complete"}
# (model, gen_ai.system, USD per 1M input tokens, per 1M output tokens)
CHAT_MODELS = (("gpt-4o-mini", "openai", 0.15, 0.60), ("gpt-4o", "openai", 2.50, 10.0),
               ("claude-3-5-sonnet", "anthropic", 3.0, 15.0), ("llama-3.1-70b-instruct", "vllm", 0.60, 0.60),
               ("mistral-large", "mistral", 2.0, 6.0), ("gemini-1.5-pro", "gcp.gemini", 1.25, 5.0))
EMBEDDING_MODELS = (("text-embedding-3-small", "openai", 0.02), ("bge-large-en-v1.5", "vllm", 0.01))
ERRORS = ("upstream 503: model overloaded", "timeout after 30 s waiting for the first token",
          "429 rate limited by provider", "context length exceeded (128000 tokens)")


@dataclass(slots=True)
class Span:
    """One span, independent of the wire format; ids are completed by the batch (``k``) and the
    per-request marker."""

    k: int  # index within its batch, 1-based: the low half of the span id
    trace_suffix: str  # 24 hex characters: the low part of the trace id
    parent_k: int  # 0 for a root span
    name: str
    phase: str
    kind: int
    service: str
    start_ns: int = 0
    end_ns: int = 0
    status: str = "ok"
    status_message: str = ""
    operation: str = ""  # gen_ai.operation.name for model calls
    model: str = ""
    system: str = ""
    ttft_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    attributes: dict = field(default_factory=dict)
    events: list = field(default_factory=list)  # (name, time_ns)
    children: list = field(default_factory=list)
    duration_ms: float = 0.0  # own duration of a leaf


# Native JSON bodies carry the time of the request they are sent in, as an exporter's do: every
# time in a template lies in two consecutive slots of TIME_SLOT_NS (its start times in the first
# slot's first second; a trace lasts up to ~20 s), written as 19 digits whose first 9 are the
# slot's number, and ``patch_json`` replaces those digits with the slots two before the one the
# request is sent in (start times 20-30 s in the past, as a root span exported when its trace ends
# arrives; every time in the past, advancing with the run). Before 2026-12-08 a template's traces
# started 2-60 minutes before it was built, for the whole run: each summariser run marked ~58
# ended minutes, each rollup run recomputed them with all the run's traces in them, and the latency
# alerts' five-minute window held almost none of them (``--past-starts`` sends them so again, to
# compare with earlier figures). OTLP bodies (fixed64 times) keep the times they were built with.
TIME_SLOT_NS = 10**10


def _time_slot(ns: int) -> bytes:
    return b"%09d" % (ns // TIME_SLOT_NS)


class TraceFactory:
    """Builds whole traces of a given span count; deterministic for a seed. Their start times lie
    in the first second of the slot ``now_ns`` is in (``TIME_SLOT_NS``); ``past_starts``: 2-60
    minutes before ``now_ns`` instead."""

    def __init__(self, seed: int, now_ns: int, *, past_starts: bool = False):
        self.rng = random.Random(seed)
        self.now_ns = now_ns // TIME_SLOT_NS * TIME_SLOT_NS
        self.past_starts = past_starts
        words = [self.rng.choice(VOCABULARY) for _ in range(40_000)]
        self.text = " ".join(words)  # ~250 KB to cut prompts and completions from

    def _words(self, low: int, high: int) -> str:
        size = self.rng.randint(low, high)
        start = self.text.index(" ", self.rng.randrange(len(self.text) - high - 64)) + 1
        return self.text[start:start + size].strip()

    def _span(self, trace_suffix, service, name, phase, kind, **attributes) -> Span:
        return Span(k=0, trace_suffix=trace_suffix, parent_k=0, name=name, phase=phase, kind=kind, service=service,
                    attributes={k.replace("__", "."): v for k, v in attributes.items()})

    def _chat(self, trace_suffix, service, model) -> Span:
        name, system, price_in, price_out = model
        prompt = "system: You are a helpful assistant for " + service + ".\nuser: " + self._words(1024, 4096)
        completion = self._words(200, 600)
        span = self._span(trace_suffix, service, f"chat {name}", "inference", SPAN_KIND_CLIENT)
        span.operation, span.model, span.system = "chat", name, system
        span.input_tokens = len(prompt) // 4 + self.rng.randint(0, 40)
        span.output_tokens = len(completion) // 4 + self.rng.randint(0, 20)
        span.cost_usd = round(span.input_tokens * price_in / 1e6 + span.output_tokens * price_out / 1e6, 8)
        span.duration_ms = self.rng.uniform(400, 4000)
        span.ttft_ms = round(self.rng.uniform(80, min(900, span.duration_ms * 0.6)), 3)
        span.attributes.update({"gen_ai.prompt": prompt, "gen_ai.completion": completion,
                                "gen_ai.request.temperature": round(self.rng.choice((0.0, 0.2, 0.7, 1.0)), 1),
                                "gen_ai.request.max_tokens": self.rng.choice((256, 512, 1024, 4096)),
                                "gen_ai.response.finish_reasons": "stop"})
        return span

    def _embed(self, trace_suffix, service) -> Span:
        name, system, price = self.rng.choice(EMBEDDING_MODELS)
        text = self._words(1024, 2048)
        span = self._span(trace_suffix, service, f"embeddings {name}", "inference", SPAN_KIND_CLIENT)
        span.operation, span.model, span.system = "embeddings", name, system
        span.input_tokens = len(text) // 4
        span.output_tokens = 0
        span.cost_usd = round(span.input_tokens * price / 1e6, 8)
        span.duration_ms = self.rng.uniform(20, 150)
        span.attributes["gen_ai.prompt"] = text
        return span

    def _leaf(self, span: Span, low: float, high: float) -> Span:
        span.duration_ms = self.rng.uniform(low, high)
        return span

    def trace(self, n: int) -> list[Span]:
        """The spans of one request, root first; exactly ``n`` (5 ≤ n ≤ 20)."""
        rng = self.rng
        suffix = secrets.token_hex(12)
        service = rng.choice(SERVICES)
        model = rng.choice(CHAT_MODELS)
        s = lambda *a, **kw: self._span(suffix, service, *a, **kw)  # noqa: E731
        root = s(f"POST {ROUTES[service]}", "other", SPAN_KIND_SERVER, http__request__method="POST",
                 http__route=ROUTES[service], http__response__status_code=200, user__tier=rng.choice(("free", "pro", "team")),
                 session__id=secrets.token_hex(6))
        network = self._leaf(s("GET auth.internal/verify", "network", SPAN_KIND_CLIENT, http__request__method="GET",
                               server__address="auth.internal", url__full="https://auth.internal/verify",
                               http__response__status_code=200), 3, 60)
        preprocess = s("retrieve_context", "preprocess", SPAN_KIND_INTERNAL, retrieval__top_k=rng.choice((4, 8, 16)))
        inference = self._chat(suffix, service, model)
        postprocess = s("format_response", "postprocess", SPAN_KIND_INTERNAL, output__format=rng.choice(("markdown", "json")))
        root.children = [network, preprocess, inference, postprocess]
        extras = n - 5
        while extras > 0:
            choice = rng.random()
            if choice < 0.25:
                preprocess.children.append(self._leaf(
                    s("vector_search", "network", SPAN_KIND_CLIENT, db__system="qdrant", server__address="qdrant:6333",
                      db__operation__name="search", rpc__system="grpc"), 4, 80))
            elif choice < 0.40:
                preprocess.children.append(self._embed(suffix, service))
            elif choice < 0.50:
                preprocess.children.append(self._leaf(s("rerank", "preprocess", SPAN_KIND_INTERNAL, rerank__candidates=32), 5, 60))
            elif choice < 0.60:
                preprocess.children.append(self._leaf(s("prompt.render", "preprocess", SPAN_KIND_INTERNAL, template="answer_v3"), 1, 8))
            elif choice < 0.75:
                root.children.insert(-1, self._chat(suffix, service, model))  # another model turn
            elif choice < 0.88 and extras >= 2:
                tool = s("tool.call", "other", SPAN_KIND_INTERNAL, tool__name=rng.choice(("lookup_order", "web_search", "run_sql")))
                tool.children.append(self._leaf(s("POST tools.internal/invoke", "network", SPAN_KIND_CLIENT,
                                                  http__request__method="POST", server__address="tools.internal",
                                                  url__full="https://tools.internal/invoke"), 10, 400))
                root.children.insert(-1, tool)
                extras -= 1
            else:
                postprocess.children.append(self._leaf(s("guardrail.check", "postprocess", SPAN_KIND_INTERNAL,
                                                         guardrail__policy="pii"), 2, 40))
            extras -= 1
        start = (self.now_ns - int(rng.uniform(120, 3600) * 1e9) if self.past_starts
                 else self.now_ns + int(rng.uniform(0, 1) * 1e9))
        self._place(root, start)
        if rng.random() < 0.03:
            message = rng.choice(ERRORS)
            root.status, root.status_message = "error", message
            root.attributes["http.response.status_code"] = 502
            inference.status, inference.status_message = "error", message
        spans: list[Span] = []
        self._flatten(root, 0, spans)
        assert len(spans) == n, (len(spans), n)
        return spans

    def _place(self, span: Span, start: int) -> int:
        """Lay children out one after the other inside their parent; returns the end."""
        rng = self.rng
        span.start_ns = start
        if span.children:
            t = start + int(rng.uniform(0.1, 1.5) * 1e6)
            for child in span.children:
                t = self._place(child, t) + int(rng.uniform(0, 0.5) * 1e6)
            span.end_ns = t + int(rng.uniform(0.1, 1.0) * 1e6)
        else:
            span.end_ns = start + int(span.duration_ms * 1e6)
        if span.ttft_ms is not None:
            span.events.append(("first_token", start + int(span.ttft_ms * 1e6)))
        return span.end_ns

    def _flatten(self, span: Span, parent_k: int, out: list) -> None:
        out.append(span)
        span.k, span.parent_k = len(out), parent_k  # renumbered per batch
        for child in span.children:
            self._flatten(child, span.k, out)
        span.children = []

    def batch(self, size: int) -> list[Span]:
        """Whole traces of 5–20 spans adding up to exactly ``size`` spans; k = 1..size."""
        spans: list[Span] = []
        remaining = size
        while remaining:
            n = self.rng.randint(5, 20)
            if remaining <= 20:
                n = remaining
            elif remaining - n < 5:
                n = remaining - 5
            trace = self.trace(n)
            offset = len(spans)
            for span in trace:
                span.k += offset
                span.parent_k += offset if span.parent_k else 0
            spans.extend(trace)
            remaining -= n
        return spans


def _resource(service: str) -> dict:
    return {"service.name": service, "service.version": "1.8.3", "deployment.environment": "prod",
            "host.name": f"{service}-7f9c6d", "telemetry.sdk.language": "python"}


def _marker_count(spans: list[Span]) -> int:
    return sum(3 if span.parent_k else 2 for span in spans)  # trace id, span id, parent id


def _times_in_slots(body: bytes, spans: list[Span]) -> bool:
    """Whether every time of ``spans`` is in the body under the slot of the first or the one after
    (none later, and the slots' digits nowhere else): then ``patch_json`` moves them all."""
    first = spans[0].start_ns
    return (body.count(_time_slot(first)) + body.count(_time_slot(first + TIME_SLOT_NS))
            == sum(2 + len(span.events) for span in spans))


def native_template_ok(body: bytes, spans: list[Span], *, past_starts: bool = False) -> bool:
    """Whether ``patch_json`` (``patch_ids`` with ``past_starts``) patches exactly what it should
    in ``encode_native(spans)``: a marker inside some other value would be patched too, and a trace
    that ran past the two time slots would keep old times. Otherwise redraw."""
    return body.count(JSON_MARKER) == _marker_count(spans) and (past_starts or _times_in_slots(body, spans))


def encode_native(spans: list[Span]) -> bytes:
    marker = JSON_MARKER.decode()
    out = []
    for span in spans:
        item = {"trace_id": marker + span.trace_suffix, "span_id": f"{marker}{span.k:08x}",
                "parent_span_id": f"{marker}{span.parent_k:08x}" if span.parent_k else None,
                "name": span.name, "phase": span.phase, "service": span.service,
                "start_time": span.start_ns, "end_time": span.end_ns, "status": span.status,
                "attributes": span.attributes, "resource_attributes": _resource(span.service)}
        if span.status_message:
            item["status_message"] = span.status_message
        if span.model:
            item.update(model=span.model, input_tokens=span.input_tokens, output_tokens=span.output_tokens,
                        cost_usd=span.cost_usd)
        if span.ttft_ms is not None:
            item["ttft_ms"] = span.ttft_ms
        if span.events:
            item["events"] = [{"name": name, "time": at} for name, at in span.events]
        out.append(item)
    return json.dumps({"spans": out}, separators=(",", ":")).encode()


def _set_any(value_message, value) -> None:
    if isinstance(value, bool):
        value_message.bool_value = value
    elif isinstance(value, int):
        value_message.int_value = value
    elif isinstance(value, float):
        value_message.double_value = value
    else:
        value_message.string_value = str(value)


def _add_attributes(repeated, attributes: dict) -> None:
    for key, value in attributes.items():
        kv = repeated.add()
        kv.key = key
        _set_any(kv.value, value)


def encode_otlp(spans: list[Span]) -> bytes:
    """An ExportTraceServiceRequest with one ResourceSpans per service.name."""
    request = ExportTraceServiceRequest()
    by_service: dict[str, list[Span]] = {}
    for span in spans:
        by_service.setdefault(span.service, []).append(span)
    for service, group in by_service.items():
        resource_spans = request.resource_spans.add()
        _add_attributes(resource_spans.resource.attributes, _resource(service))
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name, scope_spans.scope.version = "tracedash-bench", "1.0"
        for span in group:
            out = scope_spans.spans.add()
            out.trace_id = PB_MARKER + bytes.fromhex(span.trace_suffix)
            out.span_id = PB_MARKER + span.k.to_bytes(4, "big")
            if span.parent_k:
                out.parent_span_id = PB_MARKER + span.parent_k.to_bytes(4, "big")
            out.name, out.kind = span.name, span.kind
            out.start_time_unix_nano, out.end_time_unix_nano = span.start_ns, span.end_ns
            attributes = dict(span.attributes)
            if span.model:
                attributes.update({"gen_ai.operation.name": span.operation, "gen_ai.system": span.system,
                                   "gen_ai.request.model": span.model, "gen_ai.usage.input_tokens": span.input_tokens,
                                   "gen_ai.usage.output_tokens": span.output_tokens, "gen_ai.usage.cost": span.cost_usd})
                if span.ttft_ms is not None:
                    attributes["gen_ai.response.time_to_first_chunk"] = span.ttft_ms / 1000.0
            else:
                attributes["tracedash.phase"] = span.phase
            _add_attributes(out.attributes, attributes)
            for name, at in span.events:
                event = out.events.add()
                event.name, event.time_unix_nano = name, at
            if span.status == "error":
                out.status.code, out.status.message = 2, span.status_message
    return request.SerializeToString()


_FIRST_TIME = re.compile(rb'"start_time":(\d{9})\d{10}[,}]')


def patch_ids(template: bytes, request_no: int) -> bytes:
    """The template with request ``request_no``'s id prefix (its times as they were built)."""
    return template.replace(JSON_MARKER, b"%08x" % request_no)


def patch_json(template: bytes, request_no: int) -> bytes:
    """The template with request ``request_no``'s id prefix, and its times moved to the two slots
    before the current one (``TIME_SLOT_NS``: ``TraceFactory`` builds every time in two)."""
    body = patch_ids(template, request_no)
    found = _FIRST_TIME.search(body)
    if found is None:
        return body
    slot, now = int(found.group(1)), time.time_ns() // TIME_SLOT_NS - 2
    # Moved later, the later slot first (and earlier, the earlier first): no number written by the
    # first replacement is the one the second replaces.
    order = (1, 0) if now > slot else (0, 1) if now < slot else ()
    for step in order:
        body = body.replace(b"%09d" % (slot + step), b"%09d" % (now + step))
    return body


def patch_otlp(template: bytes, request_no: int) -> bytes:
    return template.replace(PB_MARKER, request_no.to_bytes(4, "big"))


@dataclass
class Scenario:
    name: str
    path: str
    content_type: str
    batch: int
    templates: list[bytes]
    patch: object  # (template, request number) -> body
    check: object  # (answer bytes, batch size) -> bool


def _check_json(answer: bytes, batch: int) -> bool:
    payload = json.loads(answer)
    return payload.get("accepted") == batch and not payload.get("rejected")


def _check_otlp(answer: bytes, batch: int) -> bool:
    return ExportTraceServiceResponse.FromString(answer).partial_success.rejected_spans == 0


def build_scenarios(seed: int, pool_100: int, pool_1000: int, *, past_starts: bool = False) -> list[Scenario]:
    """Batches of whole traces, encoded both ways (same spans for JSON and OTLP); the JSON ones
    sent with the current time (``patch_json``) unless ``past_starts``."""
    factory = TraceFactory(seed, time.time_ns(), past_starts=past_starts)
    templates: dict[tuple[str, int], list[bytes]] = {("json", 100): [], ("json", 1000): [], ("otlp", 100): [], ("otlp", 1000): []}
    for size, count in ((100, pool_100), (1000, pool_1000)):
        while len(templates[("json", size)]) < count:
            spans = factory.batch(size)
            native, proto = encode_native(spans), encode_otlp(spans)
            # A marker inside some other value (a fixed64 time, say) would be patched too: redraw.
            if not native_template_ok(native, spans, past_starts=past_starts) or proto.count(PB_MARKER) != _marker_count(spans):
                continue
            templates[("json", size)].append(native)
            templates[("otlp", size)].append(proto)
    return [
        Scenario(f"{fmt}-{size}", "/api/v1/traces" if fmt == "json" else "/v1/traces",
                 "application/json" if fmt == "json" else "application/x-protobuf", size,
                 templates[(fmt, size)], (patch_ids if past_starts else patch_json) if fmt == "json" else patch_otlp,
                 _check_json if fmt == "json" else _check_otlp)
        for fmt in ("json", "otlp") for size in (100, 1000)
    ]


def validate_templates(scenarios: list[Scenario], request_numbers) -> None:
    """Run one body of each scenario through the server's own parsers: no span may be rejected."""
    from ingest import otlp
    from ingest.schemas import Limits, parse_spans

    limits = Limits()
    for scenario in scenarios:
        body = scenario.patch(scenario.templates[0], next(request_numbers))
        if scenario.content_type == "application/json":
            rows, rejected = parse_spans(body, project_id=1, limits=limits)
            assert not rejected, (scenario.name, rejected[:3])
        else:
            rows = [otlp.span_row(span, project_id=1, limits=limits) for span in otlp.decode_traces(body, otlp.PROTOBUF)]
        assert len(rows) == scenario.batch, (scenario.name, len(rows))
        assert {row["phase"] for row in rows} >= {"network", "preprocess", "inference", "postprocess", "other"}, scenario.name
        assert any(row["ttft_ns"] for row in rows) and any(row["cost_usd"] for row in rows), scenario.name


# --- HTTP load ---------------------------------------------------------------------------------
@dataclass
class Tally:
    """One client connection's counts; read without a lock by the progress loop (stale is fine)."""

    requests: int = 0
    spans: int = 0
    checked: int = 0
    latencies: list = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    finished: float = 0.0  # perf_counter when the connection's last request ended


def _client(scenario: Scenario, port: int, key: str, deadline: float, request_numbers, tally: Tally, offset: int) -> None:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": scenario.content_type}
    templates = scenario.templates
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    i = offset
    clock = time.perf_counter
    try:
        while clock() < deadline:
            body = scenario.patch(templates[i % len(templates)], next(request_numbers))
            i += 1
            started = clock()
            try:
                conn.request("POST", scenario.path, body, headers)
                response = conn.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException) as exc:
                tally.errors[type(exc).__name__] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                time.sleep(0.05)
                continue
            elapsed = clock() - started
            if response.status != 200:
                tally.errors[str(response.status)] += 1
                if response.status in (429, 503):
                    time.sleep(0.05)
                continue
            if tally.requests % SAMPLE_EVERY == 0:
                tally.checked += 1
                if not scenario.check(answer, scenario.batch):
                    tally.errors["200 with rejected spans"] += 1
                    continue
            tally.requests += 1
            tally.spans += scenario.batch
            tally.latencies.append(elapsed)
    finally:
        tally.finished = clock()
        conn.close()


@dataclass
class Load:
    """One scenario's load on one server, summed over its turns (``drive``'s ``load``)."""

    scenario: Scenario
    latencies: list = field(default_factory=list)
    requests: int = 0
    spans: int = 0
    checked: int = 0
    errors: Counter = field(default_factory=Counter)
    wall: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    inserts: int = 0
    stored: int = 0
    spooled: int = 0
    per_turn: list = field(default_factory=list)  # spans/s of each turn

    @property
    def turns(self) -> int:
        return len(self.per_turn)

    def result(self) -> dict:
        latencies = sorted(self.latencies)
        scenario, wall, spans = self.scenario, self.wall, self.spans
        body_bytes = sum(len(b) for b in scenario.templates) / len(scenario.templates)

        def ms(q):
            value = percentile(latencies, q)
            return None if value is None else round(value * 1000, 2)

        return {
            "scenario": scenario.name, "batch_spans": scenario.batch, "body_bytes": round(body_bytes),
            "seconds": round(wall, 2), "turns": self.turns, "requests": self.requests, "spans_acknowledged": spans,
            "req_per_s": round(self.requests / wall, 1), "spans_per_s": round(spans / wall, 1),
            "mb_per_s": round(self.requests * body_bytes / wall / 1e6, 2),
            "p50_ms": ms(50), "p90_ms": ms(90), "p99_ms": ms(99), "max_ms": ms(100),
            "errors": sum(self.errors.values()), "errors_by_status": dict(self.errors), "answers_checked": self.checked,
            "server_cpu_percent": round(100 * self.server_cpu / wall, 1),
            "client_cpu_percent": round(100 * self.client_cpu / wall, 1),
            "server_cpu_ms_per_1000_spans": round(1e6 * self.server_cpu / spans, 1) if spans else None,
            "server_inserts": self.inserts, "rows_per_insert": round(self.stored / self.inserts, 1) if self.inserts else None,
            "rows_spooled": self.spooled, "spans_per_s_by_turn": [round(x, 1) for x in self.per_turn],
        }


def drive(scenario: Scenario, server: Server, key: str, *, duration: float, concurrency: int, request_numbers,
          load: Load | None = None) -> dict:
    """``concurrency`` keep-alive connections posting for ``duration`` s; a live line on stderr.
    With ``load``, this is one turn of several: its counts are added to ``load``'s."""
    turn = "" if load is None else f" turn {load.turns + 1}"
    load = load if load is not None else Load(scenario)
    before = server.health()["checks"]["ingest"]
    server_cpu, client_cpu = server.cpu_seconds(), time.process_time()
    tallies = [Tally() for _ in range(concurrency)]
    started = time.perf_counter()
    deadline = started + duration
    threads = [threading.Thread(target=_client, args=(scenario, server.port, key, deadline, request_numbers, tally,
                                                      n * len(scenario.templates) // concurrency), daemon=True)
               for n, tally in enumerate(tallies)]
    for thread in threads:
        thread.start()
    last_spans, last_time = 0, started
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.1)
        now = time.perf_counter()
        if now - last_time < 1.0:
            continue
        requests, spans = sum(t.requests for t in tallies), sum(t.spans for t in tallies)
        p99 = percentile(sorted(x for t in tallies for x in list(t.latencies)), 99)
        errors = sum(sum(t.errors.values()) for t in tallies)
        elapsed = now - started
        sys.stderr.write(f"\r  {scenario.name:<9}{turn} {elapsed:5.1f}s  {requests / elapsed:7.1f} req/s  "
                         f"{spans / elapsed:9,.0f} spans/s  (last 1 s: {(spans - last_spans) / (now - last_time):9,.0f})  "
                         f"p99 {p99 * 1000 if p99 is not None else 0:7.1f} ms  errors {errors}   ")
        sys.stderr.flush()
        last_spans, last_time = spans, now
    sys.stderr.write("\n")
    wall = max(t.finished for t in tallies) - started
    load.wall += wall
    load.per_turn.append(sum(t.spans for t in tallies) / wall)
    load.server_cpu += server.cpu_seconds() - server_cpu
    load.client_cpu += time.process_time() - client_cpu
    after = server.health()["checks"]["ingest"]
    load.inserts += after["batches"] - before["batches"]
    load.stored += after["rows_stored"] - before["rows_stored"]
    load.spooled += after["rows_spooled"] - before["rows_spooled"]
    for t in tallies:
        load.latencies += t.latencies
        load.requests += t.requests
        load.spans += t.spans
        load.checked += t.checked
        load.errors += t.errors
    return load.result()


def wait_drained(server: Server, timeout: float = 120.0) -> dict:
    """Until the writer holds nothing queued and the spool is empty; the last ingest check."""
    deadline = time.monotonic() + timeout
    while True:
        ingest = server.health()["checks"]["ingest"]
        if ingest["queued_rows"] == 0 and ingest["spooled_segments"] == 0:
            return ingest
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not drain within {timeout:.0f} s: {ingest}")
        time.sleep(0.5)


COUNT_SCRIPT = """
import json, django
django.setup()
from store import get_store
result = get_store().query("SELECT count(), uniqExact(trace_id, span_id) FROM spans FINAL", tag="bench.ingest.count")
count, unique = result.rows[0]
print(json.dumps({"count": int(count), "unique": int(unique)}))
"""


def stored_count(server: Server) -> dict:
    """Counted by a separate process on the stopped server's data dir (one chdb path per process)."""
    env = {**server.env, "DJANGO_SETTINGS_MODULE": "config.settings"}
    done = subprocess.run([sys.executable, "-c", COUNT_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"counting the stored spans failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the raw insert ------------------------------------------------------------------------------
class RawStore:
    """``Store.insert`` of the server's own rows into a chdb of this process's own: the rate the
    ratios divide by. This 2-core machine's speed swings by a fifth within minutes, so ``main``
    measures it before the first server and again after the last, and the ratios divide by the
    mean of the two (both are printed, with how far apart they were)."""

    def __init__(self, scenarios: list[Scenario], work: Path, request_numbers):
        os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", TRACEDASH_DATA_DIR=str(work / "bench-settings"))
        for name in PRODUCTION_VARIABLES:
            if name != "DJANGO_SETTINGS_MODULE":
                os.environ.pop(name, None)
        import django

        django.setup()
        from django.conf import settings

        from ingest import otlp
        from ingest.schemas import Limits, parse_spans
        from store import Store
        from store.backends import EmbeddedBackend
        from store.migrator import MigrationContext, migrate

        limits = Limits.from_settings(settings)
        by_name = {s.name: s for s in scenarios}
        native, proto = by_name["json-1000"], by_name["otlp-1000"]
        bodies = 20  # 20,000 distinct rows: two distinct 10,000-row batches
        native_bodies = [native.patch(native.templates[i % len(native.templates)], next(request_numbers))
                         for i in range(bodies)]
        proto_bodies = [proto.patch(proto.templates[i % len(proto.templates)], next(request_numbers))
                        for i in range(bodies)]
        started = time.perf_counter()
        self.rows = [row for body in native_bodies for row in parse_spans(body, project_id=1, limits=limits)[0]]
        parse_native = len(self.rows) / (time.perf_counter() - started)
        started = time.perf_counter()
        otlp_rows = [otlp.span_row(span, project_id=1, limits=limits)
                     for body in proto_bodies for span in otlp.decode_traces(body, otlp.PROTOBUF)]
        parse_otlp = len(otlp_rows) / (time.perf_counter() - started)
        del otlp_rows
        self.parsed = {"parse_native_spans_per_s": round(parse_native), "parse_otlp_spans_per_s": round(parse_otlp)}
        self.store = Store(EmbeddedBackend(work / "raw" / "clickhouse", "bench_raw"))
        migrate(self.store, MigrationContext(retention_days=30))
        # A unique token per insert, as ingest.writer sends: without one, re-inserting a block already
        # seen would be skipped by the table's block deduplication, and the rows below do repeat.
        self.store.insert("spans", self.rows[:1000], tag="bench.raw.warmup", dedup_token=secrets.token_hex(16))
        self._offset = 0

    def measure(self, *, seconds: float, label: str) -> dict:
        """Insert rates at 1,000- and 10,000-row batches, the Arrow table's share, and what storing
        costs in all (the CPU of this process, every chdb thread, until the merges are done)."""
        from store.backends import arrow_table  # the Python half of an embedded insert
        from store.schema import SPANS

        rows, result = self.rows, {}
        columns = SPANS.insert_columns
        cpu_started, rows_inserted = process_cpu_seconds(), 0
        for size in (1000, 10_000):
            inserted, elapsed, inserts = self._inserts(size, seconds)
            result[f"raw_rows_per_s_{size}"] = round(inserted / elapsed)
            result[f"raw_ms_per_insert_{size}"] = round(1000 * elapsed / inserts, 2)
            started = time.perf_counter()
            for _ in range(3):
                arrow_table([c.name for c in columns], [c.type for c in columns], rows[:size])
            result[f"arrow_build_ms_{size}"] = round(1000 * (time.perf_counter() - started) / 3, 2)
            rows_inserted += inserted
            log(f"  raw insert ({label}), {size:,}-row batches: {result[f'raw_rows_per_s_{size}']:,} rows/s "
                f"({inserts} inserts)")
        self._merged(120)
        cpu_ms_per_1000 = 1000 * 1000 * (process_cpu_seconds() - cpu_started) / rows_inserted
        result["store_cpu_ms_per_1000_rows"] = round(cpu_ms_per_1000, 1)
        result["store_ceiling_rows_per_s"] = round((os.cpu_count() or 1) * 1000 * 1000 / cpu_ms_per_1000)
        return result

    def sample(self, *, seconds: float) -> int:
        """The 1,000-row insert rate over ``seconds``, taken between two servers' turns (both frozen);
        then its merges are waited for (30 s at most), so that they do not run in the next turn. Three
        inserts before it are not timed (a warm-up after a server's turn)."""
        self._inserts(1000, 0.0)
        inserted, elapsed, _ = self._inserts(1000, seconds)
        self._merged(30)
        return round(inserted / elapsed)

    def _inserts(self, size: int, seconds: float) -> tuple[int, float, int]:
        """Inserts of ``size`` rows for ``seconds`` (three at least): rows, seconds inside the inserts, inserts."""
        rows = self.rows
        inserted, elapsed, inserts = 0, 0.0, 0
        while elapsed < seconds or inserts < 3:
            if self._offset + size > len(rows):
                self._offset = 0
            batch = rows[self._offset:self._offset + size]
            self._offset += size
            started = time.perf_counter()
            self.store.insert("spans", batch, tag="bench.raw", dedup_token=secrets.token_hex(16))
            elapsed += time.perf_counter() - started
            inserted += len(batch)
            inserts += 1
        return inserted, elapsed, inserts

    def _merged(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.store.query(
                "SELECT count() FROM system.merges WHERE database = currentDatabase()", tag="bench.raw.merges").scalar():
            time.sleep(0.5)

    def close(self) -> None:
        self.store.close()


def raw_combined(before: dict, after: dict) -> dict:
    """The figures the report and the ratios use: every rate the mean of the measurement before the
    servers and the one after; the two 1,000-row rates kept, with their spread."""
    combined = {k: round((before[k] + after[k]) / 2, 2 if isinstance(before[k], float) else None) for k in before}
    low, high = sorted((before["raw_rows_per_s_1000"], after["raw_rows_per_s_1000"]))
    combined.update(raw_1000_before=before["raw_rows_per_s_1000"], raw_1000_after=after["raw_rows_per_s_1000"],
                    raw_1000_spread=round(high / low - 1, 3))
    return combined


# --- report --------------------------------------------------------------------------------------
def report(results: list[dict], raw: dict, check: dict, info: dict, settings: dict) -> str:
    raw_1000 = raw.get("raw_rows_per_s_1000")
    rows = []
    for r in results:
        ratio = f"{r['spans_per_s'] / raw_1000:.2f}" if raw_1000 else "-"
        rows.append([r["scenario"], f"{r['spans_per_s']:,.0f}", f"{r['req_per_s']:,.1f}", f"{r['p50_ms'] or 0:,.1f}",
                     f"{r['p99_ms'] or 0:,.1f}", str(r["errors"]), ratio])
    turns = (f" (in {settings['turns']} turns, by turns with the other server)" if settings.get("turns", 1) > 1
             else "")
    lines = ["", f"tracedash ingest benchmark — {settings['duration']:g} s per scenario{turns}, {settings['concurrency']} "
             f"keep-alive connections, embedded chdb (server: `manage.py serve`, rate limit off, "
             f"{'in-process beat on: summaries, rollups, alerts' if settings.get('beat', True) else 'no in-process beat: the ingestion path alone'}"
             f"; inserts at once: {settings.get('write_threads', 1)}"
             + ("".join(f", {k}={v}" for k, v in settings.get("beat_env", {}).items()) if settings.get("beat", True) else "")
             + ")", "",
             table(["scenario", "spans/s ack'd", "req/s", "p50 ms", "p99 ms", "errors", "ratio to raw"], rows), ""]
    detail = [[r["scenario"], f"{r['body_bytes'] / 1024:,.0f} KiB", f"{r['mb_per_s']:,.1f}", f"{r['server_cpu_percent']:.0f} %",
               f"{r['client_cpu_percent']:.0f} %", f"{r['server_cpu_ms_per_1000_spans'] or 0:,.0f}",
               str(r["server_inserts"]), f"{r['rows_per_insert'] or 0:,.0f}", f"{r['p90_ms'] or 0:,.1f}", f"{r['max_ms'] or 0:,.1f}"]
              for r in results]
    lines += [table(["scenario", "body", "MB/s", "server CPU", "client CPU", "server CPU ms/1k spans",
                     "inserts", "rows/insert", "p90 ms", "max ms"], detail), ""]
    for r in results:
        if r["errors"]:
            lines.append(f"errors in {r['scenario']}: {r['errors_by_status']}")
    if raw:
        lines += [f"raw Store.insert (Arrow into chdb, same rows, this process, no server running): "
                  f"{raw['raw_rows_per_s_1000']:,} rows/s at 1,000-row batches ({raw['raw_ms_per_insert_1000']} ms each), "
                  f"{raw['raw_rows_per_s_10000']:,} rows/s at 10,000-row batches ({raw['raw_ms_per_insert_10000']} ms each)"]
        if "raw_1000_spread" in raw and raw.get("raw_1000_between_turns"):
            lines.append(f"  before the servers {raw['raw_1000_before']:,} rows/s at 1,000-row batches, after "
                         f"{raw['raw_1000_after']:,} ({100 * raw['raw_1000_spread']:.0f} % apart); the ratios divide "
                         "by the samples between the turns instead:")
        elif "raw_1000_spread" in raw:
            lines.append(f"  the mean of before the servers ({raw['raw_1000_before']:,} rows/s at 1,000-row batches) and after "
                         f"({raw['raw_1000_after']:,}): {100 * raw['raw_1000_spread']:.0f} % apart"
                         + (" — the machine's speed changed during the run; ratios to raw are uncertain by as much"
                            if raw["raw_1000_spread"] > 0.15 else ""))
        if raw.get("raw_1000_between_turns"):
            between = raw["raw_1000_between_turns"]
            lines.append(f"  1,000-row batches between the turns (both servers frozen, 2 s each, {len(between)} samples): "
                         f"{min(between):,}–{max(between):,} rows/s, mean {statistics.mean(between):,.0f}: the rate "
                         "the ratios to raw divide by (the first figure above)")
        if "arrow_build_ms_1000" in raw:
            lines.append(f"  of which building the Arrow table: {raw['arrow_build_ms_1000']} ms per 1,000 rows, "
                         f"{raw['arrow_build_ms_10000']} ms per 10,000 rows")
        lines.append(f"parse only (one thread, as the server validates): native JSON {raw['parse_native_spans_per_s']:,} spans/s, "
                     f"OTLP protobuf {raw['parse_otlp_spans_per_s']:,} spans/s")
        if "store_cpu_ms_per_1000_rows" in raw:
            lines.append(f"storing in all (inserts + the merges they cause, every chdb thread): "
                         f"{raw['store_cpu_ms_per_1000_rows']} ms of CPU per 1,000 rows; with every core doing "
                         f"nothing else, this machine could store at most {raw['store_ceiling_rows_per_s']:,} rows/s")
    if check:
        verdict = "OK" if check["ok"] else "MISMATCH"
        lines.append(f"stored == acknowledged: {verdict} (acknowledged {check['acknowledged']:,}, stored {check['count']:,}, "
                     f"unique (trace_id, span_id) {check['unique']:,}; server exit code {check['server_exit']})")
    machine_line = (f"machine: nproc {info['nproc']}, {info['cpu_model']}, Python {info['python']}, "
                    f"{info.get('memory_gib', '?')} GiB RAM")
    if "cgroup_cpu_limit" in info:
        machine_line += f", cgroup CPU limit {info['cgroup_cpu_limit']}"
    lines += [machine_line, ""]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, help="seconds per scenario (default 20; 5 with --quick)")
    parser.add_argument("--concurrency", type=int, default=8, help="keep-alive client connections (default 8)")
    parser.add_argument("--data-dir", type=Path, help="where to make the temporary data dirs (default: the system's temp dir)")
    parser.add_argument("--quick", action="store_true", help="short runs: 5 s per scenario, 1.5 s per raw batch size")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs and the server log")
    parser.add_argument("--scenarios", default="json-100,json-1000,otlp-100,otlp-1000",
                        help="comma-separated subset of the scenarios to run (default: all four)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--past-starts", action="store_true",
                        help="native JSON traces that started 2-60 minutes before the run, for the whole run, as before "
                             "2026-12-08 (default: each request's times are its own, 20-30 s before it is sent)")
    parser.add_argument("--compare-beat", action="store_true",
                        help="run every scenario twice, on a server with its in-process beat and on one without, "
                             "and print the ratios between them (and to the raw insert)")
    parser.add_argument("--turn-seconds", type=float, default=10.0,
                        help="with --compare-beat: both servers run side by side and take the load by turns of about "
                             "this many seconds (A B, B A, …; the other one frozen meanwhile), so that the machine's "
                             "swings fall on both alike (default 10: the rollups' period, so a turn sees as many "
                             "rollup runs as the same seconds of a server alone)")
    parser.add_argument("--beat-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the server with its beat only (repeatable): to weigh one "
                             "of the beat's settings, e.g. TRACEDASH_SUMMARIZE_SECONDS=4")
    parser.add_argument("--no-beat", action="store_true",
                        help="server without its in-process periodic tasks (TRACEDASH_EMBEDDED_BEAT=0): the ingestion "
                             "path alone, as a production web process runs it (summaries and rollups in the worker)")
    parser.add_argument("--write-threads", type=int, choices=range(1, 9), metavar="N",
                        help="inserts the server's writer may run at once (TRACEDASH_INGEST_WRITE_THREADS); default: "
                             "the server's own (1 with its in-process beat, 2 without), except that --compare-beat "
                             "runs both servers with 1, so that their ratio is the beat's cost alone")
    parser.add_argument("--parse-processes", type=int, choices=range(0, 17), metavar="N",
                        help="worker processes that parse the native JSON batches beside the server "
                             "(TRACEDASH_INGEST_PARSE_PROCESSES); default: the server's own (0). Server CPU then "
                             "counts the workers too")
    args = parser.parse_args(argv)
    if args.write_threads is None and args.compare_beat:
        args.write_threads = 1
    try:
        args.beat_env = dict(item.split("=", 1) for item in args.beat_env)
    except ValueError:
        parser.error("--beat-env takes NAME=VALUE")
    if args.beat_env and args.no_beat:
        parser.error("--beat-env is for the server with its beat")
    args.scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = set(args.scenarios) - {"json-100", "json-1000", "otlp-100", "otlp-1000"}
    if unknown or not args.scenarios:
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown)) or '(none given)'}")
    if args.duration is None:
        args.duration = 5.0 if args.quick else 20.0
    if args.concurrency < 1 or args.duration <= 0 or args.turn_seconds <= 0:
        parser.error("--concurrency, --duration and --turn-seconds must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    raw_seconds = 1.5 if args.quick else 4.0
    pause = 1.0 if args.quick else 3.0
    if args.data_dir:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tracedash-bench-ingest-", dir=args.data_dir))
    request_numbers = itertools.count(1)  # the per-request id prefix: unique across the whole run

    log("generating traces and encoding bodies…")
    started = time.perf_counter()
    scenarios = build_scenarios(args.seed, pool_100=40, pool_1000=6, past_starts=args.past_starts)
    validate_templates(scenarios, request_numbers)
    log(f"  {sum(len(s.templates) * s.batch for s in scenarios) // 2:,} distinct spans in "
        f"{time.perf_counter() - started:.1f} s; bodies: "
        + ", ".join(f"{s.name} {sum(map(len, s.templates)) / len(s.templates) / 1024:,.0f} KiB" for s in scenarios))

    log("raw insert of the same rows in this process, before the servers…")
    raw_store = RawStore(scenarios, work, request_numbers)
    raw_before = raw_store.measure(seconds=raw_seconds, label="before")
    raw_turns: dict[str, list[int]] = {}
    cpu_split: dict[str, dict[str, float]] = {}
    cpu_names: dict[str, dict[str, float]] = {}
    if args.compare_beat:
        runs, raw_turns = run_by_turns(args, scenarios, request_numbers, work, pause=pause, raw_store=raw_store,
                                       cpu_split=cpu_split, cpu_names=cpu_names)
    else:
        beat = not args.no_beat
        runs = {beat: run_server(args, scenarios, request_numbers, work / ("server-beat" if beat else "server-no-beat"),
                                 beat=beat, pause=pause)}
    ok = all(check.get("ok") for _, check in runs.values())

    raw: dict = raw_before | raw_store.parsed
    try:
        log("raw insert of the same rows in this process, after the servers…")
        raw = raw_combined(raw_before, raw_store.measure(seconds=raw_seconds, label="after")) | raw_store.parsed
        raw_store.close()
        between = raw_turns.get("json-1000") or [x for samples in raw_turns.values() for x in samples]
        if between:  # beside the turns measured: what the ratios to raw divide by
            raw.update(raw_rows_per_s_1000=round(statistics.mean(between)), raw_1000_between_turns=between)
    finally:
        info = machine()
        settings = {"duration": args.duration, "concurrency": args.concurrency, "quick": args.quick,
                    "write_threads": args.write_threads or "the server's default"}
        if args.compare_beat:
            settings["turns"] = max(1, round(args.duration / args.turn_seconds))
        if args.beat_env:
            settings["beat_env"] = args.beat_env
        for beat, (results, check) in runs.items():
            print(report(results, raw, check, info, settings | {"beat": beat}), flush=True)
        print(ratios_text(runs, raw), flush=True)
        if any(any(groups.values()) for groups in cpu_split.values()):
            print(cpu_split_text(cpu_split, runs, names=cpu_names), flush=True)
        if args.json:
            payload = {"settings": settings, "machine": info, "raw": raw, "ratios": ratios(runs, raw),
                       "runs": [{"beat": beat, "scenarios": results, "check": check}
                                for beat, (results, check) in runs.items()]}
            args.json.write_text(json.dumps(payload, indent=2) + "\n")
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def server_env(args, *, beat: bool) -> dict[str, str]:
    env = {"TRACEDASH_INGEST_RATE_LIMIT": "0", "TRACEDASH_BEAT_SAMPLE_SECONDS": "3600"}
    if not beat:
        env["TRACEDASH_EMBEDDED_BEAT"] = "0"
    if args.write_threads:
        env["TRACEDASH_INGEST_WRITE_THREADS"] = str(args.write_threads)
    if args.parse_processes is not None:
        env["TRACEDASH_INGEST_PARSE_PROCESSES"] = str(args.parse_processes)
    if beat:
        env.update(args.beat_env)
    return env


def start_server(server: Server, *, beat: bool) -> str:
    """Start ``server`` (made with ``server_env``); its project key."""
    log(f"starting `manage.py serve` {'with' if beat else 'without'} its in-process beat…")
    server.start()
    key = server.manage("create_project", "bench").strip().splitlines()[-1]
    log(f"  serving on {server.base} (pid {server.proc.pid}); project key {key[:12]}…")
    return key


def finish_server(server: Server, results: list[dict]) -> dict:
    """Drain, stop and count: the stored spans (after a clean stop) against what was acknowledged."""
    log(f"waiting for the server's queue and spool to drain (pid {server.proc.pid})…")
    drained = wait_drained(server)
    log(f"  writer: {drained['batches']:,} inserts, {drained['rows_stored']:,} rows stored, "
        f"{drained['rows_spooled']:,} spooled; server RSS {server.rss_bytes() / 2**20:,.0f} MiB")
    log("stopping the server (SIGINT)…")
    exit_code = server.stop()
    log("counting stored spans in a separate process…")
    counted = stored_count(server)
    acknowledged = sum(r["spans_acknowledged"] for r in results)
    return {"acknowledged": acknowledged, **counted, "server_exit": exit_code,
            "ok": counted["count"] == acknowledged == counted["unique"]}


def _failed(server: Server, data_dir: Path) -> None:
    log(f"\nserver log (last lines, {server.log_path}):\n{server.log_tail()}")
    log(f"data dirs kept in {data_dir.parent}")


def run_server(args, scenarios, request_numbers, data_dir: Path, *, beat: bool, pause: float) -> tuple[list[dict], dict]:
    """One server (with or without its in-process beat) through every chosen scenario; then the
    stored count (after a clean stop) against what was acknowledged."""
    server = Server(data_dir, env=server_env(args, beat=beat))
    results: list[dict] = []
    try:
        key = start_server(server, beat=beat)
        for n, scenario in enumerate(s for s in scenarios if s.name in args.scenarios):
            if n:
                time.sleep(pause)  # let the previous scenario's merges settle
            results.append(drive(scenario, server, key, duration=args.duration, concurrency=args.concurrency,
                                 request_numbers=request_numbers))
        check = finish_server(server, results)
    except BaseException:
        _failed(server, data_dir)
        raise
    finally:
        server.stop()
    return results, check


def run_by_turns(args, scenarios, request_numbers, work: Path, *, pause: float, raw_store: "RawStore",
                 cpu_split: dict, cpu_names: dict) -> tuple[dict[bool, tuple[list[dict], dict]], dict[str, list[int]]]:
    """Both servers, the one with its beat and the one without, started side by side and measured by
    turns: each scenario's ``--duration`` is cut into turns of about ``--turn-seconds``, and in each
    turn one server takes the load while the other is frozen (SIGSTOP: no CPU, its beat and merges
    included), in the order A B, B A, A B, … So a swing of the shared machine's speed falls on both
    alike instead of on whichever server ran second; each server does its own work (its beat's
    included) only in its own turns. After each pair of turns, both frozen, the raw insert's
    1,000-row rate is sampled for 2 s (its merges waited for): the rate the ratios to raw divide by
    is the mean of the samples taken beside the scenario's turns, returned per scenario.
    ``cpu_split`` gets each server's CPU seconds by thread group over the turns (bench.common.ThreadCpu;
    the work a server had left when the last turn ended is not in it)."""
    servers: dict[bool, Server] = {}
    keys: dict[bool, str] = {}
    raw_samples: dict[str, list[int]] = {}
    loads: dict[bool, list[Load]] = {True: [], False: []}
    try:
        for beat in (True, False):
            servers[beat] = server = Server(work / ("server-beat" if beat else "server-no-beat"),
                                            env=server_env(args, beat=beat))
            keys[beat] = start_server(server, beat=beat)
            server.pause()
        split = ThreadCpu({"beat": servers[True].proc.pid, "no beat": servers[False].proc.pid})
        turns = max(1, round(args.duration / args.turn_seconds))
        for n, scenario in enumerate(s for s in scenarios if s.name in args.scenarios):
            if n:
                for server in servers.values():  # let the previous scenario's merges settle, each in turn
                    server.resume()
                    time.sleep(pause)
                    server.pause()
            now = {True: Load(scenario), False: Load(scenario)}
            log(f"{scenario.name}: {turns} turns of {args.duration / turns:g} s per server")
            for turn in range(turns):
                for beat in ((True, False) if turn % 2 == 0 else (False, True)):
                    server, key = servers[beat], keys[beat]
                    server.resume()
                    try:
                        sys.stderr.write(f"  [{'beat   ' if beat else 'no beat'}]")
                        drive(scenario, server, key, duration=args.duration / turns, concurrency=args.concurrency,
                              request_numbers=request_numbers, load=now[beat])
                    finally:
                        server.pause()
                raw_samples.setdefault(scenario.name, []).append(raw_store.sample(seconds=2.0))
                log(f"  raw insert between the turns: {raw_samples[scenario.name][-1]:,} rows/s at 1,000-row batches")
            for beat in (True, False):
                loads[beat].append(now[beat])
        cpu_split.update(split.stop())
        cpu_names.update(split.clickhouse)
        runs = {}
        for beat in (True, False):
            server = servers[beat]
            server.resume()
            results = [load.result() for load in loads[beat]]
            runs[beat] = (results, finish_server(server, results))
        return runs, raw_samples
    except BaseException:
        for server in servers.values():
            _failed(server, server.data_dir)
        raise
    finally:
        for server in servers.values():
            server.stop()


def ratios(runs: dict, raw: dict) -> dict:
    """The issue's figures: beat / no-beat and beat / raw for json-1000, json-100 / json-1000 per mode."""
    by = {beat: {r["scenario"]: r["spans_per_s"] for r in results} for beat, (results, _) in runs.items()}
    out = {}
    raw_1000 = raw.get("raw_rows_per_s_1000")
    for beat, rates in by.items():
        mode = "beat" if beat else "no_beat"
        if "json-1000" in rates and raw_1000:
            out[f"json1000_{mode}_to_raw"] = round(rates["json-1000"] / raw_1000, 3)
        if "json-100" in rates and rates.get("json-1000"):
            out[f"json100_to_json1000_{mode}"] = round(rates["json-100"] / rates["json-1000"], 3)
    if True in by and False in by:
        turns = {beat: {r["scenario"]: r.get("spans_per_s_by_turn", []) for r in results}
                 for beat, (results, _) in runs.items()}
        for name in ("json-1000", "json-100", "otlp-1000", "otlp-100"):
            if by[True].get(name) and by[False].get(name):
                out[f"{name.replace('-', '')}_beat_to_no_beat"] = round(by[True][name] / by[False][name], 3)
                pairs = [a / b for a, b in zip(turns[True][name], turns[False][name]) if b]
                if len(pairs) > 1:
                    out[f"{name.replace('-', '')}_beat_to_no_beat_by_turn"] = [round(x, 3) for x in pairs]
    return out


CLICKHOUSE_NAMES_SHOWN = 6  # the names listed under the split: the largest with the beat


def cpu_split_text(split: dict[str, dict[str, float]], runs: dict,
                   names: dict[str, dict[str, float]] | None = None) -> str:
    """Each server's CPU over the turns by thread group, in ms per 1,000 spans it acknowledged, and
    the difference: where the beat's cost lands (its own threads, the ClickHouse statements and
    merges it adds, and the request thread and writers slowed while it takes the cores). With
    ``names`` (ThreadCpu.clickhouse), the ClickHouse threads outside the merges follow by name:
    which of ClickHouse's executors the beat's statements load."""
    spans = {"beat" if beat else "no beat": sum(r["spans_acknowledged"] for r in results)
             for beat, (results, _) in runs.items()}

    def per_1k(source: dict) -> dict[str, dict[str, float]]:
        return {label: {k: seconds * 1e6 / spans[label] for k, seconds in values.items()}
                for label, values in source.items() if spans.get(label)}

    def row(name: str, beat: float, none: float) -> list[str]:
        return [name, f"{beat:.2f}", f"{none:.2f}", f"{beat - none:+.2f}"]

    groups = per_1k(split)
    if set(groups) != {"beat", "no beat"}:
        return ""
    rows = [row(group, groups["beat"][group], groups["no beat"][group]) for group in THREAD_GROUPS]
    total = {label: sum(values.values()) for label, values in groups.items()}
    rows.append(row("total", total["beat"], total["no beat"]))
    text = ("\neach server's CPU over its turns by thread (/proc/<pid>/task, every 0.5 s), ms per 1,000 spans it "
            "acknowledged\n\n" + table(["thread group", "with the beat", "without", "difference"], rows) + "\n")
    names = per_1k(names or {})
    if set(names) == {"beat", "no beat"}:
        shown = sorted(set(names["beat"]) | set(names["no beat"]),
                       key=lambda n: -names["beat"].get(n, 0.0))[:CLICKHOUSE_NAMES_SHOWN]
        rows = [row(f"  {name}", names["beat"].get(name, 0.0), names["no beat"].get(name, 0.0)) for name in shown]
        text += ("\nof which ClickHouse's threads other than the merges, by the name ClickHouse gives them "
                 "(QueryCompPipeEx: INSERT statements' pipelines, an INSERT … SELECT's read and the materialized "
                 "views it feeds included; ThreadPool: the reads' parallel streams; BgSchPool: the tables' "
                 "background tasks), the largest with the beat\n\n"
                 + table(["ClickHouse thread", "with the beat", "without", "difference"], rows) + "\n")
    return text


def ratios_text(runs: dict, raw: dict) -> str:
    figures = ratios(runs, raw)
    if not figures:
        return ""
    labels = {
        "json1000_beat_to_no_beat": "json-1000 with the beat / without (target >= 0.9)",
        "json100_beat_to_no_beat": "json-100 with the beat / without",
        "otlp1000_beat_to_no_beat": "otlp-1000 with the beat / without",
        "otlp100_beat_to_no_beat": "otlp-100 with the beat / without",
        "json1000_beat_to_raw": "json-1000 with the beat / raw 1,000-row insert (target >= 0.9)",
        "json1000_no_beat_to_raw": "json-1000 without the beat / raw 1,000-row insert",
        "json100_to_json1000_beat": "json-100 / json-1000, with the beat",
        "json100_to_json1000_no_beat": "json-100 / json-1000, without the beat",
    }
    rows = []
    for k, v in figures.items():
        if isinstance(v, list):  # one ratio per pair of turns (A B or B A: each pair ran next to each other)
            name = labels.get(k.removesuffix("_by_turn"), k).split(" (")[0]
            rows.append([f"  {name}, each pair of turns", f"{min(v):.2f}–{max(v):.2f}, median {statistics.median(v):.2f}"
                         f", {sum(x >= 0.9 for x in v)} of {len(v)} >= 0.9"])
        else:
            rows.append([labels.get(k, k), f"{v:.2f}"])
    return "\nratios (one run, same machine)\n\n" + table(["figure", "ratio"], rows) + "\n"


if __name__ == "__main__":
    sys.exit(main())
