"""OpenAPI 3.1 description of the ingest API, served (public, no key) at ``/api/openapi.json``.

The item schemas (``Span``, ``Event``, ``ResourceSample``, ``Process``) are derived from the msgspec
structs that validate the payloads (``ingest.schemas``), so types, patterns and ranges cannot drift
from what the server checks; this module only renames them, adds titles and descriptions (the
README's "Sending traces" table) and documents the rules that code, not the structs, enforces.
The document is built once per process.
"""

from __future__ import annotations

import copy
import functools
import json

import msgspec
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from .http import ApiError
from .schemas import (_RFC3339, MAX_DURATION_NS, MAX_LABEL_CHARS, MAX_NAME_CHARS, MAX_TIME_NS, MIN_TIME_NS, Limits,
                      EngineSampleIn, ResourceSampleIn, SpanIn)
from .scores import DATA_TYPES, MAX_CATEGORY_CHARS, SOURCES, ScoreIn

REF = "#/components/schemas/{name}"
JSON = "application/json"
PROTOBUF = "application/x-protobuf"

# msgspec struct name -> component name
_RENAMES = {"SpanIn": "Span", "EventIn": "Event", "ResourceSampleIn": "ResourceSample", "ProcessIn": "Process",
            "EngineSampleIn": "EngineSample", "ScoreIn": "Score"}

_LIMITS = Limits()
_TIME = ("RFC 3339 text (nanoseconds kept), e.g. `2026-11-30T12:00:00.200Z`, or integer unix nanoseconds "
         "(any JSON notation of a whole number, e.g. `1.7960400002e18`, read exactly); "
         "between 2000-01-01 and 2200-01-01")
_ATTRIBUTES = (f"Object; nested objects become dotted keys, lists JSON text, all values strings (at most "
               f"{_LIMITS.max_attributes} keys, keys ≤ {_LIMITS.max_key_bytes} bytes, values ≤ "
               f"{_LIMITS.max_value_bytes // 1024} KiB, nested at most 8 levels deep).")

