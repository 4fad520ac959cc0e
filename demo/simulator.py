"""An OpenAI-compatible LLM simulator: a pure ASGI application (stdlib + asyncio; prometheus_client
for /metrics), run by uvicorn.

Endpoints
    POST /v1/chat/completions   chat completions, streamed (SSE) or not
    GET  /v1/models             the configured model names
    GET  /health                {"status": "ok"}
    GET  /stats                 counters: requests, in_flight, queued, active, errors, tokens, kv_cache, ...,
                                and per model: running, waiting, KV blocks used, KV block-seconds, busy seconds
    GET  /metrics               vLLM's (V1 engine) Prometheus metrics, per model (see "Engine metrics")

Timing model of one chat completion (all knobs in :class:`SimulatorConfig`, per model in
:class:`ModelProfile`)::

    arrival -> fixed queueing delay (queue_delay_ms; holds no slot)
            -> wait for a slot (asyncio.Semaphore of ``capacity`` slots; 0 = unlimited)
            -> prefill (prefill_ms + prefill_ms_per_token * prompt_tokens)        => first token
            -> one token every decode_ms_per_token * slowdown                       => last token
            -> slot released

    TTFT = fixed queueing delay + slot wait + prefill   (with the KV-cache model below, the wait is for
           a slot and blocks, and a request preempted before its first token waits and prefills again)
    slowdown = 1 + load_slowdown * (active - 1) / capacity   (active = requests holding a slot, so a
               lone request decodes at the nominal speed and a full pool at 1 + load_slowdown)

Each model named in ``models`` has its own pool of ``capacity`` slots; every other model name
shares the default pool.

KV-cache model (``kv_cache_blocks`` > 0; 0 = none, the model above exactly): each pool also has
``kv_cache_blocks`` blocks of ``kv_block_tokens`` tokens, as vLLM's paged KV cache does::

    a running request holds ceil((prompt_tokens + tokens generated so far) / kv_block_tokens) blocks
    waiting -> running   only in arrival order (the head of the queue holds back the rest, as vLLM's
                         FCFS scheduler does), when a slot is free AND the blocks for its prompt
                         (plus the tokens it already generated, after a preemption) are free
    a new token that needs a new block with none free -> preempt the most recently admitted running
                         request (it may be the request itself): its blocks are freed, it goes back to
                         the front of the queue, num_preemptions + 1 (vLLM's recompute preemption)
    re-admitted          -> prefill again over prompt + generated tokens, which yields its next token;
                         the tokens already streamed to the client are not sent again

    kv cache usage = used blocks / kv_cache_blocks
    max context    = kv_cache_blocks * kv_block_tokens tokens: a request whose prompt plus max_tokens
                     exceeds it gets vLLM's 400; a drawn output length is cut to fit (finish "length")

Priority scheduling (``scheduling_policy="priority"``, vLLM's ``--scheduling-policy priority``; KV
model only; without the KV model it is accepted and changes nothing): a request may carry vLLM's
``"priority"`` (an integer, lower first, default 0). The
waiting queue is then ordered by (priority, arrival) instead of arrival alone, a preempted request
goes back in that order, and the preemption victim is the running request of the lowest priority
(latest arrival among equals). Under load, low-priority requests wait longer for their first token.
A non-zero priority sent to a pool without the policy gets vLLM's 400 ("Priority scheduling is not
enabled").

A preemption admits nobody by itself (vLLM schedules no waiting request in a step that preempted):
the next admission comes with the next request that finishes, leaves or arrives. Under this model
the non-streamed path paces its tokens one by one too, each interval with its own jitter (blocks
grow per token), instead of one draw for the whole decode.

Every duration is multiplied by a lognormal noise factor with mean 1 and sigma ``jitter`` (0 = none).
Prompt tokens are ``ceil(chars / 4)`` of the messages' text. Completion tokens are ``max_tokens``
(or ``max_completion_tokens``) when the request gives one ("exact" mode, finish_reason "length"),
otherwise drawn from a normal distribution clipped to [output_tokens_min, output_tokens_max]
(finish_reason "stop"); in "cap" mode the drawn length is only capped by ``max_tokens``.

Injected errors (``error_rate``, status picked from the ``error_mix`` weights) are answered at once,
before queueing, as OpenAI-style JSON errors with the header ``x-sim-injected-error: 1``.
``max_queue`` (0 = unbounded) turns away requests with a 503 when that many already wait for a slot.

Engine metrics (``GET /metrics``, Prometheus text format, one series per model with vLLM's labels
``model_name`` and ``engine="0"``; vLLM's names, types and bucket boundaries, measured as vLLM does,
in the simulator's own schedule, the "engine" time, which a client on a busy machine sees a little
later): gauges ``vllm:num_requests_running`` (holding a slot), ``vllm:num_requests_waiting``
(waiting for a slot or blocks, preempted ones too; not the fixed queueing delay, which is outside the
engine), ``vllm:kv_cache_usage_perc`` (a fraction 0..1; 0 without the KV model); counters
``vllm:num_preemptions``, ``vllm:prompt_tokens`` (a request's prompt once, at its first token),
``vllm:generation_tokens``, ``vllm:request_success`` (label ``finished_reason``); histograms
``vllm:time_to_first_token_seconds`` (arrival to first token, queueing included),
``vllm:inter_token_latency_seconds`` (one per token after the first), and at the last token
``vllm:e2e_request_latency_seconds`` (arrival to last token) and ``vllm:request_queue_time_seconds``
(waiting before first scheduled). Injected errors, 400s and 503s never reach the engine and count
nowhere; a client that leaves counts no success. Non-streamed replies without the KV model count
their tokens when the reply is sent.

Streamed responses send their headers together with the first token (so a client's time to headers
is the TTFT too) and coalesce tokens that are already due into one write, so with zero delays a
whole stream costs a couple of writes. Response headers carry ``x-sim-ttft-ms`` (the TTFT the
simulator intended, measured from arrival) and ``x-sim-queue-ms`` (time spent waiting for a slot).
A client that disconnects mid-request frees its slot at once.

Run it::

    python -m demo.simulator --port 8100 --prefill-ms 50 --decode-ms-per-token 20 --capacity 8
    python -m demo.simulator --port 8100 --instant            # every delay 0 (load tests)
    python -m demo.simulator --config sim.json                # SimulatorConfig.from_dict format
    python -m demo.simulator --capacity 16 --kv-cache-blocks 64 --kv-block-tokens 16   # KV-cache model

or in-process: ``with serve(SimulatorConfig.instant()) as sim: ... sim.url ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ModelProfile", "SimulatorConfig", "SimulatorApp", "SimulatorServer", "create_app", "serve", "main"]

MAX_BODY_BYTES = 8 * 1024 * 1024
_DUE_SLACK_S = 0.0005  # tokens due within this much of "now" go out in the current write


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass
class ModelProfile:
    """Per-model overrides: every field left at None inherits the :class:`SimulatorConfig` value."""

    queue_delay_ms: float | None = None
    prefill_ms: float | None = None
    prefill_ms_per_token: float | None = None
    decode_ms_per_token: float | None = None
    output_tokens_mean: float | None = None
    output_tokens_std: float | None = None
    output_tokens_min: int | None = None
    output_tokens_max: int | None = None
    max_tokens_mode: str | None = None
    error_rate: float | None = None
    error_mix: dict[int, float] | None = None
    capacity: int | None = None
    max_queue: int | None = None
    load_slowdown: float | None = None
    jitter: float | None = None
    kv_cache_blocks: int | None = None
    kv_block_tokens: int | None = None
    scheduling_policy: str | None = None


_PROFILE_FIELDS = tuple(f.name for f in fields(ModelProfile))


@dataclass
class SimulatorConfig:
    """Everything the simulator does; the profile fields are the defaults for every model."""

    queue_delay_ms: float = 20.0           # fixed delay before a request may take a slot (gateway, network)
    prefill_ms: float = 30.0               # fixed part of prefill
    prefill_ms_per_token: float = 0.05     # prefill time per prompt token
    decode_ms_per_token: float = 15.0      # time between output tokens at nominal speed
    output_tokens_mean: float = 150.0      # output length when the request gives no max_tokens
    output_tokens_std: float = 50.0
    output_tokens_min: int = 1
    output_tokens_max: int = 1024
    max_tokens_mode: str = "exact"         # "exact": max_tokens tokens; "cap": drawn length capped by it
    error_rate: float = 0.0                # probability of an injected error
    error_mix: dict[int, float] = field(default_factory=lambda: {500: 0.4, 429: 0.4, 503: 0.2})
    capacity: int = 64                     # concurrent requests served at full speed; 0 = unlimited
    max_queue: int = 0                     # waiting requests beyond which a 503 is returned; 0 = unbounded
    load_slowdown: float = 0.5             # decode slowdown at a full pool (see module docstring)
    jitter: float = 0.1                    # lognormal sigma of the noise on every duration; 0 = exact
    kv_cache_blocks: int = 0               # KV-cache blocks per pool (see module docstring); 0 = no KV model
    kv_block_tokens: int = 16              # tokens per KV-cache block (vLLM's default block size)
    scheduling_policy: str = "fcfs"        # "fcfs" or "priority" (vLLM's --scheduling-policy; KV model only)
    seed: int | None = None                # random seed (reproducible output lengths, texts, errors)
    default_model: str = "sim-gpt"         # listed by /v1/models beside ``models``
    models: dict[str, ModelProfile] = field(default_factory=dict)
    strict_models: bool = False            # 404 for models that are neither default_model nor in models

    def __post_init__(self):
        self.models = {name: (p if isinstance(p, ModelProfile) else ModelProfile(**p)) for name, p in self.models.items()}
        self.error_mix = _normalise_mix(self.error_mix)
        for name, override in self.models.items():
            if override.error_mix is not None:
                override.error_mix = _normalise_mix(override.error_mix)
            self.profile(name)  # validates the merged profile
        self.profile(None)

    @classmethod
    def instant(cls, **overrides) -> SimulatorConfig:
        """No delays, no jitter, no errors, unlimited capacity: for load tests and quick checks."""
        values = dict(queue_delay_ms=0.0, prefill_ms=0.0, prefill_ms_per_token=0.0, decode_ms_per_token=0.0,
                      error_rate=0.0, capacity=0, load_slowdown=0.0, jitter=0.0)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, data: dict) -> SimulatorConfig:
        """Build from a JSON-like dict (``models`` values are dicts of ModelProfile fields)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown simulator settings: {', '.join(sorted(unknown))}")
        values = dict(data)
        models = values.pop("models", None) or {}
        for name, override in models.items():
            if not isinstance(override, dict) or set(override) - set(_PROFILE_FIELDS):
                raise ValueError(f"model {name!r}: expected an object of {', '.join(_PROFILE_FIELDS)}")
        return cls(**values, models={name: ModelProfile(**override) for name, override in models.items()})

    def to_dict(self) -> dict:
        return asdict(self)

    def profile(self, model: str | None) -> ModelProfile:
        """The merged, validated profile of ``model`` (the defaults for None or an unknown model)."""
        override = self.models.get(model) if model is not None else None
        merged = {}
        for name in _PROFILE_FIELDS:
            value = getattr(override, name) if override is not None else None
            merged[name] = getattr(self, name) if value is None else value
        profile = ModelProfile(**merged)
        _validate(profile, model)
        return profile

    def saturation_rps(self, *, output_tokens: int, prompt_tokens: int = 0, model: str | None = None) -> float:
        """Completions per second that ``model``'s pool sustains with every slot busy: capacity /
        (prefill + (output_tokens - 1) decode intervals at a full pool's slowdown). The fixed
        queueing delay holds no slot, so it does not count; jitter has mean 1. The load tests'
        known saturation point; ``inf`` for unlimited capacity or zero service time. The KV-cache
        model, when on, may run fewer requests at once than the slots (blocks run out first): not
        counted here."""
        p = self.profile(model)
        service_ms = p.prefill_ms + p.prefill_ms_per_token * prompt_tokens
        if output_tokens > 1:
            slowdown = 1.0 + p.load_slowdown * (p.capacity - 1) / p.capacity if p.capacity else 1.0
            service_ms += (output_tokens - 1) * p.decode_ms_per_token * slowdown
        if not p.capacity or service_ms <= 0:
            return math.inf
        return p.capacity / (service_ms / 1000.0)

    def model_names(self) -> list[str]:
        return list(dict.fromkeys([self.default_model, *self.models]))


