"""The demo workload: a small LLM chat service, instrumented with the tracedash SDK, calling the
OpenAI-compatible simulator (demo.simulator).

Each request is one trace across two services, with all four phases: the API gateway receives it
(``network``), the RAG service retrieves context and builds the prompt (``preprocess``), the chat
model answers over a streamed completion (``inference``, TTFT and tokens recorded by
``tracedash_sdk.stream``), and the answer is moderated and formatted (``postprocess``). Model calls
that fail with 429/503/500 are retried with backoff, so error and retry spans appear too.

A semantic cache sits in front of retrieval and the model (``tracer.cache("semantic")``): users ask
a few questions far more often than the rest (a Zipf-like popularity over ``INTENTS``, phrased
differently each time), the cache keeps the answers of the last ``CACHE_ENTRIES`` questions, and a
hit answers in a few milliseconds without calling the simulator. About 28 % of requests are hits
once it is warm (LRU over that popularity; ``tests/test_demo_cache.py`` measures it).

Variants, tiers and a judge (docs/demo.md): most model calls go to the demo model
``demo-llama-8b``, served in two variants (``VARIANTS``): FP16 and INT8, half the traffic each. INT8
is faster and holds less GPU memory (its own simulated GPU host, ``demo.gpus``); the model call's
span says which (``llm.quantization``, ``gen_ai.request.model``, ``host.name``). Each request comes
from a user of one of three tiers (``TIERS``: ``user.tier`` premium 20 %, standard 50 %, free 30 %),
sent to the simulator as vLLM's request ``priority`` (premium first), so under load premium waits
least. After each answer from a model a simulated judge scores it (``quality``, 1–5, source
``eval``): INT8's answers a little lower on average; a third of the scores come seconds later, as a
late evaluation would (``tracer.score``). Django-free.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import tracedash_sdk as td

from .simulator import ModelProfile, SimulatorConfig

QUESTIONS = [
    "How do I reset my password?", "Summarise the incident report from last night.",
    "Which GPU should we buy for serving a 70B model?", "Translate this paragraph into French.",
    "Why is P95 latency higher on Mondays?", "Write a SQL query for the top customers by revenue.",
    "Explain time to first token like I'm five.", "Draft a polite reply declining the meeting.",
]
# What users ask, most popular first after a fixed shuffle: each base question about each topic.
_TOPICS = ["", " for the mobile app", " in the EU region", " on the free plan", " for the enterprise team",
           " with SSO enabled", " after the last release", " in under a minute"]
INTENTS = [q[:-1] + topic + "?" for q in QUESTIONS for topic in _TOPICS]
random.Random(7).shuffle(INTENTS)
_POPULARITY = [1 / (rank + 1) ** 0.8 for rank in range(len(INTENTS))]  # Zipf-like, exponent 0.8
CACHE_ENTRIES = 8  # answers the semantic cache keeps (least recently used go first)


def semantic_key(question: str) -> str:
    """What the cache matches on: the question without case, punctuation and extra spaces (a
    stand-in for an embedding's nearest neighbour: "How do I reset my password?" and "how do i
    reset my password" are the same question)."""
    return " ".join("".join(c for c in question.lower() if c.isalnum() or c.isspace()).split())


class SemanticCache:
    """A small LRU of answers by ``semantic_key``, shared by the demo's threads."""

    def __init__(self, entries: int = CACHE_ENTRIES):
        self.entries = entries
        self._answers: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, question: str) -> str | None:
        key = semantic_key(question)
        with self._lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
            return answer

    def put(self, question: str, answer: str) -> None:
        with self._lock:
            self._answers[semantic_key(question)] = answer
            self._answers.move_to_end(semantic_key(question))
            while len(self._answers) > self.entries:
                self._answers.popitem(last=False)


def _phrased(rng: random.Random, question: str) -> str:
    """The same question as a user might type it."""
    return rng.choice([question, question.lower(), question.rstrip("?"), "  " + question.lower().rstrip("?") + " ?"])


@dataclass(frozen=True)
class Variant:
    """One deployment of the demo model: its name at the simulator, the simulated GPU host that
    serves it, its weights' size there, and the judge's mean quality of its answers."""

    quantization: str
    model: str
    host: str
    weights_gib: float
    quality: float


DEMO_MODEL = "demo-llama-8b"
VARIANTS = {
    "fp16": Variant("fp16", f"{DEMO_MODEL}-fp16", "demo-gpu-fp16", weights_gib=15.0, quality=4.3),
    "int8": Variant("int8", f"{DEMO_MODEL}-int8", "demo-gpu-int8", weights_gib=8.1, quality=4.1),
}
VARIANT_SHARE = {"fp16": 1, "int8": 1}  # of the demo model's calls: half each
VARIANT_BY_MODEL = {v.model: v for v in VARIANTS.values()}

