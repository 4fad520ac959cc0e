"""Scores of traces and spans (``POST /api/v1/scores``, the SDK's ``score``, OTel attributes and
events, the trace page's review form) -> rows of ``store.schema.SCORES``.

One parser for every path: ``score_row`` takes a score as a dict of the API's fields and returns
the row, or raises FieldError naming the field at fault. A score without an ``id`` gets one derived
from (trace_id, span_id, name, source, author), so a re-sent score, or a reviewer changing their
rating, replaces the earlier row (the table is a ReplacingMergeTree read with FINAL).
"""

from __future__ import annotations

import hashlib
import math
import re
import time as _time
from decimal import Decimal
from typing import Annotated, Any

import msgspec

from .schemas import FieldError, Hex16, Hex32, MAX_LABEL_CHARS, _decode_item, _exact, parse_time_ns

MAX_SCORE_NAME_CHARS = 200
MAX_COMMENT_CHARS = 4096
MAX_CATEGORY_CHARS = MAX_LABEL_CHARS
MAX_ID_CHARS = 128
DATA_TYPES = ("numeric", "boolean", "categorical")
SOURCES = ("api", "sdk", "annotation", "eval")
_HEX32 = re.compile(r"^[0-9a-f]{32}\Z")
_HEX16 = re.compile(r"^[0-9a-f]{16}\Z")


class ScoreIn(msgspec.Struct):
    trace_id: Hex32
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SCORE_NAME_CHARS)]
    value: bool | int | float | str
    span_id: Hex16 | None = None
    data_type: str | None = None
    source: str | None = None
    comment: Annotated[str, msgspec.Meta(max_length=MAX_COMMENT_CHARS)] | None = None
    author: Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)] | None = None
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)] | None = None
    time: int | float | str | None = None


class ScoresIn(msgspec.Struct):
    scores: list[msgspec.Raw]


_score_decoder = msgspec.json.Decoder(ScoreIn)


def derived_score_id(trace_id: str, span_id: str, name: str, source: str, author: str) -> str:
    """The id of a score sent without one: the same trace, span, name, source and author give the
    same id, so the newer score replaces the older."""
    key = "\x1f".join((trace_id, span_id, name, source, author)).encode()
    return "d-" + hashlib.sha256(key).hexdigest()[:30]


def infer_data_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, Decimal)):
        return "numeric"
    return "categorical"


def score_row(score: dict, *, project_id: int, default_source: str = "api", now_ns: int | None = None) -> dict:
    """A score as the API's fields (a dict) -> a row of ``store.schema.SCORES`` (FieldError names
    what is wrong). ``value``'s JSON type decides the data type unless ``data_type`` says it, and a
    ``data_type`` that does not fit the value is an error."""
    trace_id = score.get("trace_id")
    if not isinstance(trace_id, str) or not _HEX32.match(trace_id):
        raise FieldError("trace_id", "expected 32 lowercase hex characters")
    if trace_id == "0" * 32:
        raise FieldError("trace_id", "must not be all zero")
    span_id = score.get("span_id") or ""
    if span_id:
        if not isinstance(span_id, str) or not _HEX16.match(span_id):
            raise FieldError("span_id", "expected 16 lowercase hex characters, or null for a score of the trace")
        if span_id == "0" * 16:
            raise FieldError("span_id", "must not be all zero")
    name = score.get("name")
    if not isinstance(name, str) or not name.strip():
        raise FieldError("name", "must be a non-empty string")
    if len(name) > MAX_SCORE_NAME_CHARS:
        raise FieldError("name", f"longer than {MAX_SCORE_NAME_CHARS} characters")

    value = score.get("value")
    if value is None:
        raise FieldError("value", "is required: a number, true/false, or a category (text)")
    inferred = infer_data_type(value)
    data_type = score.get("data_type") or inferred
    if data_type not in DATA_TYPES:
        raise FieldError("data_type", f"expected one of {', '.join(DATA_TYPES)}, got {str(data_type)[:64]!r}")
    if data_type != inferred:
        raise FieldError("data_type", f"{data_type} does not fit the value sent ({inferred}: "
                                      f"{'true/false' if data_type == 'boolean' else 'a number' if data_type == 'numeric' else 'text'} expected)")
    string_value = ""
    if data_type == "boolean":
        number = 1.0 if value else 0.0
    elif data_type == "numeric":
        number = float(value)
        if not math.isfinite(number):
            raise FieldError("value", "must be a finite number (not NaN or infinity)")
    else:
        if not isinstance(value, str) or not value.strip():
            raise FieldError("value", "a categorical score's value must be non-empty text")
        if len(value) > MAX_CATEGORY_CHARS:
            raise FieldError("value", f"a category is at most {MAX_CATEGORY_CHARS} characters")
        number, string_value = 0.0, value

    source = score.get("source") or default_source
    if source not in SOURCES:
        raise FieldError("source", f"expected one of {', '.join(SOURCES)}, got {str(source)[:64]!r}")
    comment = score.get("comment") or ""
    if not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS:
        raise FieldError("comment", f"expected text of at most {MAX_COMMENT_CHARS} characters")
    author = score.get("author") or ""
    if not isinstance(author, str) or len(author) > MAX_LABEL_CHARS:
        raise FieldError("author", f"expected text of at most {MAX_LABEL_CHARS} characters")
    score_id = score.get("id") or ""
    if score_id and (not isinstance(score_id, str) or len(score_id) > MAX_ID_CHARS):
        raise FieldError("id", f"expected text of at most {MAX_ID_CHARS} characters")
    if not score_id:
        score_id = derived_score_id(trace_id, span_id, name, source, author)
    sent_time = score.get("time")
    time_ns = parse_time_ns(sent_time, "time") if sent_time is not None else (now_ns or _time.time_ns())
    return {
        "project_id": project_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "name": name,
        "score_id": score_id,
        "data_type": data_type,
        "value": number,
        "string_value": string_value,
        "source": source,
        "author": author,
        "comment": comment,
        "time": time_ns,
    }