def _normalise_mix(mix) -> dict[int, float]:
    out = {}
    for status, weight in dict(mix).items():
        status = int(status)
        if not 400 <= status <= 599:
            raise ValueError(f"error_mix: {status} is not an HTTP error status")
        if float(weight) < 0:
            raise ValueError(f"error_mix: negative weight for {status}")
        if float(weight) > 0:
            out[status] = float(weight)
    return out


def _validate(p: ModelProfile, model: str | None) -> None:
    where = f"model {model!r}" if model else "simulator config"
    for name in ("queue_delay_ms", "prefill_ms", "prefill_ms_per_token", "decode_ms_per_token", "output_tokens_std",
                 "load_slowdown", "jitter"):
        if not (isinstance(getattr(p, name), (int, float)) and getattr(p, name) >= 0):
            raise ValueError(f"{where}: {name} must be a number >= 0")
    for name in ("capacity", "max_queue", "kv_cache_blocks"):
        if not (isinstance(getattr(p, name), int) and getattr(p, name) >= 0):
            raise ValueError(f"{where}: {name} must be an integer >= 0")
    if not (isinstance(p.kv_block_tokens, int) and p.kv_block_tokens >= 1):
        raise ValueError(f"{where}: kv_block_tokens must be an integer >= 1")
    if not (isinstance(p.output_tokens_min, int) and isinstance(p.output_tokens_max, int)
            and 1 <= p.output_tokens_min <= p.output_tokens_max):
        raise ValueError(f"{where}: need 1 <= output_tokens_min <= output_tokens_max")
    if not 0.0 <= p.error_rate <= 1.0:
        raise ValueError(f"{where}: error_rate must be within [0, 1]")
    if p.error_rate > 0 and not p.error_mix:
        raise ValueError(f"{where}: error_rate > 0 needs a non-empty error_mix")
    if p.max_tokens_mode not in ("exact", "cap"):
        raise ValueError(f"{where}: max_tokens_mode must be 'exact' or 'cap'")
    if p.scheduling_policy not in ("fcfs", "priority"):
        raise ValueError(f"{where}: scheduling_policy must be 'fcfs' or 'priority'")


