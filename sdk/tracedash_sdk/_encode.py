"""Spans -> the native JSON of ``POST /api/v1/traces``, within the server's limits.

Runs on the exporter's thread, never on the host app's hot path. Every bound the server enforces
(``ingest/schemas.py``) is applied here, so a span is never rejected for its size or an odd value:
names and labels are cut to their maximum length, attribute values to 64 KiB, keys to 256 bytes,
at most 128 attributes and 128 events, numbers outside their range (or NaN) are left out.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Mapping, Optional

MAX_NAME_CHARS = 512
MAX_LABEL_CHARS = 256
MAX_ATTRIBUTES = 128
MAX_KEY_BYTES = 256
MAX_VALUE_BYTES = 64 * 1024
MAX_EVENTS = 128
MAX_UINT32 = 2**32 - 1
MAX_DURATION_NS = 7 * 24 * 3600 * 10**9
MAX_COST_USD = 1e9
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1

_esc = json.encoder.encode_basestring  # C: a JSON string literal, non-ASCII kept as is
_SHORT = MAX_VALUE_BYTES // 4  # a str this long or shorter is within the limit in any encoding
_PHASES = frozenset(("network", "preprocess", "inference", "postprocess", "other"))
_PHASE_JSON = {phase: f'"{phase}"' for phase in _PHASES}


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, on a character boundary."""
    if len(text) * 4 <= max_bytes:
        return text
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore")


def _label(value: Any, max_chars: int) -> Optional[str]:
    if value is None:
        return None
    text = value if type(value) is str else str(value)
    return text[:max_chars] if len(text) > max_chars else text


def _value(value: Any) -> Any:
    kind = type(value)
    if kind is str:
        return truncate_utf8(value, MAX_VALUE_BYTES)
    if kind is bool:
        return value
    if kind is int:
        return value if _INT64_MIN <= value <= _UINT64_MAX else str(value)
    if kind is float:
        return value if math.isfinite(value) else repr(value)
    try:
        text = str(value)
    except Exception:  # noqa: BLE001
        text = f"<unprintable {kind.__name__}>"
    return truncate_utf8(text, MAX_VALUE_BYTES)


def clean_attributes(attributes: Optional[Mapping[Any, Any]]) -> Dict[str, Any]:
    """A flat ``{str: str|int|float|bool}`` map the server accepts as is."""
    if not attributes:
        return {}
    out: Dict[str, Any] = {}
    for key, value in list(attributes.items()):
        if len(out) >= MAX_ATTRIBUTES:
            break
        if type(key) is not str:
            key = str(key)
        out[truncate_utf8(key, MAX_KEY_BYTES)] = _value(value)
    return out


def _count(value: Any) -> Optional[int]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0 <= number <= MAX_UINT32 else None


def _non_negative(value: Any, maximum: float) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return min(number, maximum)


def span_to_dict(span: Any) -> Dict[str, Any]:
    """One ended :class:`~tracedash_sdk.Span` as the native JSON object (every documented field;
    ``null`` where unknown)."""
    start = int(span.start_time)
    end = int(span.end_time if span.end_time is not None else start)
    if end < start:
        end = start
    elif end - start > MAX_DURATION_NS:
        end = start + MAX_DURATION_NS
    name = _label(span.name, MAX_NAME_CHARS) or ""
    if not name.strip():
        name = "unnamed"
    message = span.status_message
    if message is not None:
        message = truncate_utf8(message if type(message) is str else str(message), MAX_VALUE_BYTES)
    events: List[Dict[str, Any]] = []
    for event_name, time_ns, event_attributes in (span.events or ())[:MAX_EVENTS]:
        event_name = _label(event_name, MAX_LABEL_CHARS) or "event"
        events.append({"name": event_name, "time": int(time_ns), "attributes": clean_attributes(event_attributes)})
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": name,
        "phase": span.phase_name if span.phase_name in _PHASES else None,  # None: the span states none
        "service": _label(span.service, MAX_LABEL_CHARS) or "unknown",
        "model": _label(span.model, MAX_LABEL_CHARS) or None,
        "start_time": start,
        "end_time": end,
        "status": "error" if span.status == "error" else "ok",
        "status_message": message,
        "ttft_ms": _non_negative(span.ttft_ms, MAX_DURATION_NS / 1e6),
        "input_tokens": _count(span.input_tokens),
        "output_tokens": _count(span.output_tokens),
        "cost_usd": _non_negative(span.cost_usd, MAX_COST_USD),
        "attributes": clean_attributes(span.attributes),
        "events": events,
    }