# Users' tiers: share of requests, and the vLLM request priority each is sent with (lower first).
TIERS = {"premium": 0.2, "standard": 0.5, "free": 0.3}
TIER_PRIORITY = {"premium": 0, "standard": 1, "free": 2}

# Price per million tokens (input, output) in USD, so the demo shows costs. ``DEMO_MODEL`` stands
# for its two variants (same price: same tokens, same bill).
MODELS = {DEMO_MODEL: (0.10, 0.20), "llama-3.1-70b": (0.59, 0.79), "claude-haiku": (0.80, 4.00)}
MODEL_WEIGHTS = {DEMO_MODEL: 6, "llama-3.1-70b": 2, "claude-haiku": 2}
# Quality the judge gives the other models' answers, on average.
QUALITY = {"llama-3.1-70b": 4.4, "claude-haiku": 4.2}
JUDGE_NOISE = 0.6   # standard deviation of one score around its model's mean (before rounding to 1..5)
LATE_SHARE = 1 / 3  # of the scores given seconds after the answer (a queue of evaluations)
LATE_SECONDS = (2.0, 8.0)


def price(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens of a model name the demo calls."""
    variant = VARIANT_BY_MODEL.get(model)
    return MODELS[DEMO_MODEL if variant is not None else model]


def simulated_gpus():
    """The simulated GPU of each variant's host (demo.gpus), for the embedded sampler."""
    from .gpus import GIB, SimulatedGpu

    return [SimulatedGpu(host=v.host, model=v.model, uuid=f"GPU-demo-{v.quantization}-0000",
                         weights_bytes=int(v.weights_gib * GIB)) for v in VARIANTS.values()]


def simulator_config(seed: int | None = None) -> SimulatorConfig:
    """Three models with different speeds, the first in two variants (FP16, and INT8: ~1.6x the
    decode speed, a faster prefill); the 70B one is slower, has less capacity and fails more; each
    has a vLLM-like KV cache the simulator's ``/metrics`` reports, scheduled by request priority
    (the users' tiers).

    The speeds keep the demo's P95 end-to-end latency near one second, under the default alert
    rule's 1500 ms (the demo shows a healthy service: its traffic must not page anyone)."""
    return SimulatorConfig(
        seed=seed, queue_delay_ms=10, prefill_ms=65, prefill_ms_per_token=0.2, decode_ms_per_token=6.4,
        output_tokens_mean=60, output_tokens_std=25, output_tokens_max=200, max_tokens_mode="cap",
        error_rate=0.03, capacity=16, jitter=0.25, default_model=VARIANTS["fp16"].model,
        scheduling_policy="priority",
        # The defaults are FP16's (the default model); INT8 decodes 1.6x as fast and prefills faster.
        # A paged KV cache of 12 blocks x 16 tokens per variant, 16 for the other models
        # (bench/demo_kv.py): the demo's normal load fills it now and then (the Engines page shows it
        # move), its rushes keep it full with waiting requests and preemptions for a moment.
        kv_cache_blocks=12, kv_block_tokens=16,
        models={
            VARIANTS["int8"].model: ModelProfile(prefill_ms=45, prefill_ms_per_token=0.13, decode_ms_per_token=4.0),
            "llama-3.1-70b": ModelProfile(prefill_ms=150, decode_ms_per_token=8, capacity=4, error_rate=0.08,
                                          kv_cache_blocks=16),
            "claude-haiku": ModelProfile(prefill_ms=90, decode_ms_per_token=8, kv_cache_blocks=16),
        },
    )


class ModelError(Exception):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


def _stream_completion(base_url: str, model: str, prompt: str, max_tokens: int, timeout: float = 30.0,
                       priority: int = 0):
    """POST a streamed chat completion; yield ``(content, usage)`` per SSE chunk. ``priority``:
    vLLM's request priority (lower first; sent only when not 0)."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        request = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                   "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
        if priority:
            request["priority"] = priority
        body = json.dumps(request)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise ModelError(response.status, response.read()[:200].decode(errors="replace"))
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                return
            chunk = json.loads(data)
            choices = chunk.get("choices") or []
            content = choices[0].get("delta", {}).get("content") if choices else None
            yield content, chunk.get("usage")
    finally:
        conn.close()


@dataclass
class DemoStats:
    requests: int = 0
    errors: int = 0
    retries: int = 0
    cache_hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, error: bool, retries: int, cache_hit: bool = False) -> None:
        with self.lock:
            self.requests += 1
            self.errors += int(error)
            self.retries += retries
            self.cache_hits += int(cache_hit)


class DemoJudge:
    """A simulated LLM-as-judge: scores an answer's quality 1–5 (an integer: its model's mean from
    ``VARIANTS``/``QUALITY`` plus noise, rounded and clipped), with the SDK's score API (name
    ``quality``, source ``eval``, author ``demo-judge``), on the model call's span. ``LATE_SHARE`` of
    the scores are given ``LATE_SECONDS`` later (times ``pace``) by ``tracer.score(trace_id, ...,
    span_id=...)``, as an evaluation queue would; the others at once by ``span.score``.

    Its own seeded RNG (not the workload's), so the same seed gives the same scores. An SDK without
    the score API makes it a no-op (``available`` False)."""

    NAME, SOURCE, AUTHOR = "quality", "eval", "demo-judge"

    def __init__(self, tracer: td.Tracer, *, seed: int | None = None, pace: float = 1.0):
        self.tracer = tracer
        self.rng = random.Random(f"judge-{seed}")
        self.pace = pace
        self.available = hasattr(tracer, "score")
        # (trace_id, span_id, value, late) of the latest scores (bounded: the demo runs for days)
        self.given: deque[tuple[str, str, int, bool]] = deque(maxlen=10_000)
        self._timers: list[threading.Timer] = []
        self._pending: dict[tuple[str, str], int] = {}  # late scores not given yet
        self._lock = threading.Lock()

    def draw(self, model: str) -> tuple[int, bool, float]:
        """(score, late?, delay in seconds) for an answer of ``model``."""
        variant = VARIANT_BY_MODEL.get(model)
        mean = variant.quality if variant is not None else QUALITY.get(model, 4.2)
        with self._lock:
            draw, late = self.rng.gauss(mean, JUDGE_NOISE), self.rng.random() < LATE_SHARE
            delay = self.rng.uniform(*LATE_SECONDS) * self.pace
        return min(5, max(1, int(round(draw)))), late, delay

    def judge(self, span, model: str) -> None:
        """Score the answer ``span`` (the model call) gave, now or later."""
        if not self.available:
            return
        value, late, delay = self.draw(model)
        trace_id, span_id = span.trace_id, span.span_id
        with self._lock:
            self.given.append((trace_id, span_id, value, late))
        if not late and hasattr(span, "score"):
            try:
                span.score(self.NAME, value, source=self.SOURCE, author=self.AUTHOR)
            except Exception:  # noqa: BLE001 - a judge's failure must not reach the demo app
                pass
            return
        key = (trace_id, span_id)
        with self._lock:
            self._pending[key] = value
            timer = threading.Timer(delay, self._late_score, (key,))
            timer.daemon = True
            self._timers = [t for t in self._timers if t.is_alive()]
            self._timers.append(timer)
        timer.start()

    def _late_score(self, key: tuple[str, str]) -> None:
        with self._lock:
            value = self._pending.pop(key, None)
        if value is None:
            return  # given already (by flush)
        try:
            self.tracer.score(key[0], self.NAME, value, span_id=key[1], source=self.SOURCE, author=self.AUTHOR,
                              comment="late evaluation")
        except Exception:  # noqa: BLE001 - a judge's failure must not reach the demo app
            pass

    def flush(self) -> None:
        """Give every pending late score now (the demo is stopping, or a test reads them): none is lost."""
        with self._lock:
            timers, self._timers = self._timers, []
            keys = list(self._pending)
        for timer in timers:
            timer.cancel()
        for key in keys:
            self._late_score(key)


class DemoApp:
    def __init__(self, tracer: td.Tracer, model_url: str, *, seed: int | None = None, pace: float = 1.0,
                 judge: bool = True):
        self.tracer = tracer
        self.model_url = model_url
        self.rng = random.Random(seed)
        self.pace = pace  # multiplies the app's own (non-model) delays; 0 makes them instant
        self.stats = DemoStats()
        self.cache = SemanticCache()
        self.judge = DemoJudge(tracer, seed=seed, pace=pace) if judge else None

    def _sleep(self, low_ms: float, high_ms: float) -> None:
        if self.pace:
            time.sleep(self.rng.uniform(low_ms, high_ms) / 1000 * self.pace)

    def handle_request(self, model: str | None = None) -> None:
        """One user request = one trace (``model``: the model it asks for, else one drawn by
        ``MODEL_WEIGHTS``; ``DEMO_MODEL`` draws one of its variants)."""
        tracer, rng = self.tracer, self.rng
        question = _phrased(rng, rng.choices(INTENTS, weights=_POPULARITY)[0])
        drawn = rng.choices(list(MODEL_WEIGHTS), weights=list(MODEL_WEIGHTS.values()))[0]
        model = model or drawn
        variant = None
        if model == DEMO_MODEL:
            variant = VARIANTS[rng.choices(list(VARIANT_SHARE), weights=list(VARIANT_SHARE.values()))[0]]
            model = variant.model
        tier = rng.choices(list(TIERS), weights=list(TIERS.values()))[0]
        retries, failed, answered_by = 0, False, None
        with tracer.trace("POST /v1/chat", service="chat-api", attributes={"http.route": "/v1/chat",
                                                                           "user.tier": tier}) as root:
            with root.phase("network"):
                # a slow client now and then (1 %: beyond the P95 the network rule watches)
                self._sleep(5, 40 if rng.random() > 0.01 else 400)
            with root.cache("semantic") as lookup:  # embedding + nearest neighbour: a few ms
                self._sleep(1, 4)
                answer = self.cache.get(question)
                hit = lookup.hit = answer is not None
            if answer is None:
                with tracer.trace("rag.retrieve", service="rag-service") as rag:
                    with rag.phase("preprocess"):
                        self._sleep(15, 60)
                        rag.set_attribute("rag.documents", rng.randint(2, 8))
                    with tracer.span("vector-db.query", phase="network", attributes={"db.system": "qdrant"}):
                        self._sleep(3, 25)
                prompt = f"Context: {' '.join(rng.sample(QUESTIONS, 3))}\nQuestion: {question}"
                if variant is not None:  # the trace says which deployment answered it
                    root.set_attribute("llm.quantization", variant.quantization)
                for attempt in range(3):
                    try:
                        answer, answered_by = self._call_model(model, prompt, attempt, tier, variant)
                        break
                    except (ModelError, OSError) as exc:
                        retries += 1
                        if attempt == 2 or (isinstance(exc, ModelError) and exc.status < 429):
                            root.record_exception(exc)
                            failed = True
                            break
                        time.sleep(0.05 * 2 ** attempt)
                if not failed:
                    self.cache.put(question, answer)
            if not failed:
                with root.phase("postprocess"):
                    self._sleep(5, 30)
                    with tracer.span("moderation", phase="postprocess"):
                        self._sleep(2, 15)
                if answered_by is not None and self.judge is not None:
                    self.judge.judge(answered_by, model)
        self.stats.add(error=failed, retries=retries, cache_hit=hit)

    def _call_model(self, model: str, prompt: str, attempt: int, tier: str = "standard",
                    variant: Variant | None = None):
        """The model call: (the answer, its span)."""
        price_in, price_out = price(model)
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.prompt": prompt,
                      "retry.attempt": attempt, "user.tier": tier}
        if variant is not None:
            attributes.update({"llm.quantization": variant.quantization, "host.name": variant.host})
        with self.tracer.span(f"chat {model}", phase="inference", model=model, attributes=attributes) as span:
            usage, text = None, []
            chunks = _stream_completion(self.model_url, model, prompt, self.rng.randint(20, 120),
                                        priority=TIER_PRIORITY[tier])
            for content, chunk_usage in td.stream(chunks, span=span, count_tokens=lambda c: 1 if c[0] else 0):
                if content:
                    text.append(content)
                if chunk_usage:
                    usage = chunk_usage
            if usage:
                span.set_tokens(input=usage["prompt_tokens"], output=usage["completion_tokens"])
                span.set_cost((usage["prompt_tokens"] * price_in + usage["completion_tokens"] * price_out) / 1e6)
            span.set_attribute("gen_ai.completion", "".join(text)[:2000])
            return "".join(text), span


class DemoLoop:
    """Runs the demo app in a few threads at a gentle rate until stopped (``make run``'s demo), with
    a rush now and then: every ``rush_every`` seconds (+-30 %), ``rush_size`` more requests at once
    (users arriving together), so the simulator's queue forms and its priority scheduling shows:
    premium requests are admitted first, free ones wait (the tier split's P95s differ). 0: no rush."""

    def __init__(self, app: DemoApp, *, threads: int = 3, interval: float = 0.7, rush_every: float = 25.0,
                 rush_size: int = 12):
        self.app = app
        self.threads = threads
        self.interval = interval
        self.rush_every, self.rush_size = rush_every, rush_size
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.app.handle_request()
            except Exception:  # noqa: BLE001 - the demo must never take the server down
                pass
            self._stop.wait(self.app.rng.uniform(0.5, 1.5) * self.interval)

    def _one(self) -> None:
        try:
            self.app.handle_request(model=DEMO_MODEL)
        except Exception:  # noqa: BLE001 - the demo must never take the server down
            pass

    def _rush(self) -> None:
        while not self._stop.wait(self.rush_every * self.app.rng.uniform(0.7, 1.3)):
            users = [threading.Thread(target=self._one, name="tracedash-demo-rush", daemon=True)
                     for _ in range(self.rush_size)]
            for user in users:
                user.start()
            for user in users:
                user.join(30.0)

    def start(self) -> None:
        for n in range(self.threads):
            worker = threading.Thread(target=self._run, name=f"tracedash-demo-{n}", daemon=True)
            worker.start()
            self._workers.append(worker)
        if self.rush_every > 0 and self.rush_size > 0:
            worker = threading.Thread(target=self._rush, name="tracedash-demo-rushes", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout)