# --------------------------------------------------------------------------------------------------
# Text: a small built-in vocabulary, pre-generated into one long corpus; a completion is a slice of it.

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which have not but all "
    "can more one will their has model data time when there these been would also each other into than "
    "system token latency request response trace span user prompt answer context result value first two "
    "number example question because output input process cache batch queue error rate service layer "
    "function method call stream chunk server client network memory compute agent tool retrieval "
    "embedding vector document search query score metric cost budget usage limit window step plan task "
    "reason check test run build deploy monitor observe measure improve simple fast small large "
    "important useful different possible likely however therefore instead usually often quickly"
).split()
_CORPUS_LEN = 4096


def _build_corpus(seed: int | None) -> list[tuple[str, bytes]]:
    rng = random.Random(f"corpus-{seed}")
    tokens: list[str] = []
    sentence = 0
    for _ in range(_CORPUS_LEN):
        if sentence == 0:
            tokens.append(" " + rng.choice(_WORDS).capitalize())
        else:
            tokens.append(" " + rng.choice(_WORDS))
        sentence += 1
        if sentence >= rng.randint(8, 18):
            tokens[-1] += "."
            sentence = 0
        elif rng.random() < 0.05:
            tokens[-1] += ","
    return [(t, json.dumps(t).encode()) for t in tokens]


# --------------------------------------------------------------------------------------------------
# Errors

_ERROR_BODIES = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided (simulated)."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist (simulated)."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests (simulated). Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request (simulated). Sorry about that!"),
    502: ("server_error", None, "Bad gateway (simulated)."),
    503: ("server_error", None, "The engine is currently overloaded (simulated), please try again later."),
    504: ("server_error", None, "Gateway timeout (simulated)."),
}


def _error_body(status: int, message: str | None = None, *, type_: str | None = None, param: str | None = None,
                code: str | None = None) -> bytes:
    default_type, default_code, default_message = _ERROR_BODIES.get(
        status, ("invalid_request_error" if status < 500 else "server_error", None, f"Simulated error {status}."))
    return json.dumps({"error": {"message": message or default_message, "type": type_ or default_type,
                                 "param": param, "code": code if code is not None else default_code}}).encode()


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


# --------------------------------------------------------------------------------------------------
# The application

_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no")]


# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py, PrometheusStatLogger), so that percentiles an
# engine dashboard reads from these histograms come out as they would from vLLM.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                            240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM creates one request_success series per finish reason up front (FINISH_REASON_STRINGS), so a
# scraper sees them at 0 before the first request; the simulator only ever finishes with stop or length.
_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
_ENGINE = "0"  # vLLM's ``engine`` label: the index of the engine core (one here)


class _ModelMetrics:
    """The series of one model name (bound children: the hot path does no label lookups)."""

    __slots__ = ("ttft", "itl", "e2e", "queue", "prompt_tokens", "generation_tokens", "preemptions", "success")

    def __init__(self, engine: _EngineMetrics, model: str):
        labels = (model, _ENGINE)
        self.ttft = engine.ttft.labels(*labels)
        self.itl = engine.itl.labels(*labels)
        self.e2e = engine.e2e.labels(*labels)
        self.queue = engine.queue.labels(*labels)
        self.prompt_tokens = engine.prompt_tokens.labels(*labels)
        self.generation_tokens = engine.generation_tokens.labels(*labels)
        self.preemptions = engine.preemptions.labels(*labels)
        self.success = {reason: engine.success.labels(*labels, reason) for reason in _FINISH_REASONS}
        for gauge in (engine.running, engine.waiting, engine.kv_usage):
            gauge.labels(*labels)  # present (at 0) before the first scrape sets it

    def finished(self, finish_reason: str, e2e: float, queue: float) -> None:
        """A request's last token: vLLM records its success and its request-level latencies then."""
        self.success[finish_reason].inc()
        self.e2e.observe(max(0.0, e2e))
        self.queue.observe(max(0.0, queue))


class _EngineMetrics:
    """vLLM's V1-engine metrics in the app's own registry: several simulators may run in one process
    (tests), so never prometheus_client's global default registry."""

    def __init__(self):
        self.registry = registry = CollectorRegistry(auto_describe=True)
        labels = ("model_name", "engine")
        self.running = Gauge("vllm:num_requests_running", "Requests running: holding a slot (and KV-cache blocks).",
                             labels, registry=registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled (preempted ones too).",
                             labels, registry=registry)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage: used blocks / blocks; 1 means 100 percent.",
                              labels, registry=registry)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemptions.", labels,
                                   registry=registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill (prompt) tokens processed.", labels,
                                     registry=registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
                                         registry=registry)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               (*labels, "finished_reason"), registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token (from arrival) in seconds.",
                              labels, buckets=_TTFT_BUCKETS, registry=registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", labels,
                             buckets=_ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", labels,
                             buckets=_REQUEST_LATENCY_BUCKETS, registry=registry)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time spent waiting before first scheduled, in "
                               "seconds.", labels, buckets=_REQUEST_LATENCY_BUCKETS, registry=registry)
        self._models: dict[str, _ModelMetrics] = {}

    def model(self, name: str) -> _ModelMetrics:
        if name not in self._models:
            self._models[name] = _ModelMetrics(self, name)
        return self._models[name]

    def render(self, pools) -> bytes:
        """The exposition, gauges read from the pools now (two pools may share a model name: the
        default one serves every unlisted name under ``default_model``)."""
        totals: dict[str, list[int]] = {}
        for pool in pools:
            t = totals.setdefault(pool.model_name, [0, 0, 0, 0])
            t[0] += pool.active
            t[1] += pool.waiting
            t[2] += pool.used
            t[3] += pool.blocks
        for name, (running, waiting, used, blocks) in totals.items():
            self.running.labels(name, _ENGINE).set(running)
            self.waiting.labels(name, _ENGINE).set(waiting)
            self.kv_usage.labels(name, _ENGINE).set(used / blocks if blocks else 0.0)
        return generate_latest(self.registry)


class _Seq:
    """A request in a pool with a KV cache: its tokens, the blocks it holds, and whether it runs."""

    __slots__ = ("prompt_tokens", "generated", "blocks", "running", "ready", "admissions", "admitted_loop",
                 "admitted_perf", "gone", "priority", "order")

    def __init__(self, prompt_tokens: int, priority: int = 0, order: int = 0):
        self.prompt_tokens = prompt_tokens
        self.priority = priority     # vLLM's request priority: lower is scheduled first (priority policy)
        self.order = order           # arrival order in its pool (ties between equal priorities)
        self.generated = 0           # tokens generated so far (and sent, when streamed)
        self.blocks = 0              # KV-cache blocks held (0 while waiting)
        self.running = False
        self.ready: asyncio.Future | None = None  # resolved when admitted; a new one after each preemption
        self.admissions = 0          # times admitted: a sleeping decode loop notices it was preempted
        self.admitted_loop = self.admitted_perf = 0.0  # the last admission, on the loop's clock and perf_counter
        self.gone = False


