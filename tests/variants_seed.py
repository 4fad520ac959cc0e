"""Seeding for the Variants tests: requests tagged with ``llm.quantization`` (span attribute on the
inference span, ``host.name`` as a resource attribute), GPU samples of their hosts, and scores."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

from store import get_store
from tests.alerts_support import sample
from tests.explorer_seed import seed_traces
from tests.spans import llm_trace

S = 10**9


def variant_trace(start_ns: int, *, value: str, e2e_ms: float, host: str, error: bool = False,
                  key: str = "llm.quantization") -> list[dict]:
    spans = llm_trace(start_ns=start_ns, error=error)
    spans[0]["duration_ms"] = e2e_ms
    spans[3]["attributes"] = {key: value}
    for span in spans:
        span["resource_attributes"] = {"host.name": host}
    return spans


def seed_variants(project_id: int, *, t0_ns: int, n: int = 120, fast_b: bool = True, seed: int = 1,
                  values=("fp16", "int8"), scores: bool = True) -> dict[str, list[str]]:
    """``n`` requests per value over 10 minutes from ``t0_ns``. A: E2E ~ 1000 ± 100 ms on host gpu-a
    (GPU memory 80 %); B: ~600 ms when ``fast_b`` (else the same distribution) on gpu-b (40 %).
    Scores: numeric ``quality`` (A ~4.5, B ~ 3.5 when fast_b), boolean ``helpful``."""
    rng = random.Random(seed)
    traces, ids = [], {v: [] for v in values}
    for i, value in enumerate(values):
        for j in range(n):
            start = t0_ns + int(j * 600 * S / n) + rng.randrange(0, S)
            mean = 600 if (fast_b and i > 0) else 1000
            spans = variant_trace(start, value=value, e2e_ms=max(50.0, rng.gauss(mean, 100)), host=f"gpu-{value}",
                                  error=(j % 20 == 0))
            traces.append(spans)
            ids[value].append(spans[0]["trace_id"])
    seed_traces(project_id=project_id, traces=traces)
    samples = []
    for i, value in enumerate(values):
        mem = 40 if (fast_b and i > 0) else 80
        for minute in range(11):
            samples.append(sample(project_id, datetime.fromtimestamp(t0_ns / S + minute * 60 + 5, tz=timezone.utc), host=f"gpu-{value}", mem_pct=mem + rng.random(),
                                  util=50 + rng.random()))
    get_store().insert("resource_samples", samples, tag="tests.variants.samples")
    if scores:
        rows = []
        for i, value in enumerate(values):
            for tid in ids[value]:
                q = (3.5 if (fast_b and i > 0) else 4.5) + rng.gauss(0, 0.3)
                rows.append(score_row(project_id, tid, "quality", q))
                rows.append(score_row(project_id, tid, "helpful", 1.0 if rng.random() < 0.8 else 0.0,
                                      data_type="boolean"))
        get_store().insert("scores", rows, tag="tests.variants.scores")
    return ids


def score_row(project_id: int, trace_id: str, name: str, value: float, *, data_type: str = "numeric",
              label: str = "", source: str = "eval") -> dict:
    return {"project_id": project_id, "trace_id": trace_id, "span_id": "", "name": name,
            "score_id": f"{trace_id}-{name}", "data_type": data_type, "value": value, "string_value": label,
            "source": source, "author": "", "comment": "", "time": time.time_ns()}