# Every `integer` field takes a JSON number with a whole value in any notation (`812`, `812.0`, `70e9`);
# a fraction is refused naming the field (JSON Schema's `integer` means exactly that).
_DESCRIPTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "Span": (
        "One span. Each span of a batch is validated on its own: a bad one is listed in `rejected` "
        "and the others are stored. Unknown fields are ignored. The project is the key's, whatever "
        "the payload says.",
        {
            "trace_id": "Trace id: 32 lowercase hex characters, not all zero.",
            "span_id": "Span id: 16 lowercase hex characters, not all zero.",
            "parent_span_id": "The parent span's id: 16 lowercase hex characters, or `null`/absent (or empty) "
                              "for the root span. A span cannot be its own parent.",
            "name": f"Span name: required, non-empty (not only whitespace), at most {MAX_NAME_CHARS} characters.",
            "start_time": f"Start of the span: {_TIME}.",
            "end_time": f"End of the span: {_TIME}; not before `start_time`. Either `end_time` or "
                        f"`duration_ms` is required (`end_time` wins when both are sent).",
            "duration_ms": f"Duration in milliseconds, non-negative, at most {MAX_DURATION_NS // 10**9 // 86400} "
                           f"days; may replace `end_time`.",
            "phase": "`network`, `preprocess`, `inference`, `postprocess` or `other` (default; a span sent "
                     "without a phase beneath a model call counts as part of it, `inference`).",
            "service": f"Service name (defaults to `unknown`), at most {MAX_LABEL_CHARS} characters.",
            "model": f"Model name, at most {MAX_LABEL_CHARS} characters.",
            "status": "`ok` (default) or `error`.",
            "status_message": f"The error's text, at most {_LIMITS.max_value_bytes} characters.",
            "ttft_ms": "Time to first token in milliseconds; a non-negative number. Absent means unknown, never 0.",
            "input_tokens": "Input (prompt) tokens; a non-negative whole number (`812` or `812.0`, not `812.5`). "
                            "Absent means unknown, never 0.",
            "output_tokens": "Output (completion) tokens; a non-negative whole number. Absent means unknown, never 0.",
            "cost_usd": "Cost in US dollars; a non-negative number. Absent means unknown, never 0.",
            "attributes": "The span's attributes. " + _ATTRIBUTES + " On the span that consulted a cache in front of "
                          "the model, the boolean `tracedash.cache.hit` says whether the cache answered (`true`) or "
                          "missed (`false`); any other value rejects the span (optional `tracedash.cache.name`).",
            "resource_attributes": "Attributes of the resource (process, host) that produced the span. " + _ATTRIBUTES,
            "resource": "Alias of `resource_attributes`, used when `resource_attributes` is absent.",
            "events": f"Events within the span (at most {_LIMITS.max_events}), each `{{\"name\", \"time\", "
                      f"\"attributes\"}}`.",
        },
    ),
    "Event": (
        "A point in time within a span, e.g. `first_token`. Unknown fields are ignored.",
        {
            "name": f"Event name: non-empty, at most {MAX_LABEL_CHARS} characters.",
            "time": f"When it happened: {_TIME}.",
            "attributes": "The event's attributes. " + _ATTRIBUTES,
        },
    ),
    "ResourceSample": (
        "One resource sample: host-level (CPU, memory; `gpu_index` -1) or one GPU's. Each sample of a "
        "batch is validated on its own. Unknown fields are ignored.",
        {
            "host": f"Host name: required, non-empty, at most {MAX_LABEL_CHARS} characters.",
            "time": f"When the sample was taken: {_TIME}.",
            "gpu_index": "The GPU's index on the host, or -1 (default) for a host-level sample.",
            "gpu_uuid": f"The GPU's UUID, at most {MAX_LABEL_CHARS} characters.",
            "gpu_name": f"The GPU's model name, at most {MAX_LABEL_CHARS} characters.",
            "gpu_utilization": "GPU utilization in percent, 0 to 100.",
            "gpu_memory_used": "GPU memory in use, in bytes (a whole number, e.g. `70000000000` or `70e9`); not more "
                               "than `gpu_memory_total` when both are sent.",
            "gpu_memory_total": "GPU memory, in bytes.",
            "gpu_temperature": "GPU temperature in degrees Celsius, -100 to 300.",
            "gpu_power_watts": "GPU power draw in watts, 0 to 100000.",
            "cpu_percent": "Host CPU utilization in percent, 0 to 100.",
            "memory_used": "Host memory in use, in bytes; not more than `memory_total` when both are sent.",
            "memory_total": "Host memory, in bytes.",
            "processes": "Processes holding GPU memory (at most 1024).",
        },
    ),
    "Score": (
        "A score of a trace, or of one span of it (docs/scores.md): a number, true/false or a category, with "
        "where it came from. A score without `id` gets one derived from (trace_id, span_id, name, source, author): "
        "sending it again replaces the earlier one. A trace of any age can be scored. Unknown fields are ignored.",
        {
            "trace_id": "The trace scored: 32 lowercase hex characters, not all zero.",
            "span_id": "The span scored (16 lowercase hex characters); absent or null for the trace as a whole.",
            "name": "What is scored, e.g. `quality`, `user.feedback`, `judge.correct`: 1 to 200 characters.",
            "value": "A JSON number (numeric; finite), `true`/`false` (boolean) or non-empty text of at most "
                     f"{MAX_CATEGORY_CHARS} characters (categorical).",
            "data_type": "Optional: `numeric`, `boolean` or `categorical`; it must fit `value` (inferred when absent).",
            "source": "Where it came from: `api` (default), `sdk`, `annotation` (a reviewer) or `eval` (an evaluator).",
            "comment": "Free text, at most 4096 characters.",
            "author": f"Who gave it (a reviewer, an evaluator's name), at most {MAX_LABEL_CHARS} characters.",
            "id": "Your id of the score, 1 to 128 characters: a score sent again with the same id replaces the "
                  "earlier one.",
            "time": f"When the score was given: {_TIME}. Default: when the server received it.",
        },
    ),
    "EngineSample": (
        "One value of one inference-engine metric (vLLM, TGI, SGLang) of one engine instance at one time, "
        "under tracedash's metric names (docs/engines.md). Gauges are the value at that time; counters and "
        "histogram buckets are cumulative since the engine started. Unknown fields are ignored.",
        {
            "time": f"When the sample was taken: {_TIME}.",
            "metric": "A metric name of docs/engines.md: a gauge (`requests_running`, `requests_waiting`, "
                      "`requests_swapped`, `kv_cache_usage` in percent 0..100), a counter (`preemptions`, "
                      "`prompt_tokens`, `generation_tokens`, `requests_succeeded`, `requests_failed`, `requests`), a "
                      "histogram bucket (`ttft_seconds`, `e2e_seconds`, `queue_seconds`, `inter_token_seconds`, with "
                      "`le`) or a histogram's sum (the same name + `_sum`, seconds).",
            "value": "The value: non-negative; a bucket's cumulative count is a whole number.",
            "host": f"The host the engine runs on, at most {MAX_LABEL_CHARS} characters.",
            "engine": "The engine: `vllm`, `tgi`, `sglang` or your own label, at most 64 characters.",
            "target": f"The engine instance, e.g. its /metrics URL, at most {MAX_LABEL_CHARS} characters.",
            "model": f"The model the engine serves, at most {MAX_LABEL_CHARS} characters.",
            "le": "Histogram buckets only (required there): the bucket's upper bound in seconds, above 0, or "
                  "`\"+Inf\"` for the count.",
        },
    ),
    "Process": (
        "A process holding GPU memory. Unknown fields are ignored.",
        {
            "pid": "Process id, 0 to 4294967295.",
            "gpu_memory": "GPU memory the process holds, in bytes.",
            "name": f"Process name, at most {MAX_LABEL_CHARS} characters.",
        },
    ),
}

