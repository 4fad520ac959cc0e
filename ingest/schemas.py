"""Validation of the native JSON formats (DESIGN §4) into store rows.

Each span (or resource sample) is checked on its own: a bad one is rejected with the field at
fault and the rest of the batch is still stored. Unknown fields are ignored, so clients can send
extra data safely. Nothing is coerced silently: a wrong type is an error naming the field. A JSON number with an
integral value is a whole number whatever its notation (``70e9``, ``812.0``): integer fields take
it, and refuse ``70.5`` naming the field.

Types, patterns and ranges are checked by msgspec structs (in C, while decoding); the rules that
need code (times, attribute flattening and size bounds, cross-field checks) follow in Python.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Annotated, Any, Literal

import msgspec

from store import Columns
from store.schema import SPANS

PHASES = ("network", "preprocess", "inference", "postprocess", "other")
STATUSES = ("ok", "error")
# \Z, not $: Python's $ also matches before a final newline ("…e4736\n" would pass).
_HEX16 = re.compile(r"^[0-9a-f]{16}\Z")
_RFC3339 = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(Z|z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])\Z"
)
MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01
MAX_TIME_NS = 7_258_118_400 * 10**9  # 2200-01-01
MAX_NAME_CHARS = 512
MAX_LABEL_CHARS = 256
MAX_UINT32 = 2**32 - 1
MAX_DURATION_NS = 7 * 24 * 3600 * 10**9  # a span longer than a week is a client bug
MAX_DURATION_MS = MAX_DURATION_NS / 1_000_000
MAX_BYTES = 2**63 - 1  # byte counts: far above any real machine, and within every integer type on the way
MAX_COST_USD = 1e9


@dataclass(frozen=True)
class Limits:
    max_attributes: int = 128
    max_key_bytes: int = 256
    max_value_bytes: int = 64 * 1024
    max_events: int = 128

    @classmethod
    def from_settings(cls, settings) -> "Limits":
        """The limits the server applies (``TRACEDASH_INGEST_MAX_*``; ``settings``: Django's)."""
        return cls(max_attributes=settings.TRACEDASH_INGEST_MAX_ATTRIBUTES,
                   max_key_bytes=settings.TRACEDASH_INGEST_MAX_KEY_BYTES,
                   max_value_bytes=settings.TRACEDASH_INGEST_MAX_VALUE_BYTES)


class FieldError(Exception):
    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Every integer below 2**53 is exactly a float: from it on a decoded float may differ from the number
# written (1764504000123456789.0), so such values are read again from the JSON text (``_exact``).
EXACT_FLOAT_LIMIT = 2**53


class _NotFast(Exception):
    """The batch needs the per-item path (a key or value the fast bounds cannot accept, a float time)."""


def whole_number(value, field: str) -> int:
    """A JSON number with an integral value (``812``, ``812.0``, ``70e9``, exact ``Decimal``) as an
    int; a fraction is refused naming the field."""
    kind = type(value)
    if kind is int:
        return value
    if kind is float:
        if not value.is_integer():
            raise FieldError(field, f"expected a whole number, got {value!r}")
        if abs(value) >= EXACT_FLOAT_LIMIT:
            raise _NotFast  # not reached for fields whose float form is bounded by EXACT_FLOAT_LIMIT
        return int(value)
    if kind is Decimal:
        if not value.is_finite() or value != value.to_integral_value():
            raise FieldError(field, f"expected a whole number, got {value}")
        return int(value)
    raise FieldError(field, f"expected a whole number, got {kind.__name__}")


def parse_time_ns(value, field: str) -> int:
    """RFC 3339 text (nanosecond precision kept) or integer unix nanoseconds (any JSON notation of a
    whole number: a float time is read exactly from its text by the per-item path, ``_exact``)."""
    if _is_int(value):
        ns = value
    elif type(value) is float:
        raise _NotFast  # unix nanoseconds are above 2**53: the decoded float may not be the number sent
    elif type(value) is Decimal:
        ns = whole_number(value, field)
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


def _too_long(text: str, max_bytes: int) -> bool:
    # Characters are at most 4 UTF-8 bytes: encode only when the character count cannot decide.
    n = len(text)
    return n > max_bytes or (n * 4 > max_bytes and len(text.encode()) > max_bytes)


def flatten_attributes(value, field: str, limits: Limits) -> dict[str, str]:
    """A JSON object -> flat ``{str: str}``; nested objects become dotted keys, lists JSON text,
    booleans ``true``/``false``, numbers their JSON form, null an empty string."""
    if not value:
        if value is None or value == {}:
            return {}
    if type(value) is not dict:
        raise FieldError(field, f"expected an object of key/value pairs, got {type(value).__name__}")
    max_key, max_value, max_count = limits.max_key_bytes, limits.max_value_bytes, limits.max_attributes
    # Fast path, the common case: a flat map of short strings needs no copy and no encoding.
    if (len(value) <= max_count and all(type(v) is str for v in value.values())
            and max(map(len, value.values())) * 4 <= max_value and max(map(len, value)) * 4 <= max_key):
        return value
    out: dict[str, str] = {}
    stack = [("", value, 0)]
    while stack:
        prefix, obj, depth = stack.pop()
        if depth > 8:
            raise FieldError(field, "nested more than 8 levels deep")
        for key, item in obj.items():
            full = prefix + key if prefix else key
            kind = type(item)
            if kind is str:
                text = item
            elif kind is dict:
                stack.append((full + ".", item, depth + 1))
                continue
            elif kind is bool:
                text = "true" if item else "false"
            elif kind is int:
                text = str(item)
            elif kind is float:
                text = repr(item)  # JSON numbers are finite; repr is their JSON form
            elif item is None:
                text = ""
            elif kind is list:
                text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
            else:
                raise FieldError(f"{field}.{full}", f"unsupported value type {kind.__name__}")
            if _too_long(full, max_key):
                raise FieldError(f"{field}.{full[:40]}…", f"key longer than {max_key} bytes")
            if _too_long(text, max_value):
                raise FieldError(f"{field}.{full}", f"value longer than {max_value} bytes")
            out[full] = text
        if len(out) > max_count:
            raise FieldError(field, f"more than {max_count} attributes")
    return out


# --- what a span says of a cache in front of the model (``spans.cache``, docs/otlp.md "Caches") ---
CACHE_NONE, CACHE_MISS, CACHE_HIT = 0, 1, 2
# Boolean attributes, first present wins: tracedash's own, then the names instrumented apps and
# gateways set on the span that looked the answer up (no OpenTelemetry convention exists yet).
CACHE_HIT_KEYS = ("tracedash.cache.hit", "gen_ai.cache.hit", "cache.hit")
# Gateways that answer from their own cache say so in a response header; OpenTelemetry HTTP client
# instrumentations capture it as ``http.response.header.<name>`` (a list of strings) when told to.
# Statuses not listed (Portkey's DISABLED, REFRESH: no lookup was made) say nothing.
CACHE_STATUS_HEADERS = {
    "http.response.header.x-portkey-cache-status": {"HIT": CACHE_HIT, "SEMANTIC HIT": CACHE_HIT,
                                                    "MISS": CACHE_MISS, "SEMANTIC MISS": CACHE_MISS},
    "http.response.header.helicone-cache": {"HIT": CACHE_HIT, "MISS": CACHE_MISS},
}
_TRUE, _FALSE = frozenset(("true", "1")), frozenset(("false", "0"))


def _cache_flag(value) -> bool | None:
    """A boolean attribute as sent: a bool, 1/0, or its text (``true``/``false``, any case, as the
    native API flattens a JSON boolean); None for anything else."""
    kind = type(value)
    if kind is bool:
        return value
    if kind is int and value in (0, 1):
        return bool(value)
    if kind is str:
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return None


def _header_value(value) -> str:
    """A captured header (a list of strings, or that list as JSON text once flattened) as its first value."""
    if isinstance(value, str) and value.startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, list):
        value = value[0] if value else ""
    return value.split(",")[0].strip().upper() if isinstance(value, str) else ""


