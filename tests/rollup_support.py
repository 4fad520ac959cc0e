"""Random but realistic traces for the rollup tests and the panel benchmark, and the exact
figures over raw spans that the rollups must agree with (DOMAIN.md, nearest-rank percentiles)."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict

from analytics.trace_math import PHASES, SPAN_FIELDS_SQL, trace_summarize
from ingest.schemas import Limits, parse_span
from store import get_store

MS = 1_000_000
QUANTILES = (0.5, 0.9, 0.95, 0.99)


def random_trace(rng: random.Random, *, start_ns: int, service: str = "chat-api", model: str = "gpt-4o-mini",
                 error: bool = False, network: bool = True) -> list[dict]:
    """Root + network, preprocess, inference (streamed: TTFT, tokens, cost), postprocess, with
    log-normal durations so percentiles are spread like real latency."""
    tid = "%032x" % rng.getrandbits(128)
    root = "%016x" % rng.getrandbits(64)
    durations = {"network": rng.lognormvariate(math.log(60), 0.5), "preprocess": rng.lognormvariate(math.log(40), 0.6),
                 "inference": rng.lognormvariate(math.log(700), 0.7), "postprocess": rng.lognormvariate(math.log(25), 0.5)}
    spans, offset = [], rng.uniform(0, 5)
    if not network:
        del durations["network"]
    for phase, ms in durations.items():
        span = {"trace_id": tid, "span_id": "%016x" % rng.getrandbits(64), "parent_span_id": root, "name": phase,
                "phase": phase, "service": service, "start_time": start_ns + int(offset * MS), "duration_ms": round(ms, 3)}
        if phase == "inference":
            out = rng.randint(2, 400)
            span.update(model=model, ttft_ms=round(ms * rng.uniform(0.05, 0.4), 3), input_tokens=rng.randint(10, 2000),
                        output_tokens=out, cost_usd=round(out * 1e-6, 9))
        spans.append(span)
        offset += ms + rng.uniform(0, 3)
    spans.insert(0, {"trace_id": tid, "span_id": root, "parent_span_id": None, "name": "POST /chat", "phase": "other",
                     "service": service, "start_time": start_ns, "duration_ms": round(offset + rng.uniform(0, 5), 3),
                     "status": "error" if error else "ok", "status_message": "boom" if error else ""})
    return spans


def insert_spans(project_id: int, spans: list[dict]) -> None:
    limits = Limits()
    rows = [parse_span(json.dumps(s).encode(), project_id=project_id, limits=limits) for s in spans]
    get_store().insert("spans", rows, tag="tests.rollup_support.spans")


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered) - 1e-9)) - 1]


def exact_from_spans(project_id: int, *, start_ns: int, end_ns: int, service: str = "", model: str = "") -> dict:
    """Every figure of the window computed from the raw spans (deduplicated per span id), trace by
    trace with trace_math: requests are rooted traces whose root starts in [start_ns, end_ns)."""
    rows = get_store().query(
        f"SELECT trace_id, {SPAN_FIELDS_SQL} FROM spans WHERE project_id = {{p:UInt64}}"
        " ORDER BY ingested_at DESC LIMIT 1 BY trace_id, span_id", {"p": project_id}, tag="tests.exact").dicts()
    by_trace = defaultdict(list)
    for r in rows:
        by_trace[r["trace_id"]].append(r)
    out = {"requests": 0, "errors": 0, "output_tokens": 0, "input_tokens": 0, "cost_usd": 0.0, "e2e_sum": 0,
           "e2e": [], "ttft": [], "tpot": [], **{p: [] for p in PHASES}}
    for spans in by_trace.values():
        s = trace_summarize(spans)
        if not s.has_root or not start_ns <= s.start_ns < end_ns:
            continue
        if (service and s.service != service) or (model and s.model != model):
            continue
        out["requests"] += 1
        out["errors"] += s.status == "error"
        out["output_tokens"] += s.output_tokens
        out["input_tokens"] += s.input_tokens
        out["cost_usd"] += s.cost_usd or 0.0
        out["e2e_sum"] += s.e2e_ns
        out["e2e"].append(s.e2e_ns)
        if s.ttft_ns is not None:
            out["ttft"].append(s.ttft_ns)
        if s.tpot_ns is not None:
            out["tpot"].append(s.tpot_ns)
        for p in PHASES:
            if s.phase_ns[p] > 0:  # a phase's percentiles are over the requests that spent time in it
                out[p].append(s.phase_ns[p])
    return out


def exact_ms(values: list[float]) -> dict[float, float | None]:
    return {q: (nearest_rank(values, q) / 1e6 if values else None) for q in QUANTILES}


def rollup_worker_project(*, name: str = "worker-rollups") -> dict:
    """worker_server ``--setup`` hook: a project, its ingest key and a member who can log in, in
    the worker process's own database."""
    from django.contrib.auth import get_user_model

    from projects.services import membership_add, project_create

    project, key = project_create(name=name)
    user = get_user_model().objects.create_user(username="rollup-viewer", password="rollup-viewer-pw-1")
    membership_add(project=project, user=user)
    return {"project_id": project.pk, "key": key, "username": "rollup-viewer", "password": "rollup-viewer-pw-1"}