_ERROR_CODES = {
    400: "`invalid_json`, `invalid_utf8`, `invalid_payload` (not an object with the list; `details` names it), "
         "`invalid_spans` / `invalid_samples` (every item was rejected; `details` lists them like `rejected`), "
         "`bad_gzip`, `bad_content_length`",
    401: "`missing_key`, `bad_authorization`, `invalid_key` (unknown or revoked)",
    405: "`method_not_allowed`",
    413: "`body_too_large` (over the body limit, 10 MiB by default, also after gunzip; a gzip bomb is "
         "stopped without inflating it), `too_many_items` (over the item limit, 10,000 by default)",
    415: "`unsupported_media_type` (wrong `Content-Type`), `unsupported_encoding` (a `Content-Encoding` "
         "other than gzip)",
    429: "`rate_limited`: the key sent more items per second than allowed",
    503: "`overloaded`, `spool_full`, `store_unavailable`: the data was not stored; retry later",
}


def _rename_refs(node):
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                name = value.rsplit("/", 1)[-1]
                value = REF.format(name=_RENAMES.get(name, name))
            out[key] = _rename_refs(value)
        return out
    if isinstance(node, list):
        return [_rename_refs(item) for item in node]
    return node


def _branches(prop: dict) -> list[dict]:
    return prop["anyOf"] if "anyOf" in prop else [prop]


def _branch(prop: dict, type_: str) -> dict:
    return next(b for b in _branches(prop) if b.get("type") == type_)


def _integer_only(prop: dict) -> None:
    """An integer field's struct type is ``int | float`` (a float is taken when its value is whole,
    ``812.0`` or ``70e9``); JSON Schema's ``integer`` already means any number with no fraction, so
    the schema shows the integer branch alone."""
    branches = prop.get("anyOf")
    if branches and any(b.get("type") == "integer" for b in branches):
        kept = [b for b in branches if b.get("type") != "number"]
        if len(kept) == 1:
            prop.pop("anyOf")
            prop.update(kept[0])
        else:
            prop["anyOf"] = kept