class _Pool:
    """The slots of one model (or of every model without its own profile), and its KV-cache blocks.

    Without a KV cache (``blocks`` 0) a semaphore hands out the slots. With one, :meth:`kv_admit`
    schedules: strict arrival order, a slot and the blocks for the prompt free; :meth:`kv_grow` gives
    a decoding request its next block, preempting the newest running request when none is free."""

    __slots__ = ("capacity", "max_queue", "sem", "active", "waiting", "model_name", "metrics", "blocks",
                 "block_tokens", "_used", "running", "queue", "preemptions", "loop", "priority", "arrivals",
                 "_busy", "_since", "_block_s", "_used_since")

    def __init__(self, capacity: int, max_queue: int, model_name: str, metrics: _ModelMetrics, blocks: int = 0,
                 block_tokens: int = 16, scheduling_policy: str = "fcfs"):
        self.capacity, self.max_queue = capacity, max_queue
        self.priority = scheduling_policy == "priority"  # KV model: admit by (priority, arrival), not arrival
        self.arrivals = 0
        self._busy = 0.0                 # seconds with at least one request running, up to _since
        self._since = time.monotonic()
        self._block_s = 0.0              # KV-cache block-seconds held, up to _used_since
        self._used_since = self._since
        self._used = 0
        self.model_name, self.metrics = model_name, metrics
        self.blocks, self.block_tokens = blocks, block_tokens
        self.sem: asyncio.Semaphore | None = None
        self.active = 0                  # requests holding a slot (running)
        self.waiting = 0                 # requests waiting for a slot (or blocks)
        self.running: list[_Seq] = []    # KV model: running requests in the order they were (re)admitted
        self.queue: deque[_Seq] = deque()  # KV model: waiting requests, the next to admit first
        self.preemptions = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    def reset(self, loop: asyncio.AbstractEventLoop):
        # Semaphores bind to the event loop that first uses them: a fresh one per server start.
        self.sem = asyncio.Semaphore(self.capacity) if self.capacity and not self.blocks else None
        self.active = self.waiting = self.used = 0
        self.running, self.queue, self.loop = [], deque(), loop
        self._since = self._used_since = time.monotonic()

    def mark(self) -> None:
        """Call before ``active`` changes: accrues the busy time (a request running) until now."""
        now = time.monotonic()
        if self.active > 0:
            self._busy += now - self._since
        self._since = now

    @property
    def used(self) -> int:
        """KV-cache blocks held by running requests."""
        return self._used

    @used.setter
    def used(self, blocks: int) -> None:
        now = time.monotonic()
        self._block_s += self._used * (now - self._used_since)
        self._used, self._used_since = blocks, now

    def block_seconds(self) -> float:
        """KV-cache block-seconds held so far: over an interval, their increase / its length / the
        blocks is the cache's mean usage (the demo's simulated GPU memory, demo.gpus)."""
        return self._block_s + self._used * (time.monotonic() - self._used_since)

    def busy_seconds(self) -> float:
        """Seconds so far in which at least one request was running (prefilling or decoding): the
        simulated GPU's "a kernel ran" time, the demo's NVML utilisation (demo.gpus)."""
        return self._busy + (time.monotonic() - self._since if self.active > 0 else 0.0)

    def _key(self, seq: _Seq) -> tuple[int, int]:
        return (seq.priority, seq.order)

    def _queue_insert(self, seq: _Seq, front: bool) -> None:
        """FCFS: at the back (a new request) or the front (a preempted one). Priority: by (priority,
        arrival), as vLLM's priority scheduler orders its waiting queue (a preempted request too)."""
        if not self.priority:
            if front:
                self.queue.appendleft(seq)
            else:
                self.queue.append(seq)
            return
        key = self._key(seq)
        for i, other in enumerate(self.queue):
            if self._key(other) > key:
                self.queue.insert(i, seq)
                return
        self.queue.append(seq)

    @property
    def max_context(self) -> int:
        """Tokens a single request may have (prompt + output): the whole KV cache, as vLLM's
        max_model_len may be at most."""
        return self.blocks * self.block_tokens

    def kv_enqueue(self, seq: _Seq) -> None:
        seq.ready = self.loop.create_future()
        self.arrivals += 1
        seq.order = self.arrivals
        self._queue_insert(seq, front=False)
        self.waiting += 1
        self.kv_admit()

    def kv_admit(self) -> None:
        """Admit waiting requests in order while a slot and the blocks for the head's tokens are free
        (vLLM's FCFS scheduler: the head of the queue holds back those behind it; with the priority
        policy the queue's order is by priority first, so a premium request overtakes free ones)."""
        queue, bt = self.queue, self.block_tokens
        while queue:
            if self.capacity and self.active >= self.capacity:
                return
            seq = queue[0]
            need = -(-(seq.prompt_tokens + seq.generated) // bt)
            if self.used + need > self.blocks:
                return
            queue.popleft()
            self.waiting -= 1
            self.used += need
            seq.blocks = need
            self.running.append(seq)
            self.mark()
            self.active += 1
            seq.running = True
            seq.admissions += 1
            seq.admitted_loop, seq.admitted_perf = self.loop.time(), time.perf_counter()
            if not seq.ready.done():
                seq.ready.set_result(None)

    def kv_grow(self, seq: _Seq) -> bool:
        """Blocks for ``seq``'s next token; False when it had to preempt ``seq`` itself to find none."""
        need = -(-(seq.prompt_tokens + seq.generated + 1) // self.block_tokens)
        extra = need - seq.blocks
        if extra <= 0:
            return True
        while self.used + extra > self.blocks:
            # FCFS: the most recently admitted (vLLM's FCFS preemption order); priority: the lowest
            # priority, latest arrival among them (vLLM's priority policy)
            victim = max(self.running, key=self._key) if self.priority else self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        self.used += extra
        seq.blocks = need
        return True

    def _preempt(self, seq: _Seq) -> None:
        """vLLM's recompute preemption: the blocks are freed, the request waits at the front."""
        self.running.remove(seq)
        self.mark()
        self.active -= 1
        self.used -= seq.blocks
        seq.blocks = 0
        seq.running = False
        seq.ready = self.loop.create_future()
        self._queue_insert(seq, front=True)
        self.waiting += 1
        self.preemptions += 1
        self.metrics.preemptions.inc()

    def kv_leave(self, seq: _Seq) -> None:
        """``seq`` is finished or gone: its slot and blocks go to the next in line (idempotent)."""
        if seq.gone:
            return
        seq.gone = True
        if seq.running:
            self.running.remove(seq)
            self.mark()
            self.active -= 1
            self.used -= seq.blocks
            seq.blocks = 0
            seq.running = False
        elif seq.ready is not None:
            try:
                self.queue.remove(seq)
                self.waiting -= 1
            except ValueError:
                pass
        self.kv_admit()


class _Stats:
    __slots__ = ("started", "requests", "in_flight", "completed", "errors", "errors_by_status", "rejected",
                 "disconnects", "streamed", "prompt_tokens", "completion_tokens")

    def __init__(self):
        self.started = time.time()
        self.requests = self.in_flight = self.completed = self.errors = self.rejected = 0
        self.disconnects = self.streamed = self.prompt_tokens = self.completion_tokens = 0
        self.errors_by_status: dict[int, int] = {}


class _Request:
    """One parsed chat completion request."""

    __slots__ = ("model", "stream", "include_usage", "max_tokens", "prompt_tokens", "priority")

    def __init__(self, model, stream, include_usage, max_tokens, prompt_tokens, priority=0):
        self.model, self.stream, self.include_usage = model, stream, include_usage
        self.max_tokens, self.prompt_tokens, self.priority = max_tokens, prompt_tokens, priority


class _Disconnect:
    """Cancels the handler when the client goes away, so that its slot is freed at once."""

    __slots__ = ("task", "watcher", "fired", "done")

    def __init__(self, receive):
        self.task = asyncio.current_task()
        self.fired = False
        self.done = False
        self.watcher = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        if not self.done:
            self.fired = True
            self.task.cancel()

    def close(self):
        self.done = True
        self.watcher.cancel()


class SimulatorApp:
    """The ASGI application. ``stats()`` gives the counters that ``GET /stats`` serves."""

    def __init__(self, config: SimulatorConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self._corpus = _build_corpus(config.seed)
        self._profiles: dict[str, ModelProfile] = {name: config.profile(name) for name in config.models}
        self._default_profile = config.profile(None)
        self._engine = _EngineMetrics()
        self._default_pool = self._new_pool(config.default_model, self._default_profile)
        self._pools = {name: self._new_pool(name, p) for name, p in self._profiles.items()}
        self._known_models = set(config.model_names())
        self._stats = _Stats()
        self._id_prefix = "chatcmpl-sim" + os.urandom(4).hex()
        self._next_id = 0
        self._models_body = json.dumps({"object": "list", "data": [
            {"id": name, "object": "model", "created": int(self._stats.started), "owned_by": "tracedash-simulator"}
            for name in config.model_names()]}).encode()
        self._loop = None

    def _new_pool(self, model: str, profile: ModelProfile) -> _Pool:
        return _Pool(profile.capacity, profile.max_queue, model, self._engine.model(model), profile.kv_cache_blocks,
                     profile.kv_block_tokens, profile.scheduling_policy)

    # ---- ASGI entry

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "http":
            loop = asyncio.get_running_loop()
            if loop is not self._loop:  # first request on this loop (servers started without lifespan)
                self._bind_loop(loop)
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._bind_loop(asyncio.get_running_loop())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    def _bind_loop(self, loop):
        self._loop = loop
        for pool in (self._default_pool, *self._pools.values()):
            pool.reset(loop)

    async def _http(self, scope, receive, send):
        path, method = scope["path"], scope["method"]
        if path == "/v1/chat/completions" or path == "/chat/completions":
            if method != "POST":
                return await _send_json(send, 405, _error_body(405, "Method not allowed; use POST."))
            return await self._chat(receive, send)
        if method not in ("GET", "HEAD"):
            if path in ("/v1/models", "/health", "/stats", "/metrics"):
                return await _send_json(send, 405, _error_body(405, "Method not allowed; use GET."))
        elif path == "/health":
            return await _send_json(send, 200, b'{"status":"ok"}')
        elif path == "/v1/models" or path == "/models":
            return await _send_json(send, 200, self._models_body)
        elif path == "/stats":
            return await _send_json(send, 200, json.dumps(self.stats()).encode())
        elif path == "/metrics":
            body = self.metrics()
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})
        await _send_json(send, 404, _error_body(404, f"Unknown path {path}.", code="unknown_url"))

    def metrics(self) -> bytes:
        """The Prometheus exposition that ``GET /metrics`` serves."""
        return self._engine.render((self._default_pool, *self._pools.values()))

    def stats(self) -> dict:
        s = self._stats
        pools = (self._default_pool, *self._pools.values())
        blocks, used = sum(p.blocks for p in pools), sum(p.used for p in pools)
        return {
            "requests": s.requests,
            "in_flight": s.in_flight,
            "queued": sum(p.waiting for p in pools),
            "active": sum(p.active for p in pools),
            "completed": s.completed,
            "streamed": s.streamed,
            "errors": s.errors,
            "errors_by_status": {str(k): v for k, v in sorted(s.errors_by_status.items())},
            "rejected": s.rejected,
            "disconnects": s.disconnects,
            "tokens": {"prompt": s.prompt_tokens, "completion": s.completion_tokens,
                       "total": s.prompt_tokens + s.completion_tokens},
            "kv_cache": {"blocks": blocks, "used": used, "usage": round(used / blocks, 4) if blocks else 0.0},
            "preemptions": sum(p.preemptions for p in pools),
            "uptime_s": round(time.time() - s.started, 3),
            "models": self.model_stats(),
        }

    def model_stats(self) -> dict[str, dict]:
        """Per model name (the pools serving it added up): requests running and waiting, KV-cache
        blocks used of all, ``kv_block_s``, the block-seconds held so far, and ``busy_s``, the seconds
        in which at least one request ran (the demo's simulated GPUs read their utilisation and
        memory from this, demo.gpus)."""
        out: dict[str, dict] = {}
        for pool in (self._default_pool, *self._pools.values()):
            m = out.setdefault(pool.model_name, {"running": 0, "waiting": 0, "kv_blocks": 0, "kv_used": 0,
                                                 "kv_block_s": 0.0, "busy_s": 0.0, "preemptions": 0})
            m["running"] += pool.active
            m["waiting"] += pool.waiting
            m["kv_blocks"] += pool.blocks
            m["kv_used"] += pool.used
            m["kv_block_s"] += pool.block_seconds()
            m["busy_s"] += pool.busy_seconds()
            m["preemptions"] += pool.preemptions
        for m in out.values():
            m["kv_usage"] = round(m["kv_used"] / m["kv_blocks"], 4) if m["kv_blocks"] else 0.0
            m["busy_s"] = round(m["busy_s"], 4)
            m["kv_block_s"] = round(m["kv_block_s"], 4)
        return out

    # ---- chat completions

    async def _chat(self, receive, send):
        stats = self._stats
        stats.requests += 1
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                stats.disconnects += 1
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                stats.rejected += 1
                return await _send_json(send, 413, _error_body(413, "Request body too large."))
        try:
            request = self._parse(body)
        except _BadRequest as bad:
            stats.rejected += 1
            return await _send_json(send, bad.status, _error_body(bad.status, bad.message, param=bad.param, code=bad.code))

        profile = self._profiles.get(request.model, self._default_profile)
        pool = self._pools.get(request.model, self._default_pool)
        if request.priority and not pool.priority:
            stats.rejected += 1  # vLLM's answer to a priority its scheduler does not use
            return await _send_json(send, 400, _error_body(400, (
                f"Got priority {request.priority} but Priority scheduling is not enabled."), param="priority"))
        if pool.blocks:
            # vLLM's check (max_model_len, at most what the KV cache holds): prompt + max_tokens must fit.
            limit, wanted = pool.max_context, request.prompt_tokens + (request.max_tokens or 1)
            if wanted > limit:
                stats.rejected += 1
                return await _send_json(send, 400, _error_body(400, (
                    f"This model's maximum context length is {limit} tokens. However, you requested {wanted} tokens "
                    f"({request.prompt_tokens} in the messages, {wanted - request.prompt_tokens} in the completion). "
                    "Please reduce the length of the messages or completion."), param="messages"))
        rng = self.rng
        if profile.error_rate and rng.random() < profile.error_rate:
            status = rng.choices(list(profile.error_mix), weights=list(profile.error_mix.values()))[0]
            return await self._inject_error(send, status)
        if pool.max_queue and pool.waiting >= pool.max_queue and (pool.blocks or (pool.sem is not None
                                                                                   and pool.sem.locked())):
            return await self._inject_error(send, 503, injected=False)

        n, finish_reason = self._completion_length(profile, request.max_tokens)
        if pool.blocks and request.prompt_tokens + n > pool.max_context:
            n, finish_reason = pool.max_context - request.prompt_tokens, "length"  # as vLLM stops at max_model_len
        jitter = profile.jitter
        queue_delay = profile.queue_delay_ms / 1000.0
        prefill = (profile.prefill_ms + profile.prefill_ms_per_token * request.prompt_tokens) / 1000.0
        if jitter:
            queue_delay *= self._noise(jitter)
            prefill *= self._noise(jitter)
        loop = self._loop
        t0 = time.perf_counter()  # headers report perf_counter spans (uvloop's clock has 1 ms steps)
        stats.in_flight += 1
        stats.prompt_tokens += request.prompt_tokens
        # Only requests that will wait for something get a disconnect watcher (an extra task each); under
        # the KV model any request may be preempted and wait, so every one does.
        watch = (_Disconnect(receive) if pool.blocks
                 or queue_delay + prefill + (n - 1) * profile.decode_ms_per_token / 1000.0 > 0.02
                 or (pool.sem is not None and pool.sem.locked()) else None)
        acquired = False
        seq = None
        try:
            if queue_delay:
                await asyncio.sleep(queue_delay)
            t_queue = time.perf_counter()
            if pool.blocks:
                if request.stream:
                    stats.streamed += 1
                seq = _Seq(request.prompt_tokens, request.priority)
                await self._generate_kv(send, request, profile, pool, seq, n, finish_reason, prefill, t0, t_queue,
                                        watch)
            else:
                if pool.sem is not None:
                    if pool.sem.locked():
                        pool.waiting += 1
                        try:
                            await pool.sem.acquire()
                        finally:
                            pool.waiting -= 1
                    else:
                        await pool.sem.acquire()
                acquired = True
                pool.mark()
                pool.active += 1
                t_slot = time.perf_counter()
                l_slot = loop.time()
                t_first = l_slot + prefill
                origin = l_slot - (t_slot - t0)  # the arrival on the loop's clock: engine times are spans from it
                timing = [(b"x-sim-ttft-ms", b"%.1f" % ((t_slot - t0 + prefill) * 1000.0)),
                          (b"x-sim-queue-ms", b"%.1f" % ((t_slot - t_queue) * 1000.0))]
                if request.stream:
                    stats.streamed += 1
                    await self._stream(send, request, profile, pool, n, finish_reason, t_first, origin,
                                       t_slot - t_queue, timing, watch)
                else:
                    await self._complete(send, request, profile, pool, n, finish_reason, t_first, origin,
                                         t_slot - t_queue, timing, watch)
            stats.completed += 1
        except asyncio.CancelledError:
            if watch is None or not watch.fired:
                raise
            asyncio.current_task().uncancel()
            stats.disconnects += 1
        finally:
            if watch is not None:
                watch.close()
            if seq is not None:
                pool.kv_leave(seq)
            if acquired:
                pool.mark()
                pool.active -= 1
                if pool.sem is not None:
                    pool.sem.release()
            stats.in_flight -= 1

    def _parse(self, body: bytes) -> _Request:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest("We could not parse the JSON body of your request. (HINT: This likely means you "
                              "aren't using your HTTP library correctly.)") from None
        if not isinstance(data, dict):
            raise _BadRequest("The request body must be a JSON object.")
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise _BadRequest("you must provide a model parameter", "model")
        if self.config.strict_models and model not in self._known_models:
            raise _BadRequest(f"The model `{model}` does not exist or you do not have access to it.", "model",
                              status=404, code="model_not_found")
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' must be a non-empty array of message objects.", "messages")
        chars = 0
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _BadRequest(f"Invalid value for 'messages[{i}]': expected an object with a 'role'.",
                                  f"messages[{i}]")
            content = message.get("content")
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        chars += len(part["text"])
            elif content is not None:
                raise _BadRequest(f"Invalid type for 'messages[{i}].content'.", f"messages[{i}].content")
        max_tokens = data.get("max_completion_tokens")
        param = "max_completion_tokens"
        if max_tokens is None:
            max_tokens, param = data.get("max_tokens"), "max_tokens"
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
            raise _BadRequest(f"Invalid '{param}': expected an integer >= 1.", param)
        stream = data.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise _BadRequest("Invalid type for 'stream': expected a boolean.", "stream")
        options = data.get("stream_options")
        include_usage = False
        if options is not None:
            if not stream:
                raise _BadRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                  "stream_options")
            if not isinstance(options, dict):
                raise _BadRequest("Invalid type for 'stream_options': expected an object.", "stream_options")
            include_usage = bool(options.get("include_usage"))
        priority = data.get("priority", 0)
        if priority is None:
            priority = 0
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise _BadRequest("Invalid type for 'priority': expected an integer.", "priority")
        return _Request(model, bool(stream), include_usage, max_tokens, max(1, (chars + 3) // 4), priority)

    def _completion_length(self, profile: ModelProfile, max_tokens: int | None) -> tuple[int, str]:
        if max_tokens is not None and profile.max_tokens_mode == "exact":
            return max_tokens, "length"
        mean, std = profile.output_tokens_mean, profile.output_tokens_std
        natural = int(round(self.rng.gauss(mean, std))) if std else int(round(mean))
        natural = min(max(natural, profile.output_tokens_min), profile.output_tokens_max)
        if max_tokens is not None and natural >= max_tokens:
            return max_tokens, "length"
        return natural, "stop"

    def _noise(self, sigma: float) -> float:
        """Lognormal factor with mean 1."""
        return math.exp(sigma * self.rng.gauss(0.0, 1.0) - 0.5 * sigma * sigma)

    def _interval(self, profile: ModelProfile, pool: _Pool) -> float:
        """Seconds until the next token, given the load right now."""
        seconds = profile.decode_ms_per_token / 1000.0
        if profile.load_slowdown and pool.capacity and pool.active > 1:
            seconds *= 1.0 + profile.load_slowdown * (pool.active - 1) / pool.capacity
        if profile.jitter:
            seconds *= self._noise(profile.jitter)
        return seconds

    def _tokens(self, n: int) -> list[tuple[str, bytes]]:
        corpus = self._corpus
        start = self.rng.randrange(len(corpus))
        out = corpus[start:start + n]
        while len(out) < n:
            out += corpus[:n - len(out)]
        return out

    def _new_id(self) -> str:
        self._next_id += 1
        return f"{self._id_prefix}{self._next_id:010d}"

    async def _inject_error(self, send, status: int, injected: bool = True):
        self._stats.errors += 1
        self._stats.errors_by_status[status] = self._stats.errors_by_status.get(status, 0) + 1
        headers = [(b"x-sim-injected-error", b"1" if injected else b"0")]
        if status in (429, 503):
            headers.append((b"retry-after", b"1"))
        await _send_json(send, status, _error_body(status), headers)

    def _completion_body(self, request: _Request, n: int, finish_reason: str) -> bytes:
        tokens = self._tokens(n)
        text = "".join(t for t, _ in tokens).lstrip()
        return json.dumps({
            "id": self._new_id(), "object": "chat.completion", "created": int(time.time()), "model": request.model,
            "system_fingerprint": "fp_sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": request.prompt_tokens, "completion_tokens": n,
                      "total_tokens": request.prompt_tokens + n},
        }).encode()

    async def _complete(self, send, request, profile, pool, n, finish_reason, t_first, origin, queue_s, timing, watch):
        loop = self._loop
        decode = 0.0
        if n > 1 and profile.decode_ms_per_token:
            seconds = profile.decode_ms_per_token / 1000.0
            if profile.load_slowdown and pool.capacity and pool.active > 1:
                seconds *= 1.0 + profile.load_slowdown * (pool.active - 1) / pool.capacity
            decode = (n - 1) * seconds
            if profile.jitter:  # one draw for the sum of n - 1 intervals: sigma shrinks like 1/sqrt(n - 1)
                decode *= self._noise(profile.jitter / math.sqrt(n - 1))
        delay = t_first + decode - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        body = self._completion_body(request, n, finish_reason)
        self._stats.completion_tokens += n
        # Counted now, when the reply is sent (nothing woke up at each token in between).
        m = pool.metrics
        m.ttft.observe(t_first - origin)
        m.prompt_tokens.inc(request.prompt_tokens)
        m.generation_tokens.inc(n)
        if n > 1:
            observe, gap = m.itl.observe, decode / (n - 1)
            for _ in range(n - 1):
                observe(gap)
        m.finished(finish_reason, t_first + decode - origin, queue_s)
        if watch is not None:
            watch.done = True
        await _send_json(send, 200, body, timing)

    async def _stream(self, send, request, profile, pool, n, finish_reason, t_first, origin, queue_s, timing, watch):
        loop = self._loop
        stats = self._stats
        m = pool.metrics
        delay = t_first - loop.time()
        while delay > _DUE_SLACK_S:
            await asyncio.sleep(delay)
            delay = t_first - loop.time()
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + timing})

        chunks = _Chunks(self._new_id(), request)
        parts = [chunks.opening()]
        tokens = self._tokens(n)
        first = json.dumps(tokens[0][0].lstrip()).encode()
        prefix, suffix = chunks.prefix, chunks.suffix
        m.ttft.observe(t_first - origin)
        m.prompt_tokens.inc(request.prompt_tokens)
        itl = m.itl.observe
        decode = profile.decode_ms_per_token
        due = t_first
        gap = 0.0
        i = 0
        while True:
            now = loop.time()
            if due - now > _DUE_SLACK_S:
                await asyncio.sleep(due - now)
                continue
            sent = i
            while i < n and due - now <= _DUE_SLACK_S:
                parts.append(prefix + (first if i == 0 else tokens[i][1]) + suffix)
                if i:
                    itl(gap)
                i += 1
                if decode and i < n:
                    gap = self._interval(profile, pool)
                    due += gap
            stats.completion_tokens += i - sent
            m.generation_tokens.inc(i - sent)
            if i < n:
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                parts = []
                continue
            m.finished(finish_reason, due - origin, queue_s)
            parts.extend(chunks.closing(finish_reason, n))
            if watch is not None:
                watch.done = True
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
            return

    async def _generate_kv(self, send, request, profile, pool, seq, n, finish_reason, prefill, t0, t_queue, watch):
        """One completion under the KV-cache model (module docstring): wait to be admitted, prefill,
        then one token at a time, each new block taken from the free ones or by preempting. A stream
        sends its tokens as they come, coalescing those already due like :meth:`_stream`; preempted,
        it sends what it has and waits to be admitted again, then pays prefill over prompt + generated
        tokens. ``prefill`` is the first prefill's duration (jitter drawn); re-prefills draw their own."""
        loop = self._loop
        stats = self._stats
        m = pool.metrics
        itl = m.itl.observe
        decode = profile.decode_ms_per_token
        chunks = tokens = first = None
        parts: list[bytes] = []
        started = False
        timing: list = []
        queue_s = None
        origin = last = 0.0
        pool.kv_enqueue(seq)
        while True:
            while not seq.running:
                await seq.ready
            epoch = seq.admissions
            origin = seq.admitted_loop - (seq.admitted_perf - t0)  # the arrival on the loop's clock
            if queue_s is None:
                queue_s = seq.admitted_perf - t_queue
            else:  # a re-admission after a preemption: recompute prompt + generated tokens
                prefill = (profile.prefill_ms + profile.prefill_ms_per_token * (seq.prompt_tokens + seq.generated)
                           ) / 1000.0
                if profile.jitter:
                    prefill *= self._noise(profile.jitter)
            due = seq.admitted_loop + prefill
            while seq.running and seq.admissions == epoch and seq.generated < n:
                now = loop.time()
                if due - now > _DUE_SLACK_S:
                    if parts:
                        started = await self._flush(send, parts, started, timing)
                        parts = []
                    else:
                        await asyncio.sleep(due - now)
                    continue  # the state may have changed meanwhile: preempted, or preempted and re-admitted
                if not pool.kv_grow(seq):
                    break  # no block for this token, and the newest request was this one: it waits again
                i = seq.generated
                seq.generated = i + 1
                if i == 0:
                    m.ttft.observe(max(0.0, due - origin))
                    m.prompt_tokens.inc(seq.prompt_tokens)
                    timing = [(b"x-sim-ttft-ms", b"%.1f" % ((due - origin) * 1000.0)),
                              (b"x-sim-queue-ms", b"%.1f" % (queue_s * 1000.0))]
                    if request.stream:
                        chunks = _Chunks(self._new_id(), request)
                        parts.append(chunks.opening())
                        tokens = self._tokens(n)
                        first = json.dumps(tokens[0][0].lstrip()).encode()
                else:
                    itl(due - last)
                last = due
                stats.completion_tokens += 1
                m.generation_tokens.inc()
                if chunks is not None:
                    parts.append(chunks.prefix + (first if i == 0 else tokens[i][1]) + chunks.suffix)
                if decode and i + 1 < n:
                    due += self._interval(profile, pool)
            if seq.generated >= n:
                break
            if parts:  # preempted: out goes what it generated before waiting
                started = await self._flush(send, parts, started, timing)
                parts = []
        pool.kv_leave(seq)  # the engine is done with it: its slot and blocks go to the next in line
        m.finished(finish_reason, last - origin, queue_s)
        if watch is not None:
            watch.done = True
        if request.stream:
            parts.extend(chunks.closing(finish_reason, n))
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + timing})
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
        else:
            await _send_json(send, 200, self._completion_body(request, n, finish_reason), timing)

    @staticmethod
    async def _flush(send, parts: list[bytes], started: bool, timing: list) -> bool:
        """Send a stream's pending chunks (its headers first, with the first ones); True: started."""
        if not started:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + timing})
        await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
        return True


