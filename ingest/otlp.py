"""OTLP/HTTP: decode ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` /
``ExportLogsServiceRequest`` (protobuf or OTLP's JSON mapping) and map them onto tracedash's rows.

Both encodings are first turned into the same plain form (``OtlpSpan``, ``OtlpPoint``,
``OtlpLogRecord``), so the mapping rules exist once. The rules (documented in docs/otlp.md):

- service: resource ``service.name`` (``unknown`` when absent); a Langfuse SDK span whose resource
  has only OpenTelemetry's default ``unknown_service…`` is ``langfuse``.
- phase: ``tracedash.phase`` when it names a phase; else a model call (``gen_ai.operation.name`` of
  chat/text_completion/generate_content/embeddings, or any ``gen_ai.request.model``, or
  OpenInference kind LLM/EMBEDDING) is ``inference``; OpenInference RETRIEVER/RERANKER are
  ``preprocess``, GUARDRAIL/EVALUATOR ``postprocess``; Langfuse's ``langfuse.observation.type``
  (``LANGFUSE_PHASES``); a CLIENT span with HTTP/RPC attributes and no ``gen_ai.*`` is ``network``;
  everything else ``other``.
- model: ``gen_ai.response.model``, ``gen_ai.request.model``, ``llm.model_name``, ``embedding.model_name``,
  ``langfuse.observation.model.name``.
- tokens: ``gen_ai.usage.input_tokens``/``output_tokens`` (also the older ``prompt_tokens``/
  ``completion_tokens``), ``llm.token_count.prompt``/``completion``, else Langfuse's
  ``langfuse.observation.usage_details`` (JSON: ``input``/``output``, ``prompt_tokens``/``completion_tokens``
  or ``input_tokens``/``output_tokens``).
- TTFT: ``gen_ai.response.time_to_first_chunk`` or OpenLIT's ``gen_ai.server.time_to_first_token``
  (seconds), else the offset of a ``first_token`` or OpenInference ``First Token Stream Event`` event,
  else Langfuse's ``langfuse.observation.completion_start_time`` minus the span's start.
- cost: ``gen_ai.usage.cost``, ``llm.cost.total`` (USD), else Langfuse's
  ``langfuse.observation.cost_details`` (JSON: ``total``, else the sum of its entries, as Langfuse sums them).
- cache: ``tracedash.cache.hit``, ``gen_ai.cache.hit``, ``cache.hit`` (booleans), else a gateway's
  captured cache-status header (Portkey, Helicone): ``ingest.schemas.cache_state``, as for native spans.
- status: OTLP ``STATUS_CODE_ERROR``, or Langfuse's ``langfuse.observation.level`` ``ERROR``, is
  ``error`` with the status message (OTLP's, else ``langfuse.observation.status_message``).
- logs: only GenAI events (event name ``gen_ai.*``, from the record's ``event_name`` or its
  ``event.name`` attribute, or any ``gen_ai.*`` attribute) of a trace are kept, as ``span_logs``
  rows; other log records are accepted and dropped.
"""

from __future__ import annotations

import base64
import json
import re
import math
from dataclasses import dataclass, field
from decimal import Decimal

from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.logs.v1.logs_pb2 import SeverityNumber

from agent.engines import Sample as EngineSample
from agent.engines import is_engine_metric
from agent.engines import samples_rows as engine_samples_rows

from .schemas import (MAX_BYTES, MAX_COST_USD, MAX_DURATION_NS, MAX_LABEL_CHARS, MAX_NAME_CHARS, PHASES, FieldError,
                      Limits, cache_state, engine_sample_row, flatten_attributes, parse_time_ns)

PROTOBUF = "application/x-protobuf"
SPAN_KIND_CLIENT = 3
STATUS_CODE_ERROR = 2
MODEL_OPERATIONS = {"chat", "text_completion", "generate_content", "embeddings", "completion"}
OPENINFERENCE_PHASES = {"LLM": "inference", "EMBEDDING": "inference", "RETRIEVER": "preprocess",
                        "RERANKER": "preprocess", "GUARDRAIL": "postprocess", "EVALUATOR": "postprocess"}
# The OpenInference span kinds that state what a span is; those not above (the app's own steps
# around the model: chains, tools, agents, prompts, decisions) are ``other``. UNKNOWN states nothing.
OPENINFERENCE_KINDS = frozenset(OPENINFERENCE_PHASES) | {"CHAIN", "TOOL", "AGENT", "PROMPT", "DECISION"}
# Langfuse SDK (v3+) observation types (``langfuse.observation.type``), consulted after the
# OpenInference kind: generations and embeddings are the model call, retrievers build the prompt,
# guardrails and evaluators judge the answer; the rest (span, agent, tool, chain, event) is the app's.
LANGFUSE_PHASES = {"generation": "inference", "embedding": "inference", "retriever": "preprocess",
                   "guardrail": "postprocess", "evaluator": "postprocess", "span": "other", "agent": "other",
                   "tool": "other", "chain": "other", "event": "other"}
LANGFUSE_SCOPE = "langfuse-sdk"  # the Langfuse SDK's tracer name
LANGFUSE_USAGE = "langfuse.observation.usage_details"
LANGFUSE_COST = "langfuse.observation.cost_details"
LANGFUSE_COMPLETION_START = "langfuse.observation.completion_start_time"
# usage_details keys, first found wins: Langfuse's own names, then the OpenAI chat and Responses API
# usage objects the langfuse.openai wrapper passes through unchanged. Other usage types (cached,
# audio, reasoning…) stay in the attribute and are not added in. Named as the attribute's dotted
# keys (``_json_object_attribute``), so an error names the attribute and the entry.
LANGFUSE_INPUT_TOKENS = tuple(f"{LANGFUSE_USAGE}.{k}" for k in ("input", "prompt_tokens", "input_tokens"))
LANGFUSE_OUTPUT_TOKENS = tuple(f"{LANGFUSE_USAGE}.{k}" for k in ("output", "completion_tokens", "output_tokens"))
MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "embedding.model_name",
              "langfuse.observation.model.name")