def _item_schemas() -> dict[str, dict]:
    _, components = msgspec.json.schema_components([SpanIn, ResourceSampleIn, EngineSampleIn, ScoreIn],
                                                   ref_template=REF)
    schemas = {_RENAMES[name]: _rename_refs(schema) for name, schema in components.items()}
    for schema in schemas.values():
        for prop in schema.get("properties", {}).values():
            _integer_only(prop)
    for name, (description, fields) in _DESCRIPTIONS.items():
        schema = schemas[name]
        missing = set(schema["properties"]) ^ set(fields)
        if missing:  # a field added to a struct needs its description here
            raise RuntimeError(f"OpenAPI descriptions and {name} fields differ: {sorted(missing)}")
        schema["title"] = name
        schema["description"] = description
        schema["additionalProperties"] = True  # unknown fields are ignored
        for field, text in fields.items():
            schema["properties"][field] = {"title": field, "description": text, **schema["properties"][field]}

    # Rules the code enforces beyond the structs' types.
    for name, fields in (("Span", ("start_time", "end_time")), ("Event", ("time",)), ("ResourceSample", ("time",)),
                         ("EngineSample", ("time",)), ("Score", ("time",))):
        for field in fields:
            prop = schemas[name]["properties"][field]
            _branch(prop, "integer").update(minimum=MIN_TIME_NS, exclusiveMaximum=MAX_TIME_NS)
            _branch(prop, "string")["pattern"] = _RFC3339.pattern
    span = schemas["Span"]["properties"]
    _branch(span["parent_span_id"], "string")["pattern"] = "^([0-9a-f]{16})?$"
    _branch(span["status_message"], "string")["maxLength"] = _LIMITS.max_value_bytes
    _branch(span["duration_ms"], "number")["maximum"] = MAX_DURATION_NS / 1_000_000
    _branch(span["events"], "array")["maxItems"] = _LIMITS.max_events
    for field in ("attributes", "resource_attributes", "resource"):
        _branch(span[field], "object")["maxProperties"] = _LIMITS.max_attributes
    _branch(schemas["Event"]["properties"]["attributes"], "object")["maxProperties"] = _LIMITS.max_attributes
    score = schemas["Score"]["properties"]
    _branch(score["data_type"], "string")["enum"] = list(DATA_TYPES)
    _branch(score["source"], "string")["enum"] = list(SOURCES)
    score["value"]["anyOf"] = [{"type": "number"}, {"type": "boolean"},
                               {"type": "string", "minLength": 1, "maxLength": MAX_CATEGORY_CHARS}]
    return schemas


def _error_response(status: int, summary: str, *headers: str) -> dict:
    response = {
        "description": f"{summary}. Codes: {_ERROR_CODES[status]}.",
        "content": {JSON: {"schema": {"$ref": REF.format(name="Error")}}},
    }
    if headers:
        response["headers"] = {h: {"$ref": f"#/components/headers/{h}"} for h in headers}
    return response


# Every ingest endpoint takes the key as Bearer or as the secret half of a Basic key pair (ingest.auth).
INGEST_SECURITY = [{"bearerAuth": []}, {"basicAuth": []}]


def _native_operation(*, summary: str, description: str, field: str, item: str, operation_id: str) -> dict:
    return {
        "tags": ["native"],
        "operationId": operation_id,
        "summary": summary,
        "description": description,
        "security": INGEST_SECURITY,
        "parameters": [{"$ref": "#/components/parameters/ContentEncoding"}],
        "requestBody": {
            "required": True,
            "description": f"A JSON object with the list of {field} (unknown top-level fields are ignored); "
                           f"gzip-compressed when sent with `Content-Encoding: gzip`.",
            "content": {JSON: {"schema": {
                "type": "object",
                "required": [field],
                "additionalProperties": True,
                "properties": {field: {
                    "type": "array",
                    "description": f"At most 10,000 {field} by default (`TRACEDASH_INGEST_MAX_SPANS`).",
                    "items": {"$ref": REF.format(name=item)},
                }},
            }}},
        },
        "responses": {
            "200": {
                "description": f"Every valid {item} is stored (a 200 means they are in ClickHouse or in the "
                               f"server's fsync'd spool); invalid ones are listed by index in `rejected`.",
                "content": {JSON: {"schema": {"$ref": REF.format(name="IngestResult")}}},
            },
            "400": _error_response(400, f"Malformed request, or every {item} was rejected"),
            **_ingest_errors(),
        },
    }


def _ingest_errors() -> dict:
    """The error answers every ingest endpoint shares (besides its own 400)."""
    return {
        "401": _error_response(401, "Missing, malformed, unknown or revoked key", "WWW-Authenticate"),
        "405": _error_response(405, "Not a POST", "Allow"),
        "413": _error_response(413, "Body or batch too large"),
        "415": _error_response(415, "Wrong content type or encoding"),
        "429": _error_response(429, "Rate limited", "Retry-After"),
        "503": _error_response(503, "The store cannot take the write now", "Retry-After"),
    }


