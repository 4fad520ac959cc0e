"""Validation of the native JSON span format (DESIGN §4) into store rows.

Each span is checked on its own: a bad span is rejected with the field at fault and the rest of
the batch is still stored. Unknown fields are ignored, so clients can send extra data safely.
Nothing is coerced silently: a wrong type is an error naming the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone

PHASES = ("network", "preprocess", "inference", "postprocess", "other")
STATUSES = ("ok", "error")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]\d{2}:\d{2})$"
)
MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01
MAX_TIME_NS = 7_258_118_400 * 10**9  # 2200-01-01
MAX_NAME_CHARS = 512
MAX_LABEL_CHARS = 256
MAX_UINT32 = 2**32 - 1
MAX_DURATION_NS = 7 * 24 * 3600 * 10**9  # a span longer than a week is a client bug


@dataclass(frozen=True)
class Limits:
    max_attributes: int = 128
    max_key_bytes: int = 256
    max_value_bytes: int = 64 * 1024
    max_events: int = 128


class FieldError(Exception):
    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and value == value and value not in (
        float("inf"),
        float("-inf"),
    )


def parse_time_ns(value, field: str) -> int:
    """RFC 3339 text (nanosecond precision kept) or integer unix nanoseconds."""
    if _is_int(value):
        ns = value
    elif isinstance(value, str):
        match = _RFC3339.match(value)
        if not match:
            raise FieldError(field, f"expected RFC 3339 time like 2026-01-02T03:04:05.123Z or unix nanoseconds, got {value[:64]!r}")
        year, month, day, hour, minute, second, frac, zone = match.groups()
        try:
            base = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=timezone.utc)
        except ValueError as exc:
            raise FieldError(field, f"invalid date/time: {exc}") from None
        offset = 0
        if zone not in ("Z", "z"):
            sign = 1 if zone[0] == "+" else -1
            offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
        ns = (int(base.timestamp()) - offset) * 10**9 + int((frac or "0").ljust(9, "0"))
    else:
        raise FieldError(field, f"expected RFC 3339 text or integer unix nanoseconds, got {type(value).__name__}")
    if not MIN_TIME_NS <= ns < MAX_TIME_NS:
        raise FieldError(field, "time is outside 2000-01-01 .. 2200-01-01 (unix nanoseconds expected for integers)")
    return ns


def _string(value, field: str, *, max_chars: int, default: str | None = None, required: bool = False) -> str:
    if value is None:
        if required:
            raise FieldError(field, "is required")
        return default if default is not None else ""
    if not isinstance(value, str):
        raise FieldError(field, f"expected a string, got {type(value).__name__}")
    if required and not value.strip():
        raise FieldError(field, "must not be empty")
    if len(value) > max_chars:
        raise FieldError(field, f"longer than {max_chars} characters")
    return value


def _non_negative(value, field: str, *, integer: bool = False, maximum: float | None = None):
    if value is None:
        return None
    if integer and not _is_int(value):
        raise FieldError(field, f"expected a whole number, got {type(value).__name__}")
    if not _is_number(value):
        raise FieldError(field, f"expected a number, got {type(value).__name__}")
    if value < 0:
        raise FieldError(field, "must not be negative")
    if maximum is not None and value > maximum:
        raise FieldError(field, f"must not exceed {maximum}")
    return value


def _flat_value(value, field: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if _is_int(value) or _is_number(value):
        return json.dumps(value)
    if value is None:
        return ""
    if isinstance(value, list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    raise FieldError(field, f"unsupported value type {type(value).__name__}")


def flatten_attributes(value, field: str, limits: Limits) -> dict[str, str]:
    """A JSON object -> flat ``{str: str}``; nested objects become dotted keys, lists JSON text."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(field, f"expected an object of key/value pairs, got {type(value).__name__}")
    out: dict[str, str] = {}
    stack = [("", value, 0)]
    while stack:
        prefix, obj, depth = stack.pop()
        if depth > 8:
            raise FieldError(field, "nested more than 8 levels deep")
        for key, item in obj.items():
            full = f"{prefix}{key}"
            if isinstance(item, dict):
                stack.append((full + ".", item, depth + 1))
                continue
            if len(full.encode()) > limits.max_key_bytes:
                raise FieldError(f"{field}.{full[:40]}…", f"key longer than {limits.max_key_bytes} bytes")
            text = _flat_value(item, f"{field}.{full}")
            if len(text.encode()) > limits.max_value_bytes:
                raise FieldError(f"{field}.{full}", f"value longer than {limits.max_value_bytes} bytes")
            out[full] = text
            if len(out) > limits.max_attributes:
                raise FieldError(field, f"more than {limits.max_attributes} attributes")
    return out