def parse_score(raw, *, project_id: int) -> dict:
    """One native JSON score (raw JSON bytes) -> a row of ``store.schema.SCORES``."""
    score = _decode_item(_score_decoder, raw, kind="score")
    if type(score.time) is float:  # unix nanoseconds written 1.7e18: read exactly from the text
        score.time = _exact(raw)["time"]
    return score_row(msgspec.structs.asdict(score), project_id=project_id)


# --- the OpenTelemetry convention (docs/otlp.md "Scores") ---------------------------------------
SCORE_ATTRIBUTE_PREFIX = "tracedash.score."
SCORE_EVENT_NAME = "tracedash.score"
OTEL_SOURCE = "sdk"


def _attribute_value(text: str) -> Any:
    """A flattened attribute value (text: numbers in JSON form, booleans true/false) -> the value
    it was sent as."""
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)  # NaN or infinity: refused by score_row, naming the attribute
    except ValueError:
        return text


def has_score_keys(attributes: dict, event_names) -> bool:
    """Cheap test: does a span carry any score (an attribute ``tracedash.score.*`` or an event
    ``tracedash.score``)?"""
    if event_names and SCORE_EVENT_NAME in event_names:
        return True
    return bool(attributes) and any(key.startswith(SCORE_ATTRIBUTE_PREFIX) for key in attributes)


def span_score_rows(span_row: dict, *, typed_attributes: dict | None = None) -> list[dict]:
    """The scores a stored span row carries by the OTel convention: each attribute
    ``tracedash.score.<name>`` and each event ``tracedash.score`` (attributes ``name``, ``value``,
    optional ``comment``, ``author``) becomes a score of that span, source ``sdk``, time the span's
    end (an event's: its own time). ``typed_attributes`` are the values as sent (bool, number,
    text), when the caller has them; else the flat text is read back. A bad score raises FieldError
    naming its attribute: the span is rejected with it, so nothing is half-written."""
    attributes = span_row.get("attributes") or {}
    event_names = span_row.get("event_names") or ()
    if not has_score_keys(attributes, event_names):
        return []
    base = {"trace_id": span_row["trace_id"], "span_id": span_row["span_id"], "source": OTEL_SOURCE}
    end_ns = span_row["start_time"] + span_row.get("duration_ns", 0)
    rows = []
    for key, text in attributes.items():
        if not key.startswith(SCORE_ATTRIBUTE_PREFIX):
            continue
        name = key[len(SCORE_ATTRIBUTE_PREFIX):]
        value = typed_attributes[key] if typed_attributes and key in typed_attributes else _attribute_value(text)
        try:
            rows.append(score_row({**base, "name": name, "value": value, "time": end_ns},
                                  project_id=span_row["project_id"]))
        except FieldError as exc:
            raise FieldError(f"attributes.{key}", f"score: {exc.field} {exc.message}") from None
    for i, event_name in enumerate(event_names):
        if event_name != SCORE_EVENT_NAME:
            continue
        event = span_row["event_attributes"][i]
        value = event.get("value")
        score = {**base, "name": event.get("name"), "value": None if value is None else _attribute_value(value),
                 "comment": event.get("comment"), "author": event.get("author"), "time": span_row["event_times"][i]}
        if event.get("id"):
            score["id"] = event["id"]
        try:
            rows.append(score_row(score, project_id=span_row["project_id"]))
        except FieldError as exc:
            raise FieldError(f"events[{i}].attributes.{exc.field}", f"score: {exc.message}") from None
    return rows