def _otlp_operation(*, signal: str, request: str, response: str, operation_id: str, note: str = "") -> dict:
    return {
        "tags": ["otlp"],
        "operationId": operation_id,
        "summary": f"OTLP/HTTP {signal} export",
        "description": f"An OpenTelemetry `{request}`, as protobuf or in OTLP's JSON mapping (see docs/otlp.md "
                       f"for how it maps onto tracedash's fields). Same key, body limits and gzip support as the "
                       f"native API. Refused spans, data points or log records (malformed ones) are counted in the "
                       f"response's `partial_success`.{note}",
        "security": INGEST_SECURITY,
        "parameters": [{"$ref": "#/components/parameters/ContentEncoding"}],
        "requestBody": {
            "required": True,
            "description": f"`{request}` (opentelemetry-proto).",
            "content": {PROTOBUF: {}, JSON: {}},
        },
        "responses": {
            "200": {
                "description": f"`{response}`, in the request's encoding.",
                "content": {PROTOBUF: {}, JSON: {}},
            },
            "400": _error_response(400, "Malformed request (code `invalid_otlp` for a body that does not decode)"),
            **_ingest_errors(),
        },
    }


def _trace_read_operation() -> dict:
    """``GET /api/v1/traces/<id>`` (served by ``dashboard.trace_views.trace_api``)."""
    ns = {"type": "integer", "description": "nanoseconds"}
    return {
        "tags": ["read"],
        "operationId": "getTrace",
        "summary": "Read one trace",
        "description": "The trace's spans (one per span id, depth-first: the root's tree, other parentless spans, "
                       "then orphans) with their tree position, self time and critical-path time, and the "
                       "per-trace figures of docs/definitions.md. A project key reads its project's traces; a logged-in "
                       "session reads the traces of the user's projects (`?project=<id>` picks one).",
        "security": [{"bearerAuth": []}, {"basicAuth": []}, {}],
        "parameters": [
            {"name": "trace_id", "in": "path", "required": True, "description": "32 lowercase hex characters.",
             "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"}},
            {"name": "spans", "in": "query", "required": False,
             "description": "`columns`: spans as `{\"fields\": [...], \"rows\": [[...], ...]}` (a third of the size).",
             "schema": {"type": "string", "enum": ["columns"]}},
            {"name": "project", "in": "query", "required": False,
             "description": "Session callers: the project to look in (a project you are a member of).",
             "schema": {"type": "integer"}},
        ],
        "responses": {
            "200": {"description": "The trace.", "content": {JSON: {"schema": {
                "type": "object",
                "required": ["trace_id", "project_id", "summary", "phases", "flags", "critical_path", "spans",
                             "genai_events", "scores"],
                "properties": {
                    "trace_id": {"type": "string"}, "project_id": {"type": "integer"},
                    "summary": {"type": "object", "description": "E2E (`e2e_ns`), `ttft_ns`, `tpot_ns`, tokens, "
                                "`cost_usd` and `cost_estimated`, `status`, `error_message`, `span_count`, "
                                "`phase_ns` (exclusive time per phase), `root_name`, `service`, `model`."},
                    "phases": {"type": "array", "items": {"type": "object", "properties": {
                        "phase": {"type": "string"}, "ns": ns, "share": {"type": ["number", "null"]}}}},
                    "flags": {"type": "array", "items": {"type": "string"},
                              "description": "Rules of thumb broken (inference > 60 %, network > 200 ms)."},
                    "critical_path": {"type": "array", "items": {"type": "object", "properties": {
                        "span_id": {"type": "string"}, "start_ns": ns, "end_ns": ns}}},
                    "spans": {"description": "Span objects (or columns with `?spans=columns`): the span's fields "
                              "(`phase` as the figures count it; `reported_phase`: the phase it was sent with "
                              "where that differs, as for a span without a stated phase beneath a model call) "
                              "plus `depth`, `self_ns`, `child_count`, `orphan`, `extra_root`, `critical_ns`, "
                              "`on_critical_path`, `skew_note`, `events` as `{time_ns, name, attributes}`, and "
                              "`genai_events`: the GenAI events sent for the span as OTLP log records "
                              "(`POST /v1/logs`), oldest first, as `{span_id, time_ns, name, severity, body, "
                              "attributes}` (`body`: the record's body as sent, a string or a JSON value)."},
                    "genai_events": {"type": "array", "items": {"type": "object"},
                                     "description": "GenAI events of the trace that name none of its spans (no "
                                                    "span id, or a span that has not arrived), as in `spans`."},
                    "scores": {"type": "array", "items": {"type": "object"},
                               "description": "The scores of the trace and of its spans (docs/scores.md), oldest "
                                              "first, as `{trace_id, span_id ('' = the trace), name, id, data_type, "
                                              "value (a number, true/false or the category), source, author, "
                                              "comment, time_ms}`."},
                },
            }}}},
            "400": _error_response(400, "Not a trace id"),
            "401": _error_response(401, "Neither a key nor a logged-in session", "WWW-Authenticate"),
            "404": {"description": "No such trace in the key's project (or the user's projects): code `not_found`.",
                    "content": {JSON: {"schema": {"$ref": REF.format(name="Error")}}}},
            "503": _error_response(503, "The store cannot be read now", "Retry-After"),
        },
    }