INPUT_TOKEN_KEYS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_TOKEN_KEYS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
# TTFT in seconds as an attribute: the GenAI conventions' streaming attribute, then OpenLIT's.
TTFT_SECONDS_KEYS = ("gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token")
# Span events marking the first streamed token: tracedash's SDK, then OpenInference
# (openinference-instrumentation-openai records "First Token Stream Event").
FIRST_TOKEN_EVENTS = frozenset({"first_token", "First Token Stream Event"})
NETWORK_KEYS = ("http.request.method", "http.method", "url.full", "http.url", "rpc.system", "server.address",
                "net.peer.name")
_HEX = re.compile(r"^[0-9a-fA-F]*$")


class OtlpDecodeError(Exception):
    pass


@dataclass
class OtlpSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    events: list  # (name, time_ns, attributes)
    status_code: int
    status_message: str
    resource: dict
    scope_name: str = ""
    scope_version: str = ""


@dataclass
class OtlpPoint:
    metric: str
    unit: str
    value: float
    time_ns: int
    attributes: dict
    resource: dict = field(default_factory=dict)
    delta: bool = False  # a sum or histogram of delta temporality (engine counters must be cumulative)


@dataclass
class OtlpLogRecord:
    trace_id: str  # hex; '' when the record carries none
    span_id: str
    time_ns: int
    observed_time_ns: int
    severity_number: int
    severity_text: str
    event_name: str
    body: object  # the AnyValue as Python (None: no body)
    attributes: dict
    resource: dict
    scope_name: str = ""
    scope_version: str = ""


# --- AnyValue -> Python ----------------------------------------------------------------------
def _proto_value(value):
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_proto_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _proto_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def _proto_attributes(key_values) -> dict:
    # Most values are strings: read those in place, without a call per attribute.
    return {kv.key: v.string_value if (v := kv.value).WhichOneof("value") == "string_value" else _proto_value(v)
            for kv in key_values}


def _json_value(value):
    if not isinstance(value, dict) or not value:
        return None
    (kind, inner), = list(value.items())[:1]
    if kind in ("stringValue", "bytesValue") and isinstance(inner, (dict, list)):
        # A scalar there is taken as sent; a structure would reach the stores unchecked (and a
        # number in it, a Decimal, could not be written back as JSON).
        raise OtlpDecodeError(f"{kind} must be a string, got {type(inner).__name__}")
    if kind == "stringValue":
        return float(inner) if type(inner) is Decimal else inner
    if kind == "boolValue":
        return bool(inner)
    if kind == "intValue":
        return _json_int(inner, "intValue")
    if kind == "doubleValue":
        return float(inner)
    if kind == "arrayValue":
        return [_json_value(v) for v in (inner or {}).get("values", [])]
    if kind == "kvlistValue":
        return _json_attributes((inner or {}).get("values", []))
    if kind == "bytesValue":
        return float(inner) if type(inner) is Decimal else inner
    return None


def _json_attributes(items) -> dict:
    if not isinstance(items, list):
        raise OtlpDecodeError("attributes must be a list of {key, value}")
    out = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise OtlpDecodeError("an attribute has no string key")
        out[item["key"]] = _json_value(item.get("value"))
    return out


def _json_int(value, what: str) -> int:
    """An OTLP JSON integer: a number with a whole value in any notation (``1764504000123456789``,
    ``1.7645040001234568e18``: read exactly, see ``_json_object``) or a decimal string."""
    if type(value) is Decimal:
        if value != value.to_integral_value():
            raise OtlpDecodeError(f"{what} must be a whole number, got {str(value)[:40]}")
        return int(value)
    if isinstance(value, bool):
        raise OtlpDecodeError(f"{what} is not an integer: {value!r}")
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        raise OtlpDecodeError(f"{what} is not an integer: {str(value)[:40]!r}") from None