def _events(value, field: str, limits: Limits):
    if value is None:
        return [], [], []
    if not isinstance(value, list):
        raise FieldError(field, f"expected a list, got {type(value).__name__}")
    if len(value) > limits.max_events:
        raise FieldError(field, f"more than {limits.max_events} events")
    times, names, attrs = [], [], []
    for i, event in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(event, dict):
            raise FieldError(where, "expected an object")
        names.append(_string(event.get("name"), f"{where}.name", max_chars=MAX_LABEL_CHARS, required=True))
        times.append(parse_time_ns(event.get("time"), f"{where}.time"))
        attrs.append(flatten_attributes(event.get("attributes"), f"{where}.attributes", limits))
    return times, names, attrs


def parse_span(obj, *, project_id: int, limits: Limits) -> dict:
    """One native JSON span -> a row of ``store.schema.SPANS`` (raises FieldError)."""
    if not isinstance(obj, dict):
        raise FieldError("span", f"expected an object, got {type(obj).__name__}")
    trace_id = obj.get("trace_id")
    if not isinstance(trace_id, str) or not _HEX32.match(trace_id) or trace_id == "0" * 32:
        raise FieldError("trace_id", "expected 32 lowercase hex characters, not all zero")
    span_id = obj.get("span_id")
    if not isinstance(span_id, str) or not _HEX16.match(span_id) or span_id == "0" * 16:
        raise FieldError("span_id", "expected 16 lowercase hex characters, not all zero")
    parent = obj.get("parent_span_id")
    if parent in (None, ""):
        parent = ""
    elif not isinstance(parent, str) or not _HEX16.match(parent):
        raise FieldError("parent_span_id", "expected 16 lowercase hex characters, or null for a root span")
    elif parent == span_id:
        raise FieldError("parent_span_id", "a span cannot be its own parent")

    name = _string(obj.get("name"), "name", max_chars=MAX_NAME_CHARS, required=True)
    phase = obj.get("phase") or "other"
    if phase not in PHASES:
        raise FieldError("phase", f"expected one of {', '.join(PHASES)}, got {str(phase)[:40]!r}")
    status = obj.get("status") or "ok"
    if status not in STATUSES:
        raise FieldError("status", f"expected ok or error, got {str(status)[:40]!r}")

    start_ns = parse_time_ns(obj.get("start_time"), "start_time")
    if obj.get("end_time") is not None:
        end_ns = parse_time_ns(obj["end_time"], "end_time")
        if end_ns < start_ns:
            raise FieldError("end_time", "is before start_time")
        duration_ns = end_ns - start_ns
    elif obj.get("duration_ms") is not None:
        duration_ns = round(_non_negative(obj["duration_ms"], "duration_ms") * 1_000_000)
    else:
        raise FieldError("end_time", "either end_time or duration_ms is required")
    if duration_ns > MAX_DURATION_NS:
        raise FieldError("duration_ms", "longer than 7 days")

    ttft_ms = _non_negative(obj.get("ttft_ms"), "ttft_ms")
    cost = _non_negative(obj.get("cost_usd"), "cost_usd")
    times, names, event_attrs = _events(obj.get("events"), "events", limits)
    resource = obj.get("resource_attributes", obj.get("resource"))
    return {
        "project_id": project_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "phase": phase,
        "service": _string(obj.get("service"), "service", max_chars=MAX_LABEL_CHARS, default="unknown") or "unknown",
        "model": _string(obj.get("model"), "model", max_chars=MAX_LABEL_CHARS),
        "start_time": start_ns,
        "duration_ns": duration_ns,
        "status": status,
        "status_message": _string(obj.get("status_message"), "status_message", max_chars=limits.max_value_bytes),
        "ttft_ns": None if ttft_ms is None else round(ttft_ms * 1_000_000),
        "input_tokens": _non_negative(obj.get("input_tokens"), "input_tokens", integer=True, maximum=MAX_UINT32) or 0,
        "output_tokens": _non_negative(obj.get("output_tokens"), "output_tokens", integer=True, maximum=MAX_UINT32) or 0,
        "cost_usd": None if cost is None else float(cost),
        "attributes": flatten_attributes(obj.get("attributes"), "attributes", limits),
        "resource_attributes": flatten_attributes(resource, "resource_attributes", limits),
        "event_times": times,
        "event_names": names,
        "event_attributes": event_attrs,
    }