def _build() -> dict:
    schemas = _item_schemas()
    schemas["IngestResult"] = {
        "title": "IngestResult",
        "description": "The answer to a batch: how many items were stored, and the rejected ones by index.",
        "type": "object",
        "required": ["accepted", "rejected"],
        "properties": {
            "accepted": {"type": "integer", "minimum": 0, "description": "Items stored."},
            "rejected": {
                "type": "array",
                "description": "Items that were not stored, in batch order.",
                "items": {
                    "type": "object",
                    "required": ["index", "field", "message"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0, "description": "Position in the batch."},
                        "field": {"type": "string", "description": "The field at fault, e.g. `span_id`, "
                                  "`events[0].time`, `attributes.http.route`; the item kind (`span`, `sample`) "
                                  "when the item is not an object."},
                        "message": {"type": "string", "minLength": 1, "description": "What is wrong with it."},
                    },
                },
            },
        },
        "example": {"accepted": 1, "rejected": [
            {"index": 1, "field": "span_id", "message": "Expected `str` matching regex '^[0-9a-f]{16}$'"}]},
    }
    schemas["Error"] = {
        "title": "Error",
        "description": "Every error answer of the ingest API.",
        "type": "object",
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {"type": "string", "description": "Stable, machine-readable code, e.g. `invalid_json`."},
                "message": {"type": "string", "minLength": 1, "description": "What went wrong, for people."},
                "details": {
                    "type": "array",
                    "description": "Per-field problems (e.g. every rejected item of an `invalid_spans` answer); "
                                   "often empty.",
                    "items": {
                        "type": "object",
                        "required": ["field", "message"],
                        "properties": {
                            "index": {"type": "integer", "minimum": 0},
                            "field": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    },
                },
            },
        }},
        "example": {"error": {"code": "invalid_json", "message": "body is not valid JSON: ...", "details": []}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tracedash ingest API",
            "version": "1",
            "description": "Send spans and resource samples to tracedash: the native JSON API (`/api/v1/...`) "
                           "or OTLP/HTTP (`/v1/...`). Every request carries the project's ingest key as "
                           "`Authorization: Bearer <key>`, or as HTTP Basic with the key pair `<public key>:<key>` "
                           "(the public key is the key's prefix `td_…`, as Settings lists it). Errors are JSON, "
                           "`{\"error\": {\"code\", \"message\", "
                           "\"details\"}}`.",
        },
        "tags": [
            {"name": "native", "description": "tracedash's JSON format."},
            {"name": "otlp", "description": "OpenTelemetry OTLP/HTTP."},
            {"name": "read", "description": "Reading traces back."},
        ],
        "paths": {
            "/api/v1/traces": {"post": _native_operation(
                operation_id="ingestTraces", summary="Send spans", field="spans", item="Span",
                description="A JSON batch of spans. Valid spans are stored and the answer lists the rejected "
                            "ones by index; when every span is rejected the answer is a 400 `invalid_spans`.")},
            "/api/v1/resources": {"post": _native_operation(
                operation_id="ingestResources", summary="Send resource samples", field="samples",
                item="ResourceSample",
                description="A JSON batch of host and GPU resource samples. Valid samples are stored and the "
                            "answer lists the rejected ones by index; when every sample is rejected the answer "
                            "is a 400 `invalid_samples`.")},
            "/api/v1/engine_samples": {"post": _native_operation(
                operation_id="ingestEngineSamples", summary="Send inference engines' metric samples", field="samples",
                item="EngineSample",
                description="A JSON batch of inference-engine samples (what the agent's `--scrape` sends). Valid "
                            "samples are stored and the answer lists the rejected ones by index; when every "
                            "sample is rejected the answer is a 400 `invalid_samples`.")},
            "/api/v1/scores": {"post": _native_operation(
                operation_id="ingestScores", summary="Send scores of traces and spans", field="scores", item="Score",
                description="A JSON batch of scores (numeric, boolean or categorical) of traces or spans, e.g. an "
                            "evaluator's verdicts or users' feedback (docs/scores.md). Valid scores are stored and "
                            "the answer lists the rejected ones by index; when every score is rejected the answer "
                            "is a 400 `invalid_scores`.")},
            "/v1/traces": {"post": _otlp_operation(
                signal="traces", request="ExportTraceServiceRequest", response="ExportTraceServiceResponse",
                operation_id="otlpTraces")},
            "/api/public/otel/v1/traces": {"post": _otlp_operation(
                signal="traces", request="ExportTraceServiceRequest", response="ExportTraceServiceResponse",
                operation_id="langfuseOtlpTraces",
                note=" The same endpoint as `/v1/traces`, at the path the Langfuse SDK (v3+) exports to: set "
                     "`LANGFUSE_HOST` to this server, `LANGFUSE_PUBLIC_KEY` to the key's prefix (`td_…`) and "
                     "`LANGFUSE_SECRET_KEY` to the key.")},
            "/v1/metrics": {"post": _otlp_operation(
                signal="metrics", request="ExportMetricsServiceRequest", response="ExportMetricsServiceResponse",
                operation_id="otlpMetrics")},
            "/v1/logs": {"post": _otlp_operation(
                signal="logs", request="ExportLogsServiceRequest", response="ExportLogsServiceResponse",
                operation_id="otlpLogs")},
            "/api/v1/traces/{trace_id}": {"get": _trace_read_operation()},
            "/api/openapi.json": {"get": {
                "tags": ["native"],
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": {"200": {"description": "The OpenAPI document.",
                                      "content": {JSON: {"schema": {"type": "object"}}}}},
            }},
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The project's ingest key (shown once when the project or key is created).",
                },
                "basicAuth": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "A key pair, as the Langfuse SDK sends it: user name the key's public prefix "
                                   "(`td_` and 12 hex characters, listed in Settings), password the ingest key. "
                                   "A pair whose halves do not belong together is refused (401 `invalid_key`).",
                },
            },
            "parameters": {"ContentEncoding": {
                "name": "Content-Encoding",
                "in": "header",
                "required": False,
                "description": "`gzip` for a gzip-compressed body; absent or `identity` for none. Anything else "
                               "is a 415 `unsupported_encoding`.",
                "schema": {"type": "string", "enum": ["gzip", "identity"]},
            }},
            "headers": {
                "Retry-After": {"description": "Seconds to wait before retrying.",
                                "schema": {"type": "integer", "minimum": 1}},
                "WWW-Authenticate": {"description": "`Bearer`, with `error=\"invalid_token\"` for an unknown key; "
                                                    "`Basic realm=\"tracedash\"` for a malformed or mismatched Basic pair.",
                                     "schema": {"type": "string"}},
                "Allow": {"description": "`POST`.", "schema": {"type": "string"}},
            },
        },
    }


@functools.cache
def _document() -> dict:
    return _build()


@functools.cache
def _document_bytes() -> bytes:
    return json.dumps(_document(), ensure_ascii=False, separators=(",", ":")).encode()


def document() -> dict:
    """The OpenAPI document (built once; each caller gets its own copy)."""
    return copy.deepcopy(_document())


@csrf_exempt
def openapi_json(request):
    """``GET /api/openapi.json``: the document, public (it describes the API, not any project's data)."""
    if request.method not in ("GET", "HEAD"):
        return ApiError(405, "method_not_allowed", "use GET", headers={"Allow": "GET, HEAD"}).response()
    return HttpResponse(_document_bytes(), content_type=JSON)


__all__ = ["document", "openapi_json"]