def _json_object(body: bytes) -> dict:
    try:
        # Numbers with a fraction or exponent as exact Decimals: a time written 1.7645040001234568e18
        # keeps every digit (a float would not above 2**53); ``_json_int`` refuses a fraction.
        payload = json.loads(body, parse_float=Decimal)
    except RecursionError:
        raise OtlpDecodeError("JSON is nested too deeply") from None
    except ValueError as exc:
        raise OtlpDecodeError(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise OtlpDecodeError("expected a JSON object")
    return payload


def _list(container: dict, key: str) -> list:
    value = container.get(key, [])
    if not isinstance(value, list):
        raise OtlpDecodeError(f"{key} must be a list")
    return value


# --- traces ----------------------------------------------------------------------------------
def _decode(body: bytes, content_type: str, from_proto, from_json, what: str) -> list:
    try:
        return from_proto(body) if content_type == PROTOBUF else from_json(body)
    except RecursionError:
        raise OtlpDecodeError("payload is nested too deeply") from None
    except (AttributeError, TypeError, ValueError) as exc:
        raise OtlpDecodeError(f"malformed OTLP {what} request: {exc}") from None


def _parse_proto(message_class, body: bytes):
    message = message_class()
    try:
        message.ParseFromString(body)
    except ProtobufDecodeError as exc:
        raise OtlpDecodeError(f"body is not a valid {message_class.__name__}: {exc}") from None
    return message


def decode_traces(body: bytes, content_type: str) -> list[OtlpSpan]:
    return _decode(body, content_type, _traces_from_proto, _traces_from_json, "trace")


def _traces_from_proto(body: bytes) -> list[OtlpSpan]:
    request = _parse_proto(ExportTraceServiceRequest, body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _proto_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            for span in scope_spans.spans:
                spans.append(OtlpSpan(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(),
                    name=span.name, kind=span.kind, start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    attributes=_proto_attributes(span.attributes),
                    events=[(e.name, e.time_unix_nano, _proto_attributes(e.attributes)) for e in span.events],
                    status_code=span.status.code, status_message=span.status.message, resource=resource,
                    scope_name=scope.name, scope_version=scope.version,
                ))
    return spans


def _traces_from_json(body: bytes) -> list[OtlpSpan]:
    payload = _json_object(body)
    spans = []
    for resource_spans in _list(payload, "resourceSpans"):
        resource = _json_attributes((resource_spans.get("resource") or {}).get("attributes", []))
        for scope_spans in _list(resource_spans, "scopeSpans"):
            scope = scope_spans.get("scope") or {}
            for span in _list(scope_spans, "spans"):
                if not isinstance(span, dict):
                    raise OtlpDecodeError("a span is not an object")
                status = span.get("status") or {}
                events = [(e.get("name", ""), _json_int(e.get("timeUnixNano"), "event timeUnixNano"),
                           _json_attributes(e.get("attributes", []))) for e in _list(span, "events")]
                spans.append(OtlpSpan(
                    trace_id=str(span.get("traceId", "")), span_id=str(span.get("spanId", "")),
                    parent_span_id=str(span.get("parentSpanId", "") or ""), name=str(span.get("name", "")),
                    kind=_json_int(span.get("kind"), "kind"),
                    start_ns=_json_int(span.get("startTimeUnixNano"), "startTimeUnixNano"),
                    end_ns=_json_int(span.get("endTimeUnixNano"), "endTimeUnixNano"),
                    attributes=_json_attributes(span.get("attributes", [])), events=events,
                    status_code=_json_int(status.get("code"), "status code"), status_message=str(status.get("message", "")),
                    resource=resource, scope_name=str(scope.get("name", "")), scope_version=str(scope.get("version", "")),
                ))
    return spans


def _hex_id(value: str, length: int, field_name: str, *, optional: bool = False) -> str:
    if optional and value in ("", "0" * length):
        return ""
    if len(value) != length or not _HEX.match(value) or value == "0" * length:
        raise FieldError(field_name, f"expected {length} hex characters, not all zero")
    return value.lower()


def _number(attributes: dict, keys: tuple[str, ...], field_name: str, *, integer: bool, maximum: float = 2**32 - 1):
    for key in keys:
        value = attributes.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise FieldError(f"attributes.{key}", "expected a number")
        try:
            number = float(value)
            if integer:  # a whole number in any notation: 812, 812.0, "812", 8.12e2
                if not number.is_integer():
                    raise FieldError(f"attributes.{key}", f"expected a whole number, got {value!r}")
                number = int(value) if type(value) is int else int(number)
        except (ValueError, OverflowError):
            raise FieldError(f"attributes.{key}", "expected a number") from None
        if number < 0 or number != number:
            raise FieldError(f"attributes.{key}", "must be a non-negative number")
        if number > maximum:
            raise FieldError(f"attributes.{key}", f"must not exceed {maximum:g}")
        return number
    return None


def _attributes_with_scope(attributes: dict, scope_name: str, scope_version: str, limits: Limits) -> dict:
    """The attributes flattened to strings, plus the instrumentation scope that sent them."""
    flat = flatten_attributes(attributes, "attributes", limits)
    if scope_name:
        flat = {**flat, "otel.scope.name": scope_name[: limits.max_value_bytes]}
        if scope_version:
            flat["otel.scope.version"] = scope_version[:256]
    return flat


def derive_phase(span: OtlpSpan) -> tuple[str, bool]:
    """(phase, fallback): the phase the span states (``tracedash.phase``, a GenAI operation, an
    OpenInference kind, a Langfuse observation type), else the fallback rules' (an HTTP/RPC client span is ``network``, the
    rest ``other``) with ``fallback`` True: such a span beneath a model call is part of the call."""
    attributes = span.attributes
    explicit = attributes.get("tracedash.phase")
    if explicit in PHASES:
        return explicit, False
    operation = attributes.get("gen_ai.operation.name")
    if operation in MODEL_OPERATIONS or (operation is None and "gen_ai.request.model" in attributes):
        return "inference", False
    if operation is not None:  # a GenAI step that is not the model call: invoke_agent, execute_tool, ...
        return "other", False
    kind = attributes.get("openinference.span.kind")
    if isinstance(kind, str) and kind.upper() in OPENINFERENCE_KINDS:
        return OPENINFERENCE_PHASES.get(kind.upper(), "other"), False
    observation = attributes.get("langfuse.observation.type")
    if isinstance(observation, str) and observation.lower() in LANGFUSE_PHASES:
        return LANGFUSE_PHASES[observation.lower()], False
    if span.kind == SPAN_KIND_CLIENT and not any(k.startswith("gen_ai.") for k in attributes) \
            and any(k in attributes for k in NETWORK_KEYS):
        return "network", True
    return "other", True


def _json_object_attribute(attributes: dict, key: str) -> dict | None:
    """A Langfuse attribute holding a JSON object as text (usage or cost details) as a dict keyed
    ``<key>.<entry>`` (an error then names both), or None when absent; anything else is a FieldError."""
    value = attributes.get(key)
    if value is None:
        return None
    field_name = f"attributes.{key}"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except RecursionError:
            raise FieldError(field_name, "JSON is nested too deeply") from None
        except ValueError:
            raise FieldError(field_name, f"expected a JSON object as text, got {value[:64]!r}") from None
    if not isinstance(value, dict):  # an OTLP map (kvlist) is a dict already
        raise FieldError(field_name, f"expected a JSON object, got {type(value).__name__}")
    return {f"{key}.{name}": entry for name, entry in value.items()}


def _langfuse_cost(cost_details: dict | None) -> float | None:
    """USD from ``langfuse.observation.cost_details``: its ``total``, else the sum of its entries
    (Langfuse sums the usage types when no total is sent); None when it has neither."""
    if not cost_details:
        return None
    total = _number(cost_details, (f"{LANGFUSE_COST}.total",), "cost", integer=False, maximum=MAX_COST_USD)
    if total is not None:
        return total
    parts = [_number(cost_details, (key,), "cost", integer=False, maximum=MAX_COST_USD) for key in cost_details]
    parts = [part for part in parts if part is not None]
    if not parts:
        return None
    if sum(parts) > MAX_COST_USD:
        raise FieldError(f"attributes.{LANGFUSE_COST}", f"the entries add up to more than {MAX_COST_USD:g}")
    return sum(parts)


def _langfuse_completion_start_ns(attributes: dict) -> int | None:
    """``langfuse.observation.completion_start_time`` (when the first token came) in unix ns. The
    SDK writes the time JSON-encoded, quotes included (``"2026-12-02T04:05:01.328723Z"``); plain
    RFC 3339 text is read too."""
    value = attributes.get(LANGFUSE_COMPLETION_START)
    if value is None:
        return None
    field_name = f"attributes.{LANGFUSE_COMPLETION_START}"
    if isinstance(value, str) and value.startswith('"'):
        try:
            value = json.loads(value)
        except ValueError:
            raise FieldError(field_name, f"expected an RFC 3339 time, got {value[:64]!r}") from None
    if not isinstance(value, str):
        raise FieldError(field_name, f"expected an RFC 3339 time as text, got {type(value).__name__}")
    return parse_time_ns(value, field_name)


def _from_langfuse(span: OtlpSpan) -> bool:
    return span.scope_name == LANGFUSE_SCOPE or "langfuse.observation.type" in span.attributes


def _service(span: OtlpSpan) -> str:
    """Resource ``service.name``. The Langfuse SDK names no service, so OpenTelemetry fills in
    ``unknown_service:<executable>``: its spans are then ``langfuse`` (OTEL_SERVICE_NAME names them)."""
    service = span.resource.get("service.name")
    service = service if isinstance(service, str) else ""
    if _from_langfuse(span) and (not service or service == "unknown_service" or service.startswith("unknown_service:")):
        return "langfuse"
    return service[:256] or "unknown"


def _status(span: OtlpSpan) -> tuple[str, str]:
    """(status, message): OTLP's error status, or Langfuse's ``ERROR`` level with its status message."""
    level = span.attributes.get("langfuse.observation.level")
    langfuse_error = isinstance(level, str) and level.upper() == "ERROR"
    if span.status_code != STATUS_CODE_ERROR and not langfuse_error:
        return "ok", span.status_message
    message = span.status_message
    if not message and langfuse_error:
        langfuse_message = span.attributes.get("langfuse.observation.status_message")
        message = langfuse_message if isinstance(langfuse_message, str) else ""
    return "error", message


def span_row(span: OtlpSpan, *, project_id: int, limits: Limits) -> dict:
    trace_id = _hex_id(span.trace_id, 32, "traceId")
    span_id = _hex_id(span.span_id, 16, "spanId")
    parent = _hex_id(span.parent_span_id, 16, "parentSpanId", optional=True)
    if not span.name.strip():
        raise FieldError("name", "must not be empty")
    if len(span.name) > MAX_NAME_CHARS:
        raise FieldError("name", f"longer than {MAX_NAME_CHARS} characters")
    start_ns = parse_time_ns(span.start_ns, "startTimeUnixNano")
    end_ns = parse_time_ns(span.end_ns, "endTimeUnixNano")
    if end_ns < start_ns:
        raise FieldError("endTimeUnixNano", "is before startTimeUnixNano")
    if end_ns - start_ns > MAX_DURATION_NS:
        raise FieldError("endTimeUnixNano", "span longer than 7 days")
    attributes = span.attributes
    model = ""
    for name in MODEL_KEYS:
        if type(value := attributes.get(name)) is str:
            model = value
            break
    ttft_s = _number(attributes, TTFT_SECONDS_KEYS, "ttft", integer=False, maximum=MAX_DURATION_NS / 1e9)
    ttft_ns = None if ttft_s is None else round(ttft_s * 1e9)
    event_times, event_names, event_attributes = [], [], []
    if len(span.events) > limits.max_events:
        raise FieldError("events", f"more than {limits.max_events} events")
    for i, (name, time_ns, event_attrs) in enumerate(span.events):
        at = parse_time_ns(time_ns, f"events[{i}].timeUnixNano")
        if ttft_ns is None and name in FIRST_TOKEN_EVENTS and at >= start_ns:
            ttft_ns = at - start_ns
        event_times.append(at)
        event_names.append(name[:256] or "event")
        event_attributes.append(flatten_attributes(event_attrs, f"events[{i}].attributes", limits))
    completion_start_ns = _langfuse_completion_start_ns(attributes)
    if ttft_ns is None and completion_start_ns is not None and 0 <= completion_start_ns - start_ns <= end_ns - start_ns:
        ttft_ns = completion_start_ns - start_ns  # a first token outside the span is no TTFT of it
    flat = _attributes_with_scope(attributes, span.scope_name, span.scope_version, limits)
    cost = _number(attributes, ("gen_ai.usage.cost", "llm.cost.total"), "cost", integer=False, maximum=MAX_COST_USD)
    phase, phase_fallback = derive_phase(span)
    langfuse_cost = _langfuse_cost(_json_object_attribute(attributes, LANGFUSE_COST))
    # Langfuse's usage entries as dotted keys, after the token attributes: used when those are absent.
    usage = _json_object_attribute(attributes, LANGFUSE_USAGE)
    with_usage = {**attributes, **usage} if usage else attributes
    status, status_message = _status(span)
    return {
        "project_id": project_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": span.name,
        "phase": phase,
        "phase_fallback": int(phase_fallback),
        "cache": cache_state(attributes),  # the same rules as the native API (ingest.schemas)
        "service": _service(span),
        "model": model[:256],
        "start_time": start_ns,
        "duration_ns": end_ns - start_ns,
        "status": status,
        "status_message": status_message[: limits.max_value_bytes],
        "ttft_ns": ttft_ns,
        "input_tokens": _number(with_usage, INPUT_TOKEN_KEYS + LANGFUSE_INPUT_TOKENS, "input_tokens", integer=True),
        "output_tokens": _number(with_usage, OUTPUT_TOKEN_KEYS + LANGFUSE_OUTPUT_TOKENS, "output_tokens", integer=True),
        "cost_usd": langfuse_cost if cost is None else cost,
        "attributes": flat,
        "resource_attributes": _flat_resource(span.resource, limits),
        "event_times": event_times,
        "event_names": event_names,
        "event_attributes": event_attributes,
    }


# The last resource flattened, with its limits and result: the spans of one resource share its
# attributes (one dict, decoded once per request), so they are flattened once, not once per span.
_last_resource: tuple = (None, None, None)


def _flat_resource(resource: dict, limits: Limits) -> dict:
    global _last_resource
    last, last_limits, flat = _last_resource
    if last is resource and last_limits == limits:
        return flat
    flat = flatten_attributes(resource, "resource.attributes", limits)  # FieldError: nothing is kept
    _last_resource = (resource, limits, flat)  # one tuple, replaced whole: safe across threads
    return flat


def _rejections_message(rejected: list[dict], noun: str) -> str:
    """The first five rejections, each naming the item's index in the request and the field at fault."""
    return "; ".join(f"{noun} {r['index']}: {r['field']}: {r['message']}" for r in rejected[:5]) + (
        f" (and {len(rejected) - 5} more)" if len(rejected) > 5 else "")


def trace_response(rejected: list[dict]) -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = len(rejected)
        response.partial_success.error_message = _rejections_message(rejected, "span")
    return response


# --- metrics ---------------------------------------------------------------------------------
def decode_metrics(body: bytes, content_type: str) -> list[OtlpPoint]:
    return _decode(body, content_type, _metrics_from_proto, _metrics_from_json, "metrics")


def _metrics_from_proto(body: bytes) -> list[OtlpPoint]:
    request = _parse_proto(ExportMetricsServiceRequest, body)
    points = []
    for resource_metrics in request.resource_metrics:
        resource = _proto_attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind == "histogram" and is_engine_metric(metric.name):
                    delta = metric.histogram.aggregation_temporality == _DELTA
                    for point in metric.histogram.data_points:
                        points.extend(_histogram_points(
                            metric.name, metric.unit, list(point.explicit_bounds), list(point.bucket_counts),
                            point.sum, point.count, point.time_unix_nano, _proto_attributes(point.attributes),
                            resource, delta))
                    continue
                if kind not in ("gauge", "sum"):
                    continue  # other histograms and summaries carry no figure tracedash keeps
                delta = kind == "sum" and metric.sum.aggregation_temporality == _DELTA
                for point in getattr(metric, kind).data_points:
                    value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                    points.append(OtlpPoint(metric.name, metric.unit, float(value), point.time_unix_nano,
                                            _proto_attributes(point.attributes), resource, delta))
    return points


_DELTA = 1  # AGGREGATION_TEMPORALITY_DELTA


def _json_delta(data: dict) -> bool:
    """Whether an OTLP/JSON sum or histogram is of delta temporality (the enum as its number, as the
    spec asks, or as its name, as some encoders write it)."""
    value = data.get("aggregationTemporality", 0)
    if isinstance(value, str) and not value.strip().isdigit():
        return value == "AGGREGATION_TEMPORALITY_DELTA"
    return _json_int(value, "aggregationTemporality") == _DELTA


def _histogram_points(name: str, unit: str, bounds: list, counts: list, total, count, time_ns, attributes: dict,
                      resource: dict, delta: bool) -> list[OtlpPoint]:
    """An OTLP histogram data point (per-bucket counts) as the Prometheus samples an engine's
    ``/metrics`` shows for it: cumulative ``<name>_bucket`` points with ``le`` (seconds), ``<name>_sum``.
    An OTLP histogram in milliseconds is converted to seconds."""
    scale = 0.001 if unit == "ms" else 1.0
    points = []
    cumulative = 0.0
    for i, bound in enumerate(list(bounds) + [math.inf]):
        cumulative += float(counts[i]) if i < len(counts) else 0.0
        points.append(OtlpPoint(name + "_bucket", unit, cumulative if i < len(bounds) else float(count), time_ns,
                                {**attributes, "le": float(bound) * scale}, resource, delta))
    points.append(OtlpPoint(name + "_sum", unit, float(total or 0.0) * scale, time_ns, attributes, resource, delta))
    return points


def _metrics_from_json(body: bytes) -> list[OtlpPoint]:
    payload = _json_object(body)
    points = []
    for resource_metrics in _list(payload, "resourceMetrics"):
        resource = _json_attributes((resource_metrics.get("resource") or {}).get("attributes", []))
        for scope_metrics in _list(resource_metrics, "scopeMetrics"):
            for metric in _list(scope_metrics, "metrics"):
                name, unit = str(metric.get("name", "")), str(metric.get("unit", ""))
                histogram = metric.get("histogram")
                if isinstance(histogram, dict) and is_engine_metric(name):
                    delta = _json_delta(histogram)
                    for point in _list(histogram, "dataPoints"):
                        try:
                            bounds = [float(b) for b in point.get("explicitBounds") or []]
                            counts = [_json_int(c, "bucketCounts") for c in point.get("bucketCounts") or []]
                            total = float(point.get("sum") or 0.0)
                        except (TypeError, ValueError):
                            raise OtlpDecodeError(f"histogram point of {name!r} has a bound or sum that is not a number") from None
                        points.extend(_histogram_points(
                            name, unit, bounds, counts, total, _json_int(point.get("count", 0), "count"),
                            _json_int(point.get("timeUnixNano"), "timeUnixNano"),
                            _json_attributes(point.get("attributes", [])), resource, delta))
                    continue
                data = metric.get("gauge") or metric.get("sum")
                if not isinstance(data, dict):
                    continue
                delta = data is metric.get("sum") and _json_delta(data)
                for point in _list(data, "dataPoints"):
                    raw = point.get("asDouble", point.get("asInt"))
                    try:
                        value = float(raw)
                    except (TypeError, ValueError):
                        raise OtlpDecodeError(f"data point of {name!r} has no number value") from None
                    points.append(OtlpPoint(name, unit, value, _json_int(point.get("timeUnixNano"), "timeUnixNano"),
                                            _json_attributes(point.get("attributes", [])), resource, delta))
    return points


MAX_GAUGE = 1e15  # above any percentage, temperature, wattage or byte count a host reports (≈ 1 PB)
_BYTES_PER_UNIT = {"By": 1, "B": 1, "KiBy": 2**10, "KiB": 2**10, "MiBy": 2**20, "MiB": 2**20, "MB": 10**6,
                   "GiBy": 2**30, "GiB": 2**30, "GB": 10**9, "KB": 10**3}


def _to_bytes(point: OtlpPoint, default_unit: str) -> int:
    return min(int(point.value * _BYTES_PER_UNIT.get(point.unit or default_unit, 1)), MAX_BYTES)


def _to_percent(point: OtlpPoint, ratio_by_default: bool) -> float:
    unit = point.unit
    if unit == "1" or (not unit and ratio_by_default):
        return point.value * 100.0
    return point.value


def _gpu_index(attributes: dict) -> int | None:
    for key in ("gpu_index", "gpu.index", "hw.gpu.index", "gpu_number"):
        value = attributes.get(key)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    hw_id = attributes.get("hw.id") or attributes.get("gpu_uuid") or attributes.get("uuid")
    if isinstance(hw_id, str):
        match = re.search(r"(\d+)$", hw_id)
        if match:
            return int(match.group(1))
    return 0


# metric name -> (row field, converter); converters take the point
_GPU_METRICS = {
    "hw.gpu.utilization": ("gpu_utilization", lambda p: _to_percent(p, True)),
    "gpu.utilization": ("gpu_utilization", lambda p: _to_percent(p, False)),
    "nvml.gpu.utilization": ("gpu_utilization", lambda p: _to_percent(p, True)),
    "hw.gpu.memory.usage": ("gpu_memory_used", lambda p: _to_bytes(p, "By")),
    "hw.gpu.memory.limit": ("gpu_memory_total", lambda p: _to_bytes(p, "By")),
    "gpu.memory.used": ("gpu_memory_used", lambda p: _to_bytes(p, "MiB")),
    "gpu.memory.total": ("gpu_memory_total", lambda p: _to_bytes(p, "MiB")),
    "hw.gpu.temperature": ("gpu_temperature", lambda p: p.value),
    "gpu.temperature": ("gpu_temperature", lambda p: p.value),
    "hw.gpu.power": ("gpu_power_watts", lambda p: p.value),
    "gpu.power.draw": ("gpu_power_watts", lambda p: p.value),
}


def resource_rows(points: list[OtlpPoint], *, project_id: int) -> tuple[list[dict], list[dict]]:
    """Group gauge points into one ``resource_samples`` row per (host, GPU, timestamp)."""
    rows: dict[tuple, dict] = {}
    cpu_idle: dict[tuple, list[float]] = {}
    memory_states: dict[tuple, dict[str, int]] = {}
    rejected = []
    for index, point in enumerate(points):
        if not 0 <= point.value <= MAX_GAUGE:  # also false for NaN
            rejected.append({"index": index, "field": point.metric,
                             "message": f"value must be a finite number from 0 to {MAX_GAUGE:g}"})
            continue
        try:
            time_ns = parse_time_ns(point.time_ns, "timeUnixNano")
        except FieldError as exc:
            rejected.append({"index": index, "field": f"{point.metric}.timeUnixNano", "message": exc.message})
            continue
        host = point.resource.get("host.name") or point.attributes.get("host.name") or "unknown"
        host = str(host)[:256]
        attributes = point.attributes
        name = point.metric
        if name in _GPU_METRICS or (name in ("hw.temperature", "hw.power") and attributes.get("hw.type") == "gpu"):
            gpu_index = _gpu_index(attributes)
            field_name, convert = _GPU_METRICS.get(name) or (
                ("gpu_temperature", lambda p: p.value) if name == "hw.temperature" else ("gpu_power_watts", lambda p: p.value))
            row = _row(rows, project_id, host, gpu_index if gpu_index is not None else 0, time_ns)
            row[field_name] = convert(point)
            uuid = attributes.get("gpu_uuid") or attributes.get("uuid") or attributes.get("hw.id")
            if isinstance(uuid, str):
                row["gpu_uuid"] = uuid[:256]
            gpu_name = attributes.get("gpu_name") or attributes.get("model") or attributes.get("hw.name")
            if isinstance(gpu_name, str):
                row["gpu_name"] = gpu_name[:256]
        elif name == "system.cpu.utilization":
            state = attributes.get("system.cpu.state", attributes.get("state", attributes.get("cpu.mode")))
            key = (host, time_ns)
            if state is None:
                _row(rows, project_id, host, -1, time_ns)["cpu_percent"] = min(100.0, _to_percent(point, True))
            elif state == "idle":
                cpu_idle.setdefault(key, []).append(point.value)
        elif name == "system.memory.usage":
            state = attributes.get("system.memory.state", attributes.get("state", "used"))
            memory_states.setdefault((host, time_ns), {})[str(state)] = _to_bytes(point, "By")
        elif name == "system.memory.limit":
            _row(rows, project_id, host, -1, time_ns)["memory_total"] = _to_bytes(point, "By")
        # other metrics are not resource gauges tracedash shows: ignored, not rejected
    for (host, time_ns), idles in cpu_idle.items():
        busy = 1.0 - sum(idles) / len(idles)
        _row(rows, project_id, host, -1, time_ns)["cpu_percent"] = max(0.0, min(100.0, busy * 100.0))
    for (host, time_ns), states in memory_states.items():
        row = _row(rows, project_id, host, -1, time_ns)
        row["memory_used"] = states.get("used", 0)
        row["memory_total"] = row["memory_total"] or sum(states.values())
    return list(rows.values()), rejected


def _row(rows: dict, project_id: int, host: str, gpu_index: int, time_ns: int) -> dict:
    key = (host, gpu_index, time_ns)
    row = rows.get(key)
    if row is None:
        row = rows[key] = {
            "project_id": project_id, "time": time_ns, "host": host, "gpu_index": gpu_index, "gpu_uuid": "",
            "gpu_name": "", "gpu_utilization": None, "gpu_memory_used": None, "gpu_memory_total": None,
            "gpu_temperature": None, "gpu_power_watts": None, "cpu_percent": None, "memory_used": None,
            "memory_total": None, "process_pids": [], "process_names": [], "process_gpu_memory": [],
        }
    return row


def _engine_family(name: str) -> str | None:
    """The engine metric family a point belongs to (``x`` for ``x_bucket``/``x_sum`` of a histogram), or None."""
    for suffix in ("_bucket", "_sum"):
        if name.endswith(suffix) and is_engine_metric(name[: -len(suffix)]):
            return name[: -len(suffix)]
    return name if is_engine_metric(name) else None


def engine_rows(points: list[OtlpPoint], *, project_id: int) -> tuple[list[dict], list[dict]]:
    """Points of inference engines' metrics (vLLM, TGI, SGLang names, as an OTel Collector's
    Prometheus receiver forwards them: ``agent.engines.SOURCES``) -> ``engine_samples`` rows, through
    the same catalogue and check as a scrape by the agent. One engine instance is the point's resource
    (``service.instance.id``, else ``service.name``); other points are not engine metrics: ignored."""
    groups: dict[tuple, dict[str, list]] = {}
    first_index: dict[tuple, int] = {}
    rejected = []
    for index, point in enumerate(points):
        family = _engine_family(point.metric)
        if family is None:
            continue
        if point.delta:
            rejected.append({"index": index, "field": point.metric,
                             "message": "delta temporality: engine counters and histograms must be cumulative"})
            continue
        resource = point.resource
        host = str(resource.get("host.name") or point.attributes.get("host.name") or "")[:256]
        target = str(resource.get("service.instance.id") or resource.get("service.name") or "")[:256]
        key = (host, target, point.time_ns)
        first_index.setdefault(key, index)
        labels = {k: str(v) for k, v in point.attributes.items() if isinstance(v, (str, int, float))}
        groups.setdefault(key, {}).setdefault(family, []).append(EngineSample(point.metric, labels, point.value))
    rows = []
    for key, families in groups.items():
        host, target, time_ns = key
        found, _ignored = engine_samples_rows(
            [(name, "histogram" if any(s.name != name for s in samples) else "", samples)
             for name, samples in families.items()],
            time_ns=time_ns, host=host, target=target)
        for row in found:
            try:
                rows.append(engine_sample_row(row, project_id=project_id))
            except FieldError as exc:
                rejected.append({"index": first_index[key], "field": f"{row['metric']}.{exc.field}",
                                 "message": exc.message})
    return rows, rejected


def metrics_response(rejected: list[dict]) -> ExportMetricsServiceResponse:
    response = ExportMetricsServiceResponse()
    if rejected:
        response.partial_success.rejected_data_points = len(rejected)
        response.partial_success.error_message = "; ".join(
            f"point {r['index']}: {r['field']}: {r['message']}" for r in rejected[:5])
    return response


# --- logs ------------------------------------------------------------------------------------
GENAI_PREFIX = "gen_ai."


def decode_logs(body: bytes, content_type: str) -> list[OtlpLogRecord]:
    return _decode(body, content_type, _logs_from_proto, _logs_from_json, "logs")


def _logs_from_proto(body: bytes) -> list[OtlpLogRecord]:
    request = _parse_proto(ExportLogsServiceRequest, body)
    records = []
    for resource_logs in request.resource_logs:
        resource = _proto_attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope
            for record in scope_logs.log_records:
                records.append(OtlpLogRecord(
                    trace_id=record.trace_id.hex(), span_id=record.span_id.hex(), time_ns=record.time_unix_nano,
                    observed_time_ns=record.observed_time_unix_nano, severity_number=record.severity_number,
                    severity_text=record.severity_text, event_name=record.event_name,
                    body=_proto_value(record.body) if record.HasField("body") else None,
                    attributes=_proto_attributes(record.attributes), resource=resource,
                    scope_name=scope.name, scope_version=scope.version,
                ))
    return records


def _json_severity(value) -> int:
    # Protobuf's JSON mapping writes an enum as its number; parsers also take its name.
    if isinstance(value, str) and value.startswith("SEVERITY_NUMBER_"):
        try:
            return SeverityNumber.Value(value)
        except ValueError:
            raise OtlpDecodeError(f"severityNumber {value[:40]!r} is not a severity") from None
    return _json_int(value, "severityNumber")


def _logs_from_json(body: bytes) -> list[OtlpLogRecord]:
    payload = _json_object(body)
    records = []
    for resource_logs in _list(payload, "resourceLogs"):
        resource = _json_attributes((resource_logs.get("resource") or {}).get("attributes", []))
        for scope_logs in _list(resource_logs, "scopeLogs"):
            scope = scope_logs.get("scope") or {}
            for record in _list(scope_logs, "logRecords"):
                if not isinstance(record, dict):
                    raise OtlpDecodeError("a log record is not an object")
                records.append(OtlpLogRecord(
                    trace_id=str(record.get("traceId", "") or ""), span_id=str(record.get("spanId", "") or ""),
                    time_ns=_json_int(record.get("timeUnixNano"), "timeUnixNano"),
                    observed_time_ns=_json_int(record.get("observedTimeUnixNano"), "observedTimeUnixNano"),
                    severity_number=_json_severity(record.get("severityNumber")),
                    severity_text=str(record.get("severityText", "") or ""),
                    event_name=str(record.get("eventName", "") or ""),
                    body=_json_value(record["body"]) if "body" in record else None,
                    attributes=_json_attributes(record.get("attributes", [])), resource=resource,
                    scope_name=str(scope.get("name", "")), scope_version=str(scope.get("version", "")),
                ))
    return records


def log_event_name(record: OtlpLogRecord) -> str:
    """The record's event name: the LogRecord field (OTLP 1.5+), else the ``event.name`` attribute
    that older SDKs (and the Events API before it) set."""
    if record.event_name:
        return record.event_name
    name = record.attributes.get("event.name")
    return name if isinstance(name, str) else ""


def is_genai_event(record: OtlpLogRecord) -> bool:
    """A GenAI event: its name is ``gen_ai.*`` (``gen_ai.user.message``, ``gen_ai.choice``,
    ``gen_ai.client.inference.operation.details``, …), or it carries ``gen_ai.*`` attributes."""
    return log_event_name(record).startswith(GENAI_PREFIX) or any(k.startswith(GENAI_PREFIX) for k in record.attributes)


def _severity(record: OtlpLogRecord) -> str:
    if record.severity_text:
        return record.severity_text[:64]
    if 0 < record.severity_number <= 24:
        return SeverityNumber.Name(record.severity_number).removeprefix("SEVERITY_NUMBER_")  # INFO, WARN2, …
    return ""


def _body_json(value, limits: Limits) -> str:
    """The AnyValue body as JSON text ('' for none), within the attribute value limit."""
    if value is None:
        return ""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or infinity in a double: not JSON
        raise FieldError("body", "holds a number that is not finite") from None
    if len(text.encode()) > limits.max_value_bytes:
        raise FieldError("body", f"longer than {limits.max_value_bytes} bytes")
    return text


def span_log_row(record: OtlpLogRecord, *, project_id: int, limits: Limits) -> dict | None:
    """A ``span_logs`` row for a GenAI event of a trace, or None for a record tracedash does not keep
    (not a GenAI event, or one outside any trace: there is nothing to show it with). A kept record
    that is malformed raises ``FieldError`` naming the field."""
    if not is_genai_event(record):
        return None
    trace_id = _hex_id(record.trace_id, 32, "traceId", optional=True)
    if not trace_id:
        return None
    span_id = _hex_id(record.span_id, 16, "spanId", optional=True)
    # OTLP: a record without a time of its own is placed at the time it was observed.
    time_ns = parse_time_ns(record.time_ns or record.observed_time_ns, "timeUnixNano")
    attributes = _attributes_with_scope(record.attributes, record.scope_name, record.scope_version, limits)
    service = record.resource.get("service.name")
    return {
        "project_id": project_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "time": time_ns,
        "event_name": log_event_name(record)[:MAX_LABEL_CHARS],
        "severity": _severity(record),
        "body": _body_json(record.body, limits),
        "attributes": attributes,
        "service": service[:256] if isinstance(service, str) and service else "unknown",
        "resource_attributes": flatten_attributes(record.resource, "resource.attributes", limits),
    }


def logs_response(rejected: list[dict]) -> ExportLogsServiceResponse:
    response = ExportLogsServiceResponse()
    if rejected:
        response.partial_success.rejected_log_records = len(rejected)
        response.partial_success.error_message = _rejections_message(rejected, "log record")
    return response


def encode_response(message, content_type: str) -> bytes:
    if content_type == PROTOBUF:
        return message.SerializeToString()
    from google.protobuf.json_format import MessageToJson

    return MessageToJson(message, preserving_proto_field_name=False, indent=None).encode()
