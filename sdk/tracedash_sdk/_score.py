"""Scores: a number, true/false or a category attached to a trace or one of its spans
(``Span.score``, ``Tracer.score``), sent by the exporter to ``POST /api/v1/scores``."""

from __future__ import annotations

import math
import re
import time
from typing import Any, Dict, Optional, Union

ScoreValue = Union[bool, int, float, str]
SOURCES = ("api", "sdk", "annotation", "eval")
DATA_TYPES = ("numeric", "boolean", "categorical")
_HEX32 = re.compile(r"^[0-9a-f]{32}\Z")
_HEX16 = re.compile(r"^[0-9a-f]{16}\Z")


def build_score(trace_id: str, name: str, value: ScoreValue, *, span_id: Optional[str] = None,
                comment: Optional[str] = None, source: str = "sdk", author: Optional[str] = None,
                score_id: Optional[str] = None, data_type: Optional[str] = None) -> Dict[str, Any]:
    """The JSON object of one score, checked here so that a mistake shows at the call, not as a
    rejection logged later: ValueError/TypeError name the argument at fault. ``bool`` -> boolean,
    ``int``/``float`` -> numeric, ``str`` -> categorical; ``data_type`` must agree."""
    if not isinstance(trace_id, str) or not _HEX32.match(trace_id):
        raise ValueError(f"trace_id must be 32 lowercase hex characters, got {trace_id!r}")
    if span_id is not None and (not isinstance(span_id, str) or not _HEX16.match(span_id)):
        raise ValueError(f"span_id must be 16 lowercase hex characters, got {span_id!r}")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name must be a non-empty string")
    if isinstance(value, bool):
        inferred = "boolean"
    elif isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"value must be a finite number, got {value!r}")
        inferred = "numeric"
    elif isinstance(value, str):
        if not value.strip():
            raise ValueError("a categorical value must be non-empty text")
        inferred = "categorical"
    else:
        raise TypeError(f"value must be a bool, int, float or str, got {type(value).__name__}")
    if data_type is not None and data_type != inferred:
        raise ValueError(f"data_type {data_type!r} does not fit the value {value!r} ({inferred})")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    score: Dict[str, Any] = {"trace_id": trace_id, "name": name, "value": value, "data_type": inferred,
                             "source": source, "time": time.time_ns()}
    if span_id:
        score["span_id"] = span_id
    if comment:
        score["comment"] = str(comment)
    if author:
        score["author"] = str(author)
    if score_id:
        score["id"] = str(score_id)
    return score
