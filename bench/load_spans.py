"""Load a bench data dir with realistic LLM traces for the query benchmark (bench/query.py).

    .venv/bin/python bench/load_spans.py [--spans 10000000] [--days 30] [--data-dir var/bench] [--reset]

Writes ``--spans`` spans (about 10 per trace) spread over the last ``--days`` days into an
embedded ClickHouse (chdb) at ``--data-dir`` (database ``tracedash_bench``, project 1), built by
the same migrations users run, then the per-trace summaries into ``traces``. A second run on the
same dir adds nothing unless ``--reset`` (the data dir is reused across bench/query.py runs).

The traces: a gateway root (``POST /v1/chat`` on chat-gateway, ``POST /v1/agent`` on agent-gateway
(20 %), ``POST /v1/summarize`` on summarize-api, health checks) over network (auth, vector
search), preprocess (prompt building, retrieval), one or more model calls (tool-calling loops of
0–4 tools, retries that fail first), postprocess (moderation, formatting); seven services, five
models, ~3 % of traces failing; every root carries ``user.id`` (20,000 users) and ``session.id``
(a session is ~4 traces), model calls carry GenAI attributes and ~10 % of them a 2–8 KB prompt
and a completion. Seeded, so two runs of the same size generate the same data.

Summaries are computed in this process by the summariser's own ``analytics.summarizer.trace_row``
from the very span rows inserted, so they are what it would write.
Rows go through ``Store.insert`` (Arrow into chdb) in batches of ``--batch`` spans, generated in
time order so each batch lands in one or two daily partitions.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from store import Store  # noqa: E402
from store.backends import EmbeddedBackend  # noqa: E402
from store.migrator import MigrationContext, migrate  # noqa: E402

DATABASE = "tracedash_bench"
PROJECT_ID = 1
DEFAULT_DATA_DIR = ROOT / "var" / "bench"
NS, MS = 1_000_000_000, 1_000_000
RETENTION_DAYS = 3650  # the bench data must outlive the default retention

ROUTES = [("POST /v1/chat", 0.6), ("POST /v1/agent", 0.2), ("POST /v1/summarize", 0.15), ("GET /v1/health", 0.05)]
ROOT_SERVICES = {"POST /v1/chat": "chat-gateway", "POST /v1/agent": "agent-gateway",
                 "POST /v1/summarize": "summarize-api", "GET /v1/health": "chat-gateway"}
MODELS = [("gpt-4o-mini", 0.15, 0.60, 0.4), ("gpt-4o", 2.50, 10.0, 0.2), ("claude-3-5-sonnet", 3.0, 15.0, 0.15),
          ("llama-3.1-70b", 0.59, 0.79, 0.2), ("mistral-large", 2.0, 6.0, 0.05)]  # name, $/M in, $/M out, weight
TOOLS = ["web.search", "db.lookup", "calculator", "weather.get", "calendar.read"]
USERS = 20_000


class Generator:
    """Traces in time order; ``rng`` seeded so runs are reproducible."""

    def __init__(self, *, seed: int, start_ns: int, end_ns: int, traces: int, project_id: int = PROJECT_ID):
        self.rng = random.Random(seed)
        self.project_id = project_id
        self.start_ns, self.end_ns, self.traces = start_ns, end_ns, traces
        self.step_ns = (end_ns - start_ns) / max(traces, 1)
        self.span_counter = 0
        self.session = None
        self.session_left = 0
        prompt_rng = random.Random(seed + 1)
        words = ["the", "model", "context", "user", "asked", "about", "latency", "token", "stream", "answer",
                 "cluster", "gpu", "memory", "request", "policy", "summary", "invoice", "refund", "order", "shipping"]
        self.prompts = [" ".join(prompt_rng.choice(words) for _ in range(prompt_rng.randint(350, 1400)))
                        for _ in range(64)]
        self.completions = [" ".join(prompt_rng.choice(words) for _ in range(prompt_rng.randint(40, 200)))
                            for _ in range(64)]
        self.route_names = [r for r, _ in ROUTES]
        self.route_weights = [w for _, w in ROUTES]
        self.model_weights = [m[3] for m in MODELS]

    def _span_id(self) -> str:
        self.span_counter += 1
        return f"{self.span_counter:016x}"

    def _span(self, trace_id, parent, name, phase, service, start, duration, **extra) -> dict:
        row = {
            "project_id": self.project_id, "trace_id": trace_id, "span_id": self._span_id(), "parent_span_id": parent,
            "name": name, "phase": phase, "phase_fallback": 0, "cache": 0, "service": service, "model": "", "start_time": start,
            "duration_ns": duration, "status": "ok", "status_message": "", "ttft_ns": None,
            "input_tokens": 0, "output_tokens": 0, "cost_usd": None, "attributes": {},
            "resource_attributes": {"service.name": service, "host.name": f"{service}-{(self.span_counter % 4)}"},
            "event_times": [], "event_names": [], "event_attributes": [],
        }
        row.update(extra)
        return row

    def _model_call(self, trace_id, parent, start, model, *, fail: bool) -> dict:
        rng = self.rng
        name, price_in, price_out, _ = model
        tokens_in = rng.randint(200, 6000)
        tokens_out = 0 if fail else rng.randint(20, 900)
        ttft = int(rng.lognormvariate(5.4, 0.45) * MS)  # ~220 ms median
        decode = int(tokens_out * rng.uniform(8, 30) * MS)
        duration = ttft + decode if not fail else int(rng.uniform(2, 30) * 1000 * MS)
        attributes = {"gen_ai.system": name.split("-")[0], "gen_ai.request.model": name,
                      "gen_ai.operation.name": "chat"}
        if rng.random() < 0.1:
            attributes["gen_ai.prompt"] = rng.choice(self.prompts)
            attributes["gen_ai.completion"] = rng.choice(self.completions)
        extra = dict(model=name, input_tokens=tokens_in, output_tokens=tokens_out, attributes=attributes)
        if fail:
            extra.update(status="error", status_message=rng.choice(["upstream timeout", "rate limited (429)",
                                                                    "context length exceeded"]))
        else:
            extra.update(ttft_ns=ttft, event_times=[start + ttft], event_names=["first_token"], event_attributes=[{}])
            # Most providers report a cost; self-hosted llama does not (the price table fills it in).
            if not name.startswith("llama"):
                extra["cost_usd"] = (tokens_in * price_in + tokens_out * price_out) / 1_000_000
        return self._span(trace_id, parent, "llm.chat", "inference", "llm-proxy", start, duration, **extra)

    def trace(self, position: float) -> list[dict]:
        """One trace starting at ``position`` (0..1) of the time range, give or take one step."""
        rng = self.rng
        start = min(self.end_ns - 1, self.start_ns + int(position * (self.end_ns - self.start_ns) + rng.random() * self.step_ns))
        trace_id = f"{rng.getrandbits(128):032x}"
        route = rng.choices(self.route_names, self.route_weights)[0]
        if self.session_left <= 0:
            self.session, self.session_left = f"{rng.getrandbits(64):016x}", rng.randint(1, 7)
        self.session_left -= 1
        user = f"u-{rng.randrange(USERS):05d}"
        spans: list[dict] = []
        gateway = ROOT_SERVICES[route]
        root = self._span(trace_id, "", route, "other", gateway, start, 0,
                          attributes={"http.route": route.split(" ")[1], "http.method": route.split(" ")[0],
                                      "user.id": user, "session.id": self.session,
                                      "user.tier": rng.choice(["free", "free", "pro", "enterprise"])})
        spans.append(root)
        t = start + rng.randint(1, 3) * MS
        auth = int(rng.uniform(2, 25) * MS)
        spans.append(self._span(trace_id, root["span_id"], "auth.verify", "network", gateway, t, auth))
        t += auth
        if route == "GET /v1/health":
            root["duration_ns"] = t + MS - start
            return spans
        handler = self._span(trace_id, root["span_id"], "chat.handle", "other", "chat-api", t, 0)
        spans.append(handler)
        h0 = t
        t += rng.randint(1, 4) * MS
        prep = self._span(trace_id, handler["span_id"], "prompt.build", "preprocess", "chat-api", t, 0)
        spans.append(prep)
        p0 = t
        search = int(rng.lognormvariate(3.3, 0.5) * MS)  # ~27 ms
        spans.append(self._span(trace_id, prep["span_id"], "vector.search", "network", "retriever", t + MS, search,
                                attributes={"db.system": "qdrant", "db.collection": "docs"}))
        t += MS + search + int(rng.uniform(3, 40) * MS)
        prep["duration_ns"] = t - p0
        model = rng.choices(MODELS, self.model_weights)[0]
        failing = rng.random() < 0.03
        tools = rng.choice([0, 0, 0, 1, 1, 2, 3, 4]) if route == "POST /v1/agent" else rng.choice([0, 0, 0, 0, 1])
        # A retry: the first call fails with a 429 and the second succeeds (the trace stays ok only
        # when nothing else fails).
        if rng.random() < 0.04:
            call = self._model_call(trace_id, handler["span_id"], t, model, fail=True)
            call["duration_ns"] = int(rng.uniform(50, 400) * MS)
            call["status_message"] = "rate limited (429)"
            spans.append(call)
            t += call["duration_ns"] + int(rng.uniform(100, 500) * MS)
        for step in range(tools + 1):
            last = step == tools
            call = self._model_call(trace_id, handler["span_id"], t, model, fail=failing and last)
            spans.append(call)
            t += call["duration_ns"]
            if not last:
                tool = rng.choice(TOOLS)
                duration = int(rng.lognormvariate(4.5, 0.8) * MS)
                spans.append(self._span(trace_id, handler["span_id"], f"tool.{tool}", "network", "tools", t + MS,
                                        duration, attributes={"tool.name": tool}))
                t += duration + 2 * MS
        if not failing:
            post = self._span(trace_id, handler["span_id"], "response.format", "postprocess", "chat-api", t, 0)
            spans.append(post)
            mod = int(rng.uniform(5, 60) * MS)
            spans.append(self._span(trace_id, post["span_id"], "moderation.check", "postprocess", "safety", t + MS, mod))
            t += MS + mod + int(rng.uniform(1, 8) * MS)
            post["duration_ns"] = t - post["start_time"]
        handler["duration_ns"] = t - h0
        t += rng.randint(1, 5) * MS
        root["duration_ns"] = t - start
        if failing:
            root.update(status="error", status_message="upstream model call failed")
        return spans


def recent_spans(n: int, seed: int) -> list[dict]:
    """``n`` spans of this generator's traces, starting over the last hour, in trace order (the
    last trace cut at ``n``), for the benchmarks that insert the same rows several ways."""
    now = time.time_ns()
    gen = Generator(seed=seed, start_ns=now - 3600 * NS, end_ns=now, traces=max(1, n // 8), project_id=PROJECT_ID)
    out: list[dict] = []
    while len(out) < n:
        out.extend(gen.trace(len(out) / n))
    return out[:n]


def _django() -> None:
    """The summariser's row builder lives in a Django app: configure Django (settings only; it
    reads no database here)."""
    os.environ.setdefault("TRACEDASH_DATA_DIR", tempfile.mkdtemp(prefix="tracedash-bench-load-"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    import django

    django.setup()


def open_store(data_dir: Path) -> Store:
    store = Store(EmbeddedBackend(data_dir / "clickhouse", DATABASE))
    migrate(store, MigrationContext(retention_days=RETENTION_DAYS))
    return store


def arrival_batches(gen: Generator, total: int, batch: int, *, ends: bool = False) -> list[list[dict]]:
    """``total`` spans of ``gen``'s traces in inserts of ``batch`` rows, in arrival order: whole traces
    in the order they start (a batch ends after the trace that fills it), or, with ``ends``, each
    span on its own in the order the spans end (as SDKs and OpenTelemetry exporters send them: the
    children before their root)."""
    batches: list[list[dict]] = []
    pending: list[dict] = []
    generated = 0
    while generated < total:
        rows = gen.trace(generated / total)[: total - generated]
        pending.extend(rows)
        generated += len(rows)
        if not ends and (len(pending) >= batch or generated >= total):
            batches.append(pending)
            pending = []
    if ends:
        pending.sort(key=lambda row: row["start_time"] + row["duration_ns"])
        batches = [pending[i:i + batch] for i in range(0, len(pending), batch)]
    return batches


def fresh_batch(size: int, *, prefix: str, tag: str) -> tuple[Store, list[dict]]:
    """A fresh store holding ``size`` new spans (whole traces, ~8.5 spans each, starting over the
    last 2 s) inserted 1,000 rows at a time, as the ingest writer stores them under load: the batch
    of a summariser run (bench/summary_threads.py, bench/summary_engines.py)."""
    import tempfile

    store = open_store(Path(tempfile.mkdtemp(prefix=prefix)))
    now = time.time_ns()
    gen = Generator(seed=9, start_ns=now - 2_000_000_000, end_ns=now, traces=max(1, size // 8), project_id=PROJECT_ID)
    spans: list[dict] = []
    while len(spans) < size:
        spans.extend(gen.trace(len(spans) / size))
    for i in range(0, len(spans), 1000):
        store.insert("spans", spans[i:i + 1000], tag=tag)
    return store, spans


def progress(done: int, total: int, started: float, label: str) -> None:
    elapsed = time.monotonic() - started
    rate = done / elapsed if elapsed else 0.0
    left = (total - done) / rate if rate else 0.0
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} "
                     f"{rate:,.0f}/s, {elapsed:,.0f}s elapsed, ~{left:,.0f}s left ")
    sys.stderr.flush()


def load(*, store: Store, spans_wanted: int, days: float, batch: int, seed: int, now_ns: int,
         project_id: int = PROJECT_ID) -> dict:
    """Generate and insert; the insert of one batch (chdb releases the GIL while it writes) runs in
    a second thread while the next batch is generated. ``project_id``: whose spans they are
    (``bench/read.py`` loads a project a real server knows)."""
    from analytics.summarizer import trace_row

    traces_planned = max(1, spans_wanted // 8)  # ~8.5 spans a trace; only sets the start-time jitter
    gen = Generator(seed=seed, start_ns=now_ns - int(days * 86400 * NS), end_ns=now_ns, traces=traces_planned,
                    project_id=project_id)
    prices = {name: (p_in, p_out) for name, p_in, p_out, _ in MODELS}
    version = time.time_ns()
    span_rows: list[dict] = []
    trace_rows: list[dict] = []
    done = {"spans": 0, "traces": 0}
    started = time.monotonic()
    timings = {"generate_s": 0.0, "summarise_s": 0.0, "insert_s": 0.0}
    pending = None

    def flush(spans: list[dict], traces: list[dict]) -> None:
        t0 = time.perf_counter()
        store.insert("spans", spans, tag="bench.load_spans.spans")
        store.insert("traces", traces, tag="bench.load_spans.traces")
        timings["insert_s"] += time.perf_counter() - t0
        done["spans"] += len(spans)
        done["traces"] += len(traces)
        progress(done["spans"], spans_wanted, started, "spans")

    generated = 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        while generated < spans_wanted:
            t0 = time.perf_counter()
            rows = gen.trace(generated / spans_wanted)[: spans_wanted - generated]
            t1 = time.perf_counter()
            trace_rows.append(trace_row(project_id=project_id, trace_id=rows[0]["trace_id"],
                                        spans=[{**r, "start_ns": r["start_time"]} for r in rows],
                                        prices=prices, version=version))
            timings["generate_s"] += t1 - t0
            timings["summarise_s"] += time.perf_counter() - t1
            span_rows.extend(rows)
            generated += len(rows)
            if len(span_rows) >= batch or generated >= spans_wanted:
                if pending is not None:
                    pending.result()
                pending = pool.submit(flush, span_rows, trace_rows)
                span_rows, trace_rows = [], []
        if pending is not None:
            pending.result()
    sys.stderr.write("\n")
    t0 = time.perf_counter()
    # One part per partition for the summaries (cheap: ~1 row per 9 spans), so FINAL reads merge
    # nothing; the spans are left to ClickHouse's background merges, as in production.
    store.command("OPTIMIZE TABLE traces FINAL", tag="bench.load_spans.optimize")
    timings["optimize_traces_s"] = time.perf_counter() - t0
    return {**done, "seconds": time.monotonic() - started, **timings}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--batch", type=int, default=200_000, help="spans per insert")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--reset", action="store_true", help="delete the data dir first")
    args = parser.parse_args(argv)
    logging.getLogger("tracedash.store").setLevel(logging.ERROR)  # big inserts are slow on purpose
    if args.spans < 1 or args.days <= 0 or args.batch < 1:
        parser.error("--spans, --days and --batch must be positive")
    if args.reset and args.data_dir.exists():
        shutil.rmtree(args.data_dir)
    _django()
    store = open_store(args.data_dir)
    existing = store.query("SELECT count() FROM spans WHERE project_id = {p:UInt64}", {"p": PROJECT_ID},
                           tag="bench.load_spans.count").scalar()
    if existing:
        print(f"{args.data_dir}: already holds {int(existing):,} spans of project {PROJECT_ID}; "
              "nothing loaded (--reset starts over)")
        return 0
    print(f"loading {args.spans:,} spans over {args.days:g} days into {args.data_dir} (database {DATABASE})", flush=True)
    stats = load(store=store, spans_wanted=args.spans, days=args.days, batch=args.batch, seed=args.seed,
                 now_ns=time.time_ns())
    print(f"loaded {stats['spans']:,} spans in {stats['traces']:,} traces in {stats['seconds']:.1f} s "
          f"({stats['spans'] / stats['seconds']:,.0f} spans/s): generate {stats['generate_s']:.1f} s, "
          f"summarise {stats['summarise_s']:.1f} s, insert (beside generation) {stats['insert_s']:.1f} s, "
          f"optimize traces {stats['optimize_traces_s']:.1f} s")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