def _mentions_cache(attributes) -> bool:
    """Whether any cache attribute is there: the five lookups written out, ~0.1 µs a span whatever
    its number of attributes (the common span says nothing of a cache; bench/cache_figures.py)."""
    return ("tracedash.cache.hit" in attributes or "gen_ai.cache.hit" in attributes or "cache.hit" in attributes
            or "http.response.header.x-portkey-cache-status" in attributes
            or "http.response.header.helicone-cache" in attributes)


assert {*CACHE_HIT_KEYS, *CACHE_STATUS_HEADERS} == {"tracedash.cache.hit", "gen_ai.cache.hit", "cache.hit",
                                                    "http.response.header.x-portkey-cache-status",
                                                    "http.response.header.helicone-cache"}, "update _mentions_cache"


def cache_state(attributes) -> int:
    """``spans.cache`` of a span's attributes (raw OTLP values or the native API's flattened text):
    ``CACHE_HIT`` when a cache answered, ``CACHE_MISS`` when one was consulted and missed,
    ``CACHE_NONE`` when the span says nothing of a cache. A cache-hit attribute that is not a
    boolean rejects the span, naming the attribute (an unset value, null or "", says nothing)."""
    if not attributes or not _mentions_cache(attributes):
        return CACHE_NONE
    for key in CACHE_HIT_KEYS:
        value = attributes.get(key)
        if value is None or value == "":
            continue
        hit = _cache_flag(value)
        if hit is None:
            raise FieldError(f"attributes.{key}", f"expected a boolean (true or false), got {str(value)[:64]!r}")
        return CACHE_HIT if hit else CACHE_MISS
    for key, statuses in CACHE_STATUS_HEADERS.items():
        value = attributes.get(key)
        if value is not None:
            state = statuses.get(_header_value(value))
            if state is not None:
                return state
    return CACHE_NONE


