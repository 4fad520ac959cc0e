"""An OpenAI-compatible LLM simulator: a pure ASGI application (stdlib + asyncio), run by uvicorn.

Endpoints
    POST /v1/chat/completions   chat completions, streamed (SSE) or not
    GET  /v1/models             the configured model names
    GET  /health                {"status": "ok"}
    GET  /stats                 counters: requests, in_flight, queued, active, errors, tokens, ...

Timing model of one chat completion (all knobs in :class:`SimulatorConfig`, per model in
:class:`ModelProfile`)::

    arrival -> fixed queueing delay (queue_delay_ms; holds no slot)
            -> wait for a slot (asyncio.Semaphore of ``capacity`` slots; 0 = unlimited)
            -> prefill (prefill_ms + prefill_ms_per_token * prompt_tokens)        => first token
            -> one token every decode_ms_per_token * slowdown                       => last token
            -> slot released

    TTFT = fixed queueing delay + slot wait + prefill
    slowdown = 1 + load_slowdown * (active - 1) / capacity   (active = requests holding a slot, so a
               lone request decodes at the nominal speed and a full pool at 1 + load_slowdown)

Each model named in ``models`` has its own pool of ``capacity`` slots; every other model name
shares the default pool.

Every duration is multiplied by a lognormal noise factor with mean 1 and sigma ``jitter`` (0 = none).
Prompt tokens are ``ceil(chars / 4)`` of the messages' text. Completion tokens are ``max_tokens``
(or ``max_completion_tokens``) when the request gives one ("exact" mode, finish_reason "length"),
otherwise drawn from a normal distribution clipped to [output_tokens_min, output_tokens_max]
(finish_reason "stop"); in "cap" mode the drawn length is only capped by ``max_tokens``.

Injected errors (``error_rate``, status picked from the ``error_mix`` weights) are answered at once,
before queueing, as OpenAI-style JSON errors with the header ``x-sim-injected-error: 1``.
``max_queue`` (0 = unbounded) turns away requests with a 503 when that many already wait for a slot.

Streamed responses send their headers together with the first token (so a client's time to headers
is the TTFT too) and coalesce tokens that are already due into one write, so with zero delays a
whole stream costs a couple of writes. Response headers carry ``x-sim-ttft-ms`` (the TTFT the
simulator intended, measured from arrival) and ``x-sim-queue-ms`` (time spent waiting for a slot).
A client that disconnects mid-request frees its slot at once.

Run it::

    python -m demo.simulator --port 8100 --prefill-ms 50 --decode-ms-per-token 20 --capacity 8
    python -m demo.simulator --port 8100 --instant            # every delay 0 (load tests)
    python -m demo.simulator --config sim.json                # SimulatorConfig.from_dict format

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
from dataclasses import asdict, dataclass, field, fields

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
        known saturation point; ``inf`` for unlimited capacity or zero service time."""
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
    for name in ("capacity", "max_queue"):
        if not (isinstance(getattr(p, name), int) and getattr(p, name) >= 0):
            raise ValueError(f"{where}: {name} must be an integer >= 0")
    if not (isinstance(p.output_tokens_min, int) and isinstance(p.output_tokens_max, int)
            and 1 <= p.output_tokens_min <= p.output_tokens_max):
        raise ValueError(f"{where}: need 1 <= output_tokens_min <= output_tokens_max")
    if not 0.0 <= p.error_rate <= 1.0:
        raise ValueError(f"{where}: error_rate must be within [0, 1]")
    if p.error_rate > 0 and not p.error_mix:
        raise ValueError(f"{where}: error_rate > 0 needs a non-empty error_mix")
    if p.max_tokens_mode not in ("exact", "cap"):
        raise ValueError(f"{where}: max_tokens_mode must be 'exact' or 'cap'")


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