def _json_value(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _esc(value if len(value) * 4 <= MAX_VALUE_BYTES else truncate_utf8(value, MAX_VALUE_BYTES))
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value) if _INT64_MIN <= value <= _UINT64_MAX else _esc(str(value))
    if kind is float:
        return float.__repr__(value) if math.isfinite(value) else _esc(repr(value))
    return _esc(_value(value))


def _json_attributes(attributes: Optional[Mapping[Any, Any]]) -> str:
    if not attributes:
        return "{}"
    items = attributes.items() if len(attributes) <= MAX_ATTRIBUTES else list(attributes.items())[:MAX_ATTRIBUTES]
    try:
        # The common case: short str keys. Values go through _json_value (limits, NaN, types).
        if max(map(len, attributes)) * 4 <= MAX_KEY_BYTES:
            return "{" + ",".join([
                f"{_esc(k)}:{_esc(v) if type(v) is str and len(v) <= _SHORT else _json_value(v)}"
                for k, v in items]) + "}"
    except TypeError:  # a key that is not a str
        pass
    out = []
    for key, value in items:
        if type(key) is not str:
            key = str(key)
        if len(key) * 4 > MAX_KEY_BYTES:
            key = truncate_utf8(key, MAX_KEY_BYTES)
        out.append(f"{_esc(key)}:{_json_value(value)}")
    return "{" + ",".join(out) + "}"


def _json_label(value: Any, max_chars: int) -> Optional[str]:
    if type(value) is str and 0 < len(value) <= max_chars:
        return _esc(value)
    value = _label(value, max_chars)
    return _esc(value) if value else None


def encode_span(span: Any) -> bytes:
    """The span's JSON as UTF-8 bytes (lone surrogates replaced): what :func:`span_to_dict` gives,
    written directly (several times faster than building the dict for ``json.dumps``)."""
    start = int(span.start_time)
    end = span.end_time
    end = start if end is None else int(end)
    if end < start:
        end = start
    elif end - start > MAX_DURATION_NS:
        end = start + MAX_DURATION_NS
    name = span.name
    if type(name) is not str or len(name) > MAX_NAME_CHARS or not name.strip():
        name = _label(name, MAX_NAME_CHARS) or ""
        if not name.strip():
            name = "unnamed"
    parent = span.parent_span_id
    message = span.status_message
    if message is not None:
        message = _esc(truncate_utf8(message if type(message) is str else str(message), MAX_VALUE_BYTES))
    ttft, tokens_in, tokens_out, cost = span.ttft_ms, span.input_tokens, span.output_tokens, span.cost_usd
    if ttft is not None:
        ttft = _non_negative(ttft, MAX_DURATION_NS / 1e6)
    if tokens_in is not None:
        tokens_in = _count(tokens_in)
    if tokens_out is not None:
        tokens_out = _count(tokens_out)
    if cost is not None:
        cost = _non_negative(cost, MAX_COST_USD)
    events = span.events
    if events:
        events_json = "[" + ",".join([
            f'{{"name":{_json_label(event_name, MAX_LABEL_CHARS) or _esc("event")},"time":{int(time_ns)},'
            f'"attributes":{_json_attributes(event_attributes)}}}'
            for event_name, time_ns, event_attributes in events[:MAX_EVENTS]]) + "]"
    else:
        events_json = "[]"
    text = (
        f'{{"trace_id":{_esc(span.trace_id)},"span_id":{_esc(span.span_id)},'
        f'"parent_span_id":{"null" if parent is None else _esc(parent)},"name":{_esc(name)},'
        f'"phase":{_PHASE_JSON.get(span.phase_name, "null")},'
        f'"service":{_json_label(span.service, MAX_LABEL_CHARS) or _esc("unknown")},'
        f'"model":{_json_label(span.model, MAX_LABEL_CHARS) or "null"},'
        f'"start_time":{start},"end_time":{end},"status":"{"error" if span.status == "error" else "ok"}",'
        f'"status_message":{"null" if message is None else message},'
        f'"ttft_ms":{"null" if ttft is None else repr(ttft)},'
        f'"input_tokens":{"null" if tokens_in is None else tokens_in},'
        f'"output_tokens":{"null" if tokens_out is None else tokens_out},'
        f'"cost_usd":{"null" if cost is None else repr(cost)},'
        f'"attributes":{_json_attributes(span.attributes)},"events":{events_json}}}'
    )
    return text.encode("utf-8", "replace")


def encode_batch(parts: List[bytes]) -> bytes:
    """``{"spans": [...]}`` from already encoded spans."""
    return b'{"spans":[' + b",".join(parts) + b"]}"