Hex32 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{32}\\Z")]
Hex16 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{16}\\Z")]
Label = Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)]
Milliseconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_DURATION_MS)]
Cost = Annotated[float, msgspec.Meta(ge=0, le=MAX_COST_USD)]
# Integer fields also take a float (a JSON number written 812.0 or 70e9); ``whole_number`` then
# refuses a fraction (a float above 2**53 is first read again exactly from the item's text).
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_UINT32)] | Annotated[float, msgspec.Meta(ge=0, le=MAX_UINT32)]
Time = int | float | str
Phase = Literal["network", "preprocess", "inference", "postprocess", "other"]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)] | Annotated[float, msgspec.Meta(ge=0, le=MAX_BYTES)]
GpuIndex = Annotated[int, msgspec.Meta(ge=-1, le=1024)] | Annotated[float, msgspec.Meta(ge=-1, le=1024)]


class EventIn(msgspec.Struct):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
    time: Time
    attributes: dict[str, Any] | None = None


class SpanIn(msgspec.Struct):
    trace_id: Hex32
    span_id: Hex16
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]
    start_time: Time
    parent_span_id: str | None = None
    end_time: Time | None = None
    duration_ms: Milliseconds | None = None
    phase: Phase | None = None
    service: Label | None = None
    model: Label | None = None
    status: Literal["ok", "error"] | None = None
    status_message: str | None = None
    ttft_ms: Milliseconds | None = None
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    cost_usd: Cost | None = None
    attributes: dict[str, Any] | None = None
    resource_attributes: dict[str, Any] | None = None
    resource: dict[str, Any] | None = None
    events: list[EventIn] | None = None


class BatchIn(msgspec.Struct):
    """The envelope: each item is kept raw and decoded on its own, for per-item errors."""

    spans: list[msgspec.Raw]


class ProcessIn(msgspec.Struct):
    pid: Count
    gpu_memory: Bytes
    name: Label = ""


class ResourceSampleIn(msgspec.Struct):
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
    time: Time
    gpu_index: GpuIndex = -1
    gpu_uuid: Label = ""
    gpu_name: Label = ""
    gpu_utilization: Percent | None = None
    gpu_memory_used: Bytes | None = None
    gpu_memory_total: Bytes | None = None
    gpu_temperature: Annotated[float, msgspec.Meta(ge=-100, le=300)] | None = None
    gpu_power_watts: Annotated[float, msgspec.Meta(ge=0, le=100_000)] | None = None
    cpu_percent: Percent | None = None
    memory_used: Bytes | None = None
    memory_total: Bytes | None = None
    processes: Annotated[list[ProcessIn], msgspec.Meta(max_length=1024)] | None = None


class SamplesIn(msgspec.Struct):
    samples: list[msgspec.Raw]


