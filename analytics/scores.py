"""Reads of scores (store.schema.SCORES): every read scoped to its project, deduplicated (FINAL: a
re-sent score, or a reviewer's new rating, replaces the earlier row with the same score id)."""

from __future__ import annotations

import re

from store import get_store

_HEX32 = re.compile(r"^[0-9a-f]{32}\Z")

_COLUMNS = ("trace_id, span_id, name, score_id, data_type, value, string_value, source, author, comment, "
            "toUnixTimestamp64Milli(time) AS time_ms")
MAX_TRACES = 10_000


def _score(row: dict) -> dict:
    data_type = row["data_type"]
    value = row["value"]
    shown = (row["string_value"] if data_type == "categorical"
             else bool(value) if data_type == "boolean" else value)
    return {
        "trace_id": row["trace_id"],
        "span_id": row["span_id"],
        "name": row["name"],
        "id": row["score_id"],
        "data_type": data_type,
        "value": shown,
        "source": row["source"],
        "author": row["author"],
        "comment": row["comment"],
        "time_ms": int(row["time_ms"]),
    }


def scores_for_traces(*, project_id: int, trace_ids, tag: str = "analytics.scores_for_traces") -> dict[str, list[dict]]:
    """{trace_id: [score, ...]} for the given traces of one project (traces without scores are
    absent), each list in time order. A score: trace_id, span_id ('' = the trace), name, id,
    data_type, value (a float, a bool or the category), source, author, comment, time_ms."""
    ids = sorted({str(t) for t in trace_ids if t and _HEX32.match(str(t))})
    if not ids:
        return {}
    if len(ids) > MAX_TRACES:
        raise ValueError(f"at most {MAX_TRACES} traces per read, got {len(ids)}")
    rows = get_store().query(
        f"SELECT {_COLUMNS} FROM scores FINAL "
        "WHERE project_id = {project:UInt64} AND trace_id IN splitByChar(',', {traces:String}) "
        "ORDER BY trace_id, time, name, score_id",
        {"project": int(project_id), "traces": ",".join(ids)}, tag=tag).dicts()
    result: dict[str, list[dict]] = {}
    for row in rows:
        result.setdefault(row["trace_id"], []).append(_score(row))
    return result


def trace_scores(*, project_id: int, trace_id: str) -> list[dict]:
    """The scores of one trace of one project (of the trace and of its spans), in time order."""
    return scores_for_traces(project_id=project_id, trace_ids=[trace_id], tag="analytics.trace_scores").get(trace_id, [])
