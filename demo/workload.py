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
once it is warm (LRU over that popularity; ``tests/test_demo_cache.py`` measures it). Django-free.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import OrderedDict
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


# Price per million tokens (input, output) in USD, so the demo shows costs.
MODELS = {"gpt-4o-mini": (0.15, 0.60), "llama-3.1-70b": (0.59, 0.79), "claude-haiku": (0.80, 4.00)}


def simulator_config(seed: int | None = None) -> SimulatorConfig:
    """Three models with different speeds; the 70B one is slower, has less capacity and fails more;
    each has a vLLM-like KV cache the simulator's ``/metrics`` reports.

    The speeds keep the demo's P95 end-to-end latency near one second, under the default alert
    rule's 1500 ms (the demo shows a healthy service: its traffic must not page anyone)."""
    return SimulatorConfig(
        seed=seed, queue_delay_ms=10, prefill_ms=60, prefill_ms_per_token=0.2, decode_ms_per_token=6,
        output_tokens_mean=60, output_tokens_std=25, output_tokens_max=200, max_tokens_mode="cap",
        error_rate=0.03, capacity=16, jitter=0.25, default_model="gpt-4o-mini",
        # A paged KV cache of 16 blocks x 16 tokens per model (bench/demo_kv.py): the demo's normal load
        # fills it now and then (the Engines page shows it move), twice the load keeps it near full with
        # waiting requests and preemptions.
        kv_cache_blocks=16, kv_block_tokens=16,
        models={
            "llama-3.1-70b": ModelProfile(prefill_ms=150, decode_ms_per_token=8, capacity=4, error_rate=0.08),
            "claude-haiku": ModelProfile(prefill_ms=90, decode_ms_per_token=8),
        },
    )


class ModelError(Exception):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


def _stream_completion(base_url: str, model: str, prompt: str, max_tokens: int, timeout: float = 30.0):
    """POST a streamed chat completion; yield ``(content, usage)`` per SSE chunk."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                           "max_tokens": max_tokens, "stream_options": {"include_usage": True}})
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


class DemoApp:
    def __init__(self, tracer: td.Tracer, model_url: str, *, seed: int | None = None, pace: float = 1.0):
        self.tracer = tracer
        self.model_url = model_url
        self.rng = random.Random(seed)
        self.pace = pace  # multiplies the app's own (non-model) delays; 0 makes them instant
        self.stats = DemoStats()
        self.cache = SemanticCache()

    def _sleep(self, low_ms: float, high_ms: float) -> None:
        if self.pace:
            time.sleep(self.rng.uniform(low_ms, high_ms) / 1000 * self.pace)

    def handle_request(self) -> None:
        """One user request = one trace."""
        tracer, rng = self.tracer, self.rng
        question = _phrased(rng, rng.choices(INTENTS, weights=_POPULARITY)[0])
        model = rng.choices(list(MODELS), weights=[6, 2, 2])[0]
        retries, failed = 0, False
        with tracer.trace("POST /v1/chat", service="chat-api", attributes={"http.route": "/v1/chat",
                                                                           "user.tier": rng.choice(["free", "pro"])}) as root:
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
                for attempt in range(3):
                    try:
                        answer = self._call_model(model, prompt, attempt)
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
        self.stats.add(error=failed, retries=retries, cache_hit=hit)

    def _call_model(self, model: str, prompt: str, attempt: int) -> str:
        price_in, price_out = MODELS[model]
        with self.tracer.span(f"chat {model}", phase="inference", model=model,
                              attributes={"gen_ai.operation.name": "chat", "gen_ai.prompt": prompt,
                                          "retry.attempt": attempt}) as span:
            usage, text = None, []
            chunks = _stream_completion(self.model_url, model, prompt, self.rng.randint(20, 120))
            for content, chunk_usage in td.stream(chunks, span=span, count_tokens=lambda c: 1 if c[0] else 0):
                if content:
                    text.append(content)
                if chunk_usage:
                    usage = chunk_usage
            if usage:
                span.set_tokens(input=usage["prompt_tokens"], output=usage["completion_tokens"])
                span.set_cost((usage["prompt_tokens"] * price_in + usage["completion_tokens"] * price_out) / 1e6)
            span.set_attribute("gen_ai.completion", "".join(text)[:2000])
            return "".join(text)


class DemoLoop:
    """Runs the demo app in a few threads at a gentle rate until stopped (``make run``'s demo)."""

    def __init__(self, app: DemoApp, *, threads: int = 3, interval: float = 0.7):
        self.app = app
        self.threads = threads
        self.interval = interval
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.app.handle_request()
            except Exception:  # noqa: BLE001 - the demo must never take the server down
                pass
            self._stop.wait(self.app.rng.uniform(0.5, 1.5) * self.interval)

    def start(self) -> None:
        for n in range(self.threads):
            worker = threading.Thread(target=self._run, name=f"tracedash-demo-{n}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout)