class _Chunks:
    """The SSE framing of one streamed completion, built once so that a token costs one concatenation."""

    __slots__ = ("head", "tail", "prefix", "suffix", "include_usage", "prompt_tokens")

    def __init__(self, completion_id: str, request: _Request):
        self.head = (b'data: {"id":"' + completion_id.encode() + b'","object":"chat.completion.chunk","created":'
                     + str(int(time.time())).encode() + b',"model":' + json.dumps(request.model).encode()
                     + b',"system_fingerprint":"fp_sim","choices":[')
        self.tail = b',"usage":null}\n\n' if request.include_usage else b"}\n\n"
        self.prefix = self.head + b'{"index":0,"delta":{"content":'
        self.suffix = b'},"logprobs":null,"finish_reason":null}]' + self.tail
        self.include_usage, self.prompt_tokens = request.include_usage, request.prompt_tokens

    def opening(self) -> bytes:
        return (self.head + b'{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,'
                b'"finish_reason":null}]' + self.tail)

    def closing(self, finish_reason: str, n: int) -> list[bytes]:
        parts = [self.head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"' + finish_reason.encode()
                 + b'"}]' + self.tail]
        if self.include_usage:
            parts.append(self.head + b'],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                         % (self.prompt_tokens, n, self.prompt_tokens + n))
        parts.append(b"data: [DONE]\n\n")
        return parts


async def _send_json(send, status: int, body: bytes, extra_headers=()):
    headers = _JSON_HEADERS + [(b"content-length", str(len(body)).encode())]
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(config: SimulatorConfig | None = None) -> SimulatorApp:
    """The ASGI application for ``config`` (defaults: SimulatorConfig())."""
    return SimulatorApp(config if config is not None else SimulatorConfig())


# --------------------------------------------------------------------------------------------------
# Running it


class SimulatorServer:
    """A simulator served by uvicorn in a background thread; use as a context manager or call stop()."""

    def __init__(self, app: SimulatorApp, server, thread: threading.Thread, sock: socket.socket, host: str):
        self.app, self.config = app, app.config
        self._server, self._thread, self._sock = server, thread, sock
        self.host = host
        self.port: int = sock.getsockname()[1]
        url_host = f"[{host}]" if ":" in host else host
        self.url = f"http://{url_host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI client's ``base_url`` (``.../v1``)."""
        return self.url + "/v1"

    def stats(self) -> dict:
        return self.app.stats()

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        try:
            self._sock.close()
        except OSError:
            pass
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _uvicorn_config(app, log_level: str | None, access_log: bool, own_logging: bool):
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    return uvicorn.Config(app, lifespan="on", log_level=log_level, access_log=access_log, ws="none",
                          log_config=LOGGING_CONFIG if own_logging else None,
                          server_header=False, backlog=4096, timeout_graceful_shutdown=2)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve(config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0, *,
          log_level: str | None = None, startup_timeout: float = 15.0) -> SimulatorServer:
    """Start the simulator on ``host:port`` (0 = a free port) in a background thread; returns once it
    accepts connections. The host process's logging is left alone (uvicorn's loggers propagate to
    it); ``log_level`` sets the level of uvicorn's loggers."""
    import uvicorn

    app = create_app(config)
    sock = _bind(host, port)
    server = uvicorn.Server(_uvicorn_config(app, log_level, access_log=False, own_logging=False))
    failure: list[BaseException] = []

    def run():
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"llm-simulator-{sock.getsockname()[1]}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the simulator did not start: {failure[0]!r}" if failure else
                               "the simulator did not start in time")
        time.sleep(0.005)
    return SimulatorServer(app, server, thread, sock, host)


