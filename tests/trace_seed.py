"""Seeding traces straight into the store for trace-page tests: native-API span payloads go through
the ingest's own parser (``ingest.schemas.parse_span``) into ``spans``, and the per-trace summary
row into ``traces`` is written with the summariser's own ``trace_row``."""

from __future__ import annotations

import json
import random
import time

from analytics.prices import prices_for_project
from analytics.summarizer import trace_row
from analytics.trace_math import SPAN_FIELDS_SQL
from ingest.schemas import Limits, parse_span
from store import get_store

from .spans import span_id as new_span_id
from .spans import trace_id as new_trace_id


def span_rows(spans: list[dict], *, project_id: int) -> list[dict]:
    return [parse_span(json.dumps(s).encode(), project_id=project_id, limits=Limits()) for s in spans]


def insert_spans(spans: list[dict], *, project_id: int) -> None:
    get_store().insert("spans", span_rows(spans, project_id=project_id), tag="tests.trace_seed.spans")


def summarise(trace_id: str, *, project_id: int) -> dict:
    """Write the ``traces`` row of a trace from its spans in the store, with the summariser's own
    ``trace_row`` (and the project's price table)."""
    store = get_store()
    spans = store.query(
        f"SELECT {SPAN_FIELDS_SQL} FROM spans WHERE project_id = {{p:UInt64}} AND trace_id = {{t:FixedString(32)}}"
        " ORDER BY ingested_at DESC LIMIT 1 BY span_id",
        {"p": project_id, "t": trace_id}, tag="tests.trace_seed.read").dicts()
    row = trace_row(project_id=project_id, trace_id=trace_id, spans=spans,
                    prices=prices_for_project(project_id=project_id), version=time.time_ns())
    store.insert("traces", [row], tag="tests.trace_seed.traces")
    return row


def seed(spans: list[dict], *, project_id: int, summary: bool = True) -> str:
    insert_spans(spans, project_id=project_id)
    trace_id = spans[0]["trace_id"]
    if summary:
        summarise(trace_id, project_id=project_id)
    return trace_id


def big_trace(count: int = 10_000, *, seed_value: int = 7, start_ns: int | None = None) -> list[dict]:
    """A ``count``-span agent-like trace: a root and count/5 steps, each with network, preprocess,
    inference (with TTFT) and postprocess children."""
    rng = random.Random(seed_value)
    tid = new_trace_id()
    start = start_ns or time.time_ns() - 60_000_000_000
    ms = 1_000_000
    root = new_span_id()
    spans = [{"trace_id": tid, "span_id": root, "parent_span_id": None, "name": "agent.run", "phase": "other",
              "service": "agent", "start_time": start, "duration_ms": 0.0}]
    cursor = start
    while len(spans) < count:
        step = new_span_id()
        step_start = cursor
        step_span = {"trace_id": tid, "span_id": step, "parent_span_id": root, "name": f"step {len(spans)}",
                     "phase": "other", "service": "agent", "start_time": step_start, "duration_ms": 0.0}
        spans.append(step_span)
        t = step_start
        for phase in ("network", "preprocess", "inference", "postprocess"):
            if len(spans) >= count:
                break
            dur = rng.randint(1, 40) * ms
            span = {"trace_id": tid, "span_id": new_span_id(), "parent_span_id": step, "name": f"{phase} call",
                    "phase": phase, "service": "agent", "start_time": t, "duration_ms": dur / ms,
                    "attributes": {"step": str(len(spans))}}
            if phase == "inference":
                span.update(model="gpt-4o-mini", ttft_ms=dur / ms / 3, input_tokens=100, output_tokens=20)
            spans.append(span)
            t += dur
        step_span["duration_ms"] = (t - step_start) / ms
        cursor = t
    spans[0]["duration_ms"] = (cursor - start) / ms
    return spans[:count]