_span_decoder = msgspec.json.Decoder(SpanIn)
_sample_decoder = msgspec.json.Decoder(ResourceSampleIn)
# Untyped, every non-integer JSON number as an exact Decimal of its text.
_exact_decoder = msgspec.json.Decoder(float_hook=Decimal)


def _exact(raw) -> dict:
    """The item's JSON with every number written with a fraction or exponent as an exact Decimal."""
    return _exact_decoder.decode(raw)
_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`$")


def _decode_item(decoder, raw, *, kind: str):
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH.search(text)
        path = match.group(1) if match else ""
        message = text[: match.start()] if match else text
        missing = _MISSING.match(message)
        if missing:  # "Object missing required field `x`": the field at fault is x
            path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        raise FieldError(path or kind, message) from None
    except RecursionError:
        raise FieldError(kind, "nested too deeply") from None
    except msgspec.DecodeError as exc:  # only reachable for hand-built Raw values
        raise FieldError(kind, str(exc)) from None


class EnvelopeError(Exception):
    def __init__(self, code: str, message: str):
        self.code = code
        self.message = message
        super().__init__(message)


def decode_envelope(body: bytes, envelope, *, name: str) -> list:
    """The list of raw items of a batch, or EnvelopeError naming what is wrong with the envelope."""
    try:
        return getattr(msgspec.json.decode(body, type=envelope), name)
    except RecursionError:
        raise EnvelopeError("invalid_json", "JSON is nested too deeply") from None
    except msgspec.ValidationError as exc:
        raise EnvelopeError("invalid_payload", f'expected a JSON object like {{"{name}": [...]}}: {exc}') from None
    except msgspec.DecodeError as exc:
        raise EnvelopeError("invalid_json", f"body is not valid JSON: {exc}") from None


def parse_span(raw, *, project_id: int, limits: Limits) -> dict:
    """One native JSON span (raw JSON bytes) -> a row of ``store.schema.SPANS`` (raises FieldError)."""
    span = _decode_item(_span_decoder, raw, kind="span")
    if type(span.start_time) is float or type(span.end_time) is float or (
            span.events and any(type(event.time) is float for event in span.events)):
        exact = _exact(raw)
        if type(span.start_time) is float:
            span.start_time = exact["start_time"]
        if type(span.end_time) is float:
            span.end_time = exact["end_time"]
        for event, sent in zip(span.events or (), exact.get("events") or ()):
            if type(event.time) is float:
                event.time = sent["time"]
    resource, resource_field = ((span.resource_attributes, "resource_attributes") if span.resource_attributes is not None
                                else (span.resource, "resource"))
    return _span_row(span, project_id, limits, flatten_attributes(span.attributes, "attributes", limits),
                     flatten_attributes(resource, resource_field, limits))


# The columns of a span row, in the order of ``_span_values``' tuple.
SPAN_COLUMNS = (
    "project_id",
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "phase",
    "phase_fallback",
    "cache",
    "service",
    "model",
    "start_time",
    "duration_ns",
    "status",
    "status_message",
    "ttft_ns",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "attributes",
    "resource_attributes",
    "event_times",
    "event_names",
    "event_attributes",
)
# Their ClickHouse types, in that order (the insert's Arrow table: ingest.parse_pool builds it).
SPAN_TYPES = tuple({c.name: c.type for c in SPANS.insert_columns}[name] for name in SPAN_COLUMNS)


def _span_values(span, project_id: int, limits: Limits, attributes: dict, resource: dict) -> tuple:
    """The checks msgspec cannot express, then the store row's values in ``SPAN_COLUMNS`` order
    (``span`` is a decoded SpanIn or FastSpanIn; the attribute maps are already flat). A tuple, not
    a dict: the native fast path builds its batch's columns from these (``parse_span_columns``)."""
    parent = span.parent_span_id or ""
    if parent:
        if not _HEX16.match(parent) or parent == "0" * 16:
            raise FieldError("parent_span_id", "expected 16 lowercase hex characters, not all zero, or null for a root span")
        if parent == span.span_id:
            raise FieldError("parent_span_id", "a span cannot be its own parent")
    if span.trace_id == "0" * 32:
        raise FieldError("trace_id", "must not be all zero")
    if span.span_id == "0" * 16:
        raise FieldError("span_id", "must not be all zero")
    if not span.name.strip():
        raise FieldError("name", "must not be empty")

    start_ns = parse_time_ns(span.start_time, "start_time")
    if span.end_time is not None:
        end_ns = parse_time_ns(span.end_time, "end_time")
        if end_ns < start_ns:
            raise FieldError("end_time", "is before start_time")
        duration_ns = end_ns - start_ns
        if duration_ns > MAX_DURATION_NS:
            raise FieldError("end_time", "more than 7 days after start_time")
    elif span.duration_ms is not None:
        duration_ns = round(span.duration_ms * 1_000_000)
    else:
        raise FieldError("end_time", "either end_time or duration_ms is required")
    message = span.status_message or ""
    if len(message) > limits.max_value_bytes:
        raise FieldError("status_message", f"longer than {limits.max_value_bytes} characters")

    event_times, event_names, event_attributes = [], [], []
    if span.events:
        if len(span.events) > limits.max_events:
            raise FieldError("events", f"more than {limits.max_events} events")
        for i, event in enumerate(span.events):
            event_times.append(parse_time_ns(event.time, f"events[{i}].time"))
            event_names.append(event.name)
            event_attributes.append(flatten_attributes(event.attributes, f"events[{i}].attributes", limits))
    return (
        project_id,
        span.trace_id,
        span.span_id,
        parent,
        span.name,
        span.phase or "other",
        0 if span.phase else 1,  # no phase given: part of a model call it lies beneath
        cache_state(attributes),
        span.service or "unknown",
        span.model or "",
        start_ns,
        duration_ns,
        span.status or "ok",
        message,
        None if span.ttft_ms is None else round(span.ttft_ms * 1_000_000),
        whole_number(span.input_tokens, "input_tokens") if span.input_tokens is not None else None,
        whole_number(span.output_tokens, "output_tokens") if span.output_tokens is not None else None,
        None if span.cost_usd is None else float(span.cost_usd),
        attributes,
        resource,
        event_times,
        event_names,
        event_attributes,
    )


def _span_row(span, project_id: int, limits: Limits, attributes: dict, resource: dict) -> dict:
    """``_span_values`` as the store row (a mapping of ``SPAN_COLUMNS``)."""
    return dict(zip(SPAN_COLUMNS, _span_values(span, project_id, limits, attributes, resource)))


# --- the fast path: a whole valid batch in one decode ------------------------------------------
# Most batches are entirely valid and their attribute maps flat. For them, one msgspec decode of
# the whole body into typed structs replaces a decode per item; types and the attribute count are
# checked in C, key and value lengths in Python (len() of a str is free, where msgspec would count
# the characters of every prompt): at most a quarter of the byte limits, as a character is at most
# 4 UTF-8 bytes. Anything the fast path refuses (a nested map, a list value, a long value that
# might still fit the byte limit, any span msgspec rejects) sends the batch through the per-item
# path, which names the item and field at fault. Both paths produce identical rows.


def _fast_decoder(limits: Limits):
    # String lengths are checked in Python (``_flat_texts``: len() of a str is free), not by
    # msgspec, which counts the characters of every value (a scan of each prompt).
    flat = Annotated[dict[str, str | int | float | bool | None], msgspec.Meta(max_length=limits.max_attributes)] | None

    # Built with defstruct: the limits are settings, and this module's annotations are strings.
    fast_span = msgspec.defstruct("FastSpanIn", [("attributes", flat, None), ("resource_attributes", flat, None),
                                                 ("resource", flat, None)], bases=(SpanIn,), gc=False)
    fast_batch = msgspec.defstruct("FastBatchIn", [("spans", list[fast_span])], gc=False)
    return msgspec.json.Decoder(fast_batch)


_fast_decoders: dict[Limits, msgspec.json.Decoder] = {}


def _scalar_text(value) -> str:
    """A JSON scalar as flatten_attributes writes it."""
    kind = type(value)
    if kind is str:
        return value
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        return repr(value)
    return ""  # None


def _flat_texts(mapping: dict | None, max_key: int, max_value: int) -> dict:
    if not mapping:
        return {}
    all_text = True
    for key, value in mapping.items():
        if len(key) > max_key:
            raise _NotFast
        if type(value) is str:
            if len(value) > max_value:
                raise _NotFast
        else:
            all_text = False
    return mapping if all_text else {k: _scalar_text(v) for k, v in mapping.items()}


def parse_span_columns(body: bytes, *, project_id: int, limits: Limits,
                       max_items: int | None = None) -> tuple[Columns, list]:
    """A native JSON batch -> (rows as ``store.Columns`` of ``SPAN_COLUMNS``, rejected), rejected as
    ``{"index", "field", "message"}``: what the ingest endpoint hands to the writer. The fast path
    builds each span's values as a tuple and the columns in one transposition, never a dict per
    span (the dicts' building and freeing were a fifth of the parse, and the writer then took
    them apart again column by column for its insert).

    Raises EnvelopeError when the body is not a batch at all, and ``TooManyItems`` when it holds
    more than ``max_items`` spans (checked before any span is validated)."""
    decoder = _fast_decoders.get(limits)
    if decoder is None:
        decoder = _fast_decoders[limits] = _fast_decoder(limits)
    try:
        spans = decoder.decode(body).spans
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        spans = None
    if spans is not None:
        _check_count(len(spans), max_items)
        max_key, max_value = limits.max_key_bytes // 4, limits.max_value_bytes // 4

        def parse(span):
            resource = span.resource_attributes if span.resource_attributes is not None else span.resource
            return _span_values(span, project_id, limits, _flat_texts(span.attributes, max_key, max_value),
                                _flat_texts(resource, max_key, max_value))

        try:
            values, rejected = parse_each(spans, parse)
        except _NotFast:
            pass
        else:
            return Columns.from_tuples(SPAN_COLUMNS, values), rejected
    items = decode_envelope(body, BatchIn, name="spans")
    _check_count(len(items), max_items)
    rows, rejected = parse_each(items, lambda raw: parse_span(raw, project_id=project_id, limits=limits))
    return Columns.from_rows(SPAN_COLUMNS, rows), rejected


def parse_spans(body: bytes, *, project_id: int, limits: Limits, max_items: int | None = None) -> tuple[list, list]:
    """``parse_span_columns`` with the rows as mappings (one per span)."""
    columns, rejected = parse_span_columns(body, project_id=project_id, limits=limits, max_items=max_items)
    return columns.rows(), rejected


def parse_each(items, parse) -> tuple[list, list]:
    """``parse`` applied to each item: (rows, rejected), a rejection naming the item's index."""
    rows, rejected = [], []
    for index, item in enumerate(items):
        try:
            rows.append(parse(item))
        except FieldError as exc:
            rejected.append({"index": index, "field": exc.field, "message": exc.message})
    return rows, rejected


class TooManyItems(Exception):
    def __init__(self, count: int, maximum: int):
        self.count = count
        self.maximum = maximum
        super().__init__(f"{count} items, at most {maximum}")


def _check_count(count: int, maximum: int | None) -> None:
    if maximum is not None and count > maximum:
        raise TooManyItems(count, maximum)


def parse_resource_sample(raw, *, project_id: int) -> dict:
    """One native JSON resource sample -> a row of ``store.schema.RESOURCE_SAMPLES``."""
    sample = _decode_item(_sample_decoder, raw, kind="sample")
    exact: list = []

    def whole(value, field: str, *path):
        """An integer field written as a float (``70e9``): its whole value, exact above 2**53."""
        if value >= EXACT_FLOAT_LIMIT:
            if not exact:
                exact.append(_exact(raw))
            value = exact[0]
            for key in path:
                value = value[key]
        number = whole_number(value, field)
        if number > MAX_BYTES:  # the float bound let 2**63 through
            raise FieldError(field, f"must be at most {MAX_BYTES}")
        return number

    if type(sample.time) is float:
        sample.time = whole(sample.time, "time", "time")
    for name in ("gpu_index", "gpu_memory_used", "gpu_memory_total", "memory_used", "memory_total"):
        value = getattr(sample, name)
        if type(value) is float:
            setattr(sample, name, whole(value, name, name))
    processes = sample.processes or []
    for i, process in enumerate(processes):
        if type(process.pid) is float:
            process.pid = whole(process.pid, f"processes[{i}].pid", "processes", i, "pid")
        if type(process.gpu_memory) is float:
            process.gpu_memory = whole(process.gpu_memory, f"processes[{i}].gpu_memory", "processes", i, "gpu_memory")
    if (sample.gpu_memory_used is not None and sample.gpu_memory_total is not None
            and sample.gpu_memory_used > sample.gpu_memory_total):
        raise FieldError("gpu_memory_used", "exceeds gpu_memory_total")
    if sample.memory_used is not None and sample.memory_total is not None and sample.memory_used > sample.memory_total:
        raise FieldError("memory_used", "exceeds memory_total")
    return {
        "project_id": project_id,
        "time": parse_time_ns(sample.time, "time"),
        "host": sample.host,
        "gpu_index": sample.gpu_index,
        "gpu_uuid": sample.gpu_uuid,
        "gpu_name": sample.gpu_name,
        "gpu_utilization": sample.gpu_utilization,
        "gpu_memory_used": sample.gpu_memory_used,
        "gpu_memory_total": sample.gpu_memory_total,
        "gpu_temperature": sample.gpu_temperature,
        "gpu_power_watts": sample.gpu_power_watts,
        "cpu_percent": sample.cpu_percent,
        "memory_used": sample.memory_used,
        "memory_total": sample.memory_total,
        "process_pids": [p.pid for p in processes],
        "process_names": [p.name for p in processes],
        "process_gpu_memory": [p.gpu_memory for p in processes],
    }


# --- engine samples (POST /api/v1/engine_samples) -------------------------------------------------
class EngineSampleIn(msgspec.Struct):
    time: Time
    metric: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    value: Annotated[float, msgspec.Meta(ge=0, le=1e15)]
    host: Label = ""
    engine: Annotated[str, msgspec.Meta(max_length=64)] = ""
    target: Label = ""
    model: Label = ""
    le: float | str | None = None


_engine_sample_decoder = msgspec.json.Decoder(EngineSampleIn)


def _bucket_bound(value, field: str) -> float:
    if isinstance(value, str):
        if value.strip().lower() in ("+inf", "inf"):
            return float("inf")
        raise FieldError(field, 'must be a number of seconds or "+Inf"')
    if not value > 0:  # also false for NaN
        raise FieldError(field, "must be above 0")
    return float(value)


def engine_sample_row(sample: dict, *, project_id: int) -> dict:
    """An engine sample in ``agent.engines`` form (the API's fields, ``time`` already parsed or
    not) -> a row of ``store.schema.ENGINE_SAMPLES``; FieldError naming what is wrong. The one check
    of the native endpoint and of OTLP metrics: known metric, ``le`` exactly for histogram buckets,
    KV-cache usage a percentage."""
    from agent.engines import HISTOGRAM, METRICS, SUM_SUFFIX

    metric = sample["metric"]
    base = metric[: -len(SUM_SUFFIX)] if metric.endswith(SUM_SUFFIX) else metric
    kind = METRICS.get(base, (None,))[0]
    if kind is None or (base != metric and kind != HISTOGRAM):
        raise FieldError("metric", f"unknown engine metric {metric!r} (docs/engines.md lists them)")
    value = float(sample["value"])
    le = sample.get("le")
    if kind == HISTOGRAM and base == metric:
        if le is None:
            raise FieldError("le", f"{metric} is a histogram: each sample is a bucket and needs its le")
        le = _bucket_bound(le, "le")
        if value != int(value):
            raise FieldError("value", "a bucket count must be a whole number")
    elif le is not None:
        raise FieldError("le", f"only histogram buckets have le; {metric} is a {kind}")
    else:
        le = 0.0
    if metric == "kv_cache_usage" and value > 100:
        raise FieldError("value", "kv_cache_usage is a percentage (0..100)")
    return {
        "project_id": project_id,
        "time": parse_time_ns(sample["time"], "time"),
        "host": sample.get("host") or "",
        "engine": (sample.get("engine") or "").lower(),
        "target": sample.get("target") or "",
        "model": sample.get("model") or "",
        "metric": metric,
        "le": le,
        "value": value,
    }


def parse_engine_sample(raw, *, project_id: int) -> dict:
    """One native JSON engine sample -> a row of ``store.schema.ENGINE_SAMPLES``."""
    sample = _decode_item(_engine_sample_decoder, raw, kind="sample")
    if type(sample.time) is float:  # unix nanoseconds written 1.7e18: read exactly from the text
        sample.time = whole_number(_exact(raw)["time"], "time")
    return engine_sample_row(msgspec.structs.asdict(sample), project_id=project_id)
