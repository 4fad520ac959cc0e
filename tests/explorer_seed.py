"""Seeding for the explorer tests: spans parsed by the ingest's own parser and stored with
``Store.insert``, and each trace's summary row computed from those spans by the summariser's
``trace_row`` (what the summariser writes)."""

from __future__ import annotations

import json
import time

from analytics.summarizer import starts_retire, trace_row
from ingest.schemas import Limits, parse_span
from store import get_store


def span_rows(*, project_id: int, spans: list[dict]) -> list[dict]:
    limits = Limits()
    return [parse_span(json.dumps(span).encode(), project_id=project_id, limits=limits) for span in spans]


def summary_row(*, project_id: int, rows: list[dict], version: int | None = None, prices=None) -> dict:
    """The ``traces`` row of one trace from its ``spans`` rows, built by the summariser's own
    ``trace_row`` (as if the summariser had read these spans back)."""
    spans = [{**row, "start_ns": row["start_time"]} for row in rows]
    return trace_row(project_id=project_id, trace_id=rows[0]["trace_id"], spans=spans, prices=prices,
                     version=version if version is not None else time.time_ns())


def summary_moved(*, project_id: int, rows: list[dict], earlier_ns: int, tag: str) -> dict:
    """A trace's summaries as the summariser leaves one whose start moved: an older version starting
    ``earlier_ns`` before the latest (its old start), the latest one from ``rows`` (version 2), and the
    old start retired in ``traces_by_start`` (``starts_retire``). Returns the latest."""
    latest = summary_row(project_id=project_id, rows=rows, version=2)
    stale = dict(latest, version=1, start_time=latest["start_time"] - earlier_ns)
    get_store().insert("traces", [stale], tag=tag)
    get_store().insert("traces", [latest], tag=tag)
    starts_retire(project_id=project_id, moved=[(latest["trace_id"], stale["start_time"])], version=2)
    return latest


def seed_traces(*, project_id: int, traces: list[list[dict]], summarise: bool = True) -> list[str]:
    """Store the spans of each trace (native-API span dicts) and, unless told not to, its summary."""
    store = get_store()
    all_rows, summaries = [], []
    for spans in traces:
        rows = span_rows(project_id=project_id, spans=spans)
        all_rows.extend(rows)
        if summarise:
            summaries.append(summary_row(project_id=project_id, rows=rows))
    store.insert("spans", all_rows, tag="tests.seed_spans")
    if summaries:
        store.insert("traces", summaries, tag="tests.seed_traces")
    return [spans[0]["trace_id"] for spans in traces]


def summary_insert(*, project_id: int, spans: list[dict]) -> dict:
    """Write the summary of a trace whose spans were ingested elsewhere (e.g. over HTTP)."""
    row = summary_row(project_id=project_id, rows=span_rows(project_id=project_id, spans=spans))
    get_store().insert("traces", [row], tag="tests.seed_traces")
    return row