class _Pool:
    """The slots of one model (or of every model without its own profile)."""

    __slots__ = ("capacity", "max_queue", "sem", "active", "waiting")

    def __init__(self, capacity: int, max_queue: int):
        self.capacity, self.max_queue = capacity, max_queue
        self.sem: asyncio.Semaphore | None = None
        self.active = 0
        self.waiting = 0

    def reset(self):
        # Semaphores bind to the event loop that first uses them: a fresh one per server start.
        self.sem = asyncio.Semaphore(self.capacity) if self.capacity else None
        self.active = self.waiting = 0


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

    __slots__ = ("model", "stream", "include_usage", "max_tokens", "prompt_tokens")

    def __init__(self, model, stream, include_usage, max_tokens, prompt_tokens):
        self.model, self.stream, self.include_usage = model, stream, include_usage
        self.max_tokens, self.prompt_tokens = max_tokens, prompt_tokens


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
        self._default_pool = _Pool(self._default_profile.capacity, self._default_profile.max_queue)
        self._pools = {name: _Pool(p.capacity, p.max_queue) for name, p in self._profiles.items()}
        self._known_models = set(config.model_names())
        self._stats = _Stats()
        self._id_prefix = "chatcmpl-sim" + os.urandom(4).hex()
        self._next_id = 0
        self._models_body = json.dumps({"object": "list", "data": [
            {"id": name, "object": "model", "created": int(self._stats.started), "owned_by": "tracedash-simulator"}
            for name in config.model_names()]}).encode()
        self._loop = None

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
            pool.reset()

    async def _http(self, scope, receive, send):
        path, method = scope["path"], scope["method"]
        if path == "/v1/chat/completions" or path == "/chat/completions":
            if method != "POST":
                return await _send_json(send, 405, _error_body(405, "Method not allowed; use POST."))
            return await self._chat(receive, send)
        if method not in ("GET", "HEAD"):
            if path in ("/v1/models", "/health", "/stats"):
                return await _send_json(send, 405, _error_body(405, "Method not allowed; use GET."))
        elif path == "/health":
            return await _send_json(send, 200, b'{"status":"ok"}')
        elif path == "/v1/models" or path == "/models":
            return await _send_json(send, 200, self._models_body)
        elif path == "/stats":
            return await _send_json(send, 200, json.dumps(self.stats()).encode())
        await _send_json(send, 404, _error_body(404, f"Unknown path {path}.", code="unknown_url"))

    def stats(self) -> dict:
        s = self._stats
        pools = (self._default_pool, *self._pools.values())
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
            "uptime_s": round(time.time() - s.started, 3),
        }

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
        rng = self.rng
        if profile.error_rate and rng.random() < profile.error_rate:
            status = rng.choices(list(profile.error_mix), weights=list(profile.error_mix.values()))[0]
            return await self._inject_error(send, status)
        if pool.max_queue and pool.sem is not None and pool.sem.locked() and pool.waiting >= pool.max_queue:
            return await self._inject_error(send, 503, injected=False)

        n, finish_reason = self._completion_length(profile, request.max_tokens)
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
        # Only requests that will wait for something get a disconnect watcher (an extra task each).
        watch = (_Disconnect(receive) if queue_delay + prefill + (n - 1) * profile.decode_ms_per_token / 1000.0 > 0.02
                 or (pool.sem is not None and pool.sem.locked()) else None)
        acquired = False
        try:
            if queue_delay:
                await asyncio.sleep(queue_delay)
            t_queue = time.perf_counter()
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
            pool.active += 1
            t_slot = time.perf_counter()
            t_first = loop.time() + prefill
            timing = [(b"x-sim-ttft-ms", b"%.1f" % ((t_slot - t0 + prefill) * 1000.0)),
                      (b"x-sim-queue-ms", b"%.1f" % ((t_slot - t_queue) * 1000.0))]
            if request.stream:
                stats.streamed += 1
                await self._stream(send, request, profile, pool, n, finish_reason, t_first, timing, watch)
            else:
                await self._complete(send, request, profile, pool, n, finish_reason, t_first, timing, watch)
            stats.completed += 1
        except asyncio.CancelledError:
            if watch is None or not watch.fired:
                raise
            asyncio.current_task().uncancel()
            stats.disconnects += 1
        finally:
            if watch is not None:
                watch.close()
            if acquired:
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
        return _Request(model, bool(stream), include_usage, max_tokens, max(1, (chars + 3) // 4))

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

    async def _complete(self, send, request, profile, pool, n, finish_reason, t_first, timing, watch):
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
        tokens = self._tokens(n)
        text = "".join(t for t, _ in tokens).lstrip()
        self._stats.completion_tokens += n
        body = json.dumps({
            "id": self._new_id(), "object": "chat.completion", "created": int(time.time()), "model": request.model,
            "system_fingerprint": "fp_sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": request.prompt_tokens, "completion_tokens": n,
                      "total_tokens": request.prompt_tokens + n},
        }).encode()
        if watch is not None:
            watch.done = True
        await _send_json(send, 200, body, timing)

    async def _stream(self, send, request, profile, pool, n, finish_reason, t_first, timing, watch):
        loop = self._loop
        stats = self._stats
        delay = t_first - loop.time()
        while delay > _DUE_SLACK_S:
            await asyncio.sleep(delay)
            delay = t_first - loop.time()
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + timing})

        head = (b'data: {"id":"' + self._new_id().encode() + b'","object":"chat.completion.chunk","created":'
                + str(int(time.time())).encode() + b',"model":' + json.dumps(request.model).encode()
                + b',"system_fingerprint":"fp_sim","choices":[')
        tail = b',"usage":null}\n\n' if request.include_usage else b"}\n\n"
        prefix = head + b'{"index":0,"delta":{"content":'
        suffix = b'},"logprobs":null,"finish_reason":null}]' + tail
        parts = [head + b'{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,'
                 b'"finish_reason":null}]' + tail]
        tokens = self._tokens(n)
        first = json.dumps(tokens[0][0].lstrip()).encode()
        decode = profile.decode_ms_per_token
        due = t_first
        i = 0
        while True:
            now = loop.time()
            if due - now > _DUE_SLACK_S:
                await asyncio.sleep(due - now)
                continue
            sent = i
            while i < n and due - now <= _DUE_SLACK_S:
                parts.append(prefix + (first if i == 0 else tokens[i][1]) + suffix)
                i += 1
                if decode and i < n:
                    due += self._interval(profile, pool)
            stats.completion_tokens += i - sent
            if i < n:
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                parts = []
                continue
            parts.append(head + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
                         + finish_reason.encode() + b'"}]' + tail)
            if request.include_usage:
                parts.append(head + b'],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                             % (request.prompt_tokens, n, request.prompt_tokens + n))
            parts.append(b"data: [DONE]\n\n")
            if watch is not None:
                watch.done = True
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": False})
            return


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