# --------------------------------------------------------------------------------------------------
# CLI

_HELP = {
    "queue_delay_ms": "fixed queueing delay before a request may take a slot (ms)",
    "prefill_ms": "fixed part of prefill (ms)",
    "prefill_ms_per_token": "prefill time per prompt token (ms); prompt tokens = chars / 4",
    "decode_ms_per_token": "time between output tokens at nominal speed (ms)",
    "output_tokens_mean": "mean output length when a request gives no max_tokens",
    "output_tokens_std": "standard deviation of that output length",
    "output_tokens_min": "shortest output", "output_tokens_max": "longest output",
    "max_tokens_mode": "'exact': a request's max_tokens is its output length; 'cap': drawn length capped by it",
    "error_rate": "probability of an injected error (0..1)",
    "capacity": "concurrent requests served at full speed; more wait for a slot (0 = unlimited)",
    "max_queue": "requests waiting for a slot beyond which a 503 is returned (0 = unbounded)",
    "load_slowdown": "decode slowdown at a full pool: decode *= 1 + this * (active - 1) / capacity",
    "jitter": "lognormal sigma of the noise on every duration (0 = exact)",
    "kv_cache_blocks": "KV-cache blocks per model pool: a running request holds ceil((prompt + generated) / "
                       "block tokens) of them; none free -> the newest request is preempted (0 = no KV model)",
    "kv_block_tokens": "tokens per KV-cache block",
    "scheduling_policy": "'fcfs' or 'priority': admit waiting requests by their 'priority' (lower first; KV model only)",
    "seed": "random seed", "default_model": "model name listed by /v1/models",
    "strict_models": "404 for unknown model names",
}


def _parse_mix(text: str) -> dict[int, float]:
    try:
        return {int(k): float(v) for k, v in (item.split("=", 1) for item in text.split(",") if item.strip())}
    except ValueError:
        raise argparse.ArgumentTypeError("expected STATUS=WEIGHT[,STATUS=WEIGHT...], e.g. 500=0.4,429=0.4,503=0.2")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m demo.simulator", description="OpenAI-compatible LLM simulator.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--config", metavar="FILE", help="JSON file in SimulatorConfig.from_dict format; flags override it")
    parser.add_argument("--instant", action="store_true", help="start from SimulatorConfig.instant() (every delay 0)")
    parser.add_argument("--error-mix", type=_parse_mix, metavar="STATUS=WEIGHT,...", help="e.g. 500=0.4,429=0.4,503=0.2")
    parser.add_argument("--model", action="append", default=[], metavar="NAME", help="serve this model name too (repeatable)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--access-log", action="store_true")
    defaults = SimulatorConfig()
    for f in fields(SimulatorConfig):
        if f.name in ("models", "error_mix"):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(flag, dest=f.name, action="store_true", default=None, help=_HELP.get(f.name))
        else:
            kind = {int: int, float: float}.get(type(default), int if f.name == "seed" else str)
            parser.add_argument(flag, dest=f.name, type=kind, default=None, help=f"{_HELP.get(f.name, '')} [{default}]")
    return parser


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    data: dict = {}
    if args.config:
        with open(args.config) as handle:
            data = json.load(handle)
    if args.instant:
        base = SimulatorConfig.instant().to_dict()
        base.pop("models")
        data = {**base, **data}
    for f in fields(SimulatorConfig):
        value = getattr(args, f.name, None)
        if value is not None:
            data[f.name] = value
    if args.error_mix is not None:
        data["error_mix"] = args.error_mix
    if args.model:
        data["models"] = {**{name: {} for name in args.model}, **(data.get("models") or {})}
    return SimulatorConfig.from_dict(data)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = _build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, TypeError, OSError) as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"simulator: cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
              "(choose another --port; 0 picks a free one)", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"LLM simulator on http://{host}:{sock.getsockname()[1]}/v1 (models: {', '.join(config.model_names())})",
          flush=True)
    uvicorn.Server(_uvicorn_config(create_app(config), args.log_level, args.access_log, own_logging=True)).run(
        sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
