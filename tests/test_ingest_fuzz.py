"""Fuzzing the native ingest API (``/api/v1/traces``, ``/api/v1/resources``, ``/api/v1/engine_samples``,
``/api/v1/scores``) from its own OpenAPI
document (``/api/openapi.json``).

Thousands of generated bad requests: schema-driven mutations of valid items (every property of the
served ``Span`` / ``ResourceSample`` schemas, and of their nested ``Event`` / ``Process`` items,
gets a value of a wrong JSON type, out of range, too long, a huge string, a deeply nested object,
or is deleted when required), bad ids, broken bodies, content types, encodings and keys, broken
gzip and gzip bombs, attribute limits at and around their bounds. Every answer must be:

- below 500, ``Content-Type: application/json``;
- an error ``{"error": {"code": str, "message": non-empty str, "details": list}}`` when >= 400;
- when 200, ``{"accepted", "rejected"}`` with each rejected item's ``field`` naming a real property
  (for a mutation: the mutated one) and a non-empty ``message``;
- and nothing partial is stored: each generated item has its own trace id (spans) or host
  (samples); at the end of a test every rejected item has 0 rows, every accepted one exactly 1,
  the table holds nothing else, and nothing waits in the writer's spool (a 200 means "stored").

Each test gets its own ingest writer and spool (``private_writer``), so a poisoned write cannot leak
into other tests. Server bugs this fuzzer found (values too large for the store, ids with a trailing
newline, multi-member gzip, misnamed fields, millisecond overflows) each keep a regression test at
the end of the module (``FINDINGS``).

``TRACEDASH_FUZZ_SCALE`` multiplies every example count (default 1: well under a minute).
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
import re
import secrets
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import pytest
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import ingest.writer as writer_module
from ingest.schemas import EventIn, ProcessIn, ResourceSampleIn, SpanIn
from ingest.scores import ScoreIn
from ingest.spool import Spool
from ingest.writer import IngestWriter
from store import get_store
from tests.spans import llm_trace
from tests.spans import trace_id as new_trace_id

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

JSON = "application/json"
OPENAPI = "/api/openapi.json"
SCALE = float(os.environ.get("TRACEDASH_FUZZ_SCALE", "1"))
VALUE_LIMIT = 64 * 1024  # settings.TRACEDASH_INGEST_MAX_VALUE_BYTES
KEY_LIMIT = 256  # settings.TRACEDASH_INGEST_MAX_KEY_BYTES
KEYS_LIMIT = 128  # settings.TRACEDASH_INGEST_MAX_ATTRIBUTES
MAX_DEPTH = 8  # nested objects below an attributes object
DELETE = object()


def fuzz(examples: int):
    return hypothesis_settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        database=None,  # no .hypothesis/ directory in the working tree
        print_blob=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.data_too_large, HealthCheck.large_base_example,
                               HealthCheck.filter_too_much],
    )


# --- endpoints and valid items ------------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    path: str
    field: str  # the envelope's list: "spans" / "samples"
    schema: str  # the item's component: "Span" / "ResourceSample"
    kind: str  # what "field" says for an item that is not an object
    table: str
    id_column: str  # what makes each generated item's rows findable

    def good_item(self, variant: int = 0) -> dict:
        if self.kind == "span":
            span = llm_trace()[variant % 5]
            span["trace_id"] = new_trace_id()
            return span
        if self.schema == "EngineSample":
            return good_engine_sample(variant)
        if self.schema == "Score":
            return good_score(variant)
        return good_sample()

    def item_id(self, item) -> str:
        return item[self.id_column]


SPANS = Endpoint("/api/v1/traces", "spans", "Span", "span", "spans", "trace_id")
SAMPLES = Endpoint("/api/v1/resources", "samples", "ResourceSample", "sample", "resource_samples", "host")
ENGINE_SAMPLES = Endpoint("/api/v1/engine_samples", "samples", "EngineSample", "sample", "engine_samples", "target")
SCORES = Endpoint("/api/v1/scores", "scores", "Score", "score", "scores", "trace_id")
ENDPOINTS = [pytest.param(SPANS, id="traces"), pytest.param(SAMPLES, id="resources"),
             pytest.param(ENGINE_SAMPLES, id="engines"), pytest.param(SCORES, id="scores")]


def good_score(variant: int = 0) -> dict:
    """A numeric, boolean or categorical score of a trace or of a span, with every optional field
    but ``data_type`` (inferred: a mutated value must be named as the value, not as a mismatch)."""
    value = [4.5, True, "helpful", 0, False][variant % 5]
    score = {"trace_id": new_trace_id(), "name": "quality", "value": value, "source": "eval", "comment": "fine",
             "author": "judge", "id": f"fuzz-{secrets.token_hex(8)}", "time": time.time_ns() - 5 * 10**9}
    if variant % 2:
        score["span_id"] = secrets.token_hex(8)
    return score


def good_engine_sample(variant: int = 0) -> dict:
    """A gauge, a counter, a histogram bucket (finite and +Inf) or a histogram's sum."""
    metric, extra = [("kv_cache_usage", {}), ("preemptions", {}), ("ttft_seconds", {"le": 0.25}),
                     ("e2e_seconds", {"le": "+Inf"}), ("queue_seconds_sum", {})][variant % 5]
    return {"time": time.time_ns() - 5 * 10**9, "host": "gpu-1", "engine": "vllm",
            "target": f"fuzz-{secrets.token_hex(8)}", "model": "llama-3.1-8b", "metric": metric, "value": 42,
            **extra}


def good_sample() -> dict:
    return {
        "host": f"fuzz-{secrets.token_hex(8)}", "time": time.time_ns() - 5 * 10**9, "gpu_index": 0,
        "gpu_uuid": "GPU-0c6f8f2a-55c1-4a3e-9a1e-4d3b2f1e0a9b", "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_utilization": 87.5, "gpu_memory_used": 40 * 2**30, "gpu_memory_total": 80 * 2**30,
        "gpu_temperature": 61.0, "gpu_power_watts": 412.3, "cpu_percent": 23.0,
        "memory_used": 64 * 2**30, "memory_total": 512 * 2**30,
        "processes": [{"pid": 4242, "gpu_memory": 38 * 2**30, "name": "python -m vllm.entrypoints.openai"}],
    }


def valid_nested(name: str) -> dict:
    """A valid item of a nested component (what a list property holds)."""
    if name == "Event":
        return {"name": "first_token", "time": time.time_ns() - 4 * 10**9, "attributes": {"chunk": 1}}
    if name == "Process":
        return {"pid": 7, "gpu_memory": 2**20, "name": "worker"}
    raise AssertionError(f"no valid example for {name}")


# --- requests and the rules every answer follows ---------------------------------------------
@dataclass
class Req:
    path: str
    body: bytes = b""
    content_type: str = JSON
    method: str = "POST"
    headers: dict = field(default_factory=dict)  # WSGI names: HTTP_AUTHORIZATION, CONTENT_LENGTH, ...
    items: list | None = None  # the items sent, when the body is a batch we built

    def describe(self) -> str:
        body = self.body[:600] + (b"..." if len(self.body) > 600 else b"")
        return (f"{self.method} {self.path} Content-Type={self.content_type!r} headers={self.headers!r} "
                f"body ({len(self.body)} bytes)={body!r}")


class Api:
    """Sends requests with the Django test client and checks every answer against the rules."""

    def __init__(self, client: Client, key: str, doc: dict):
        self.client = client
        self.key = key
        self.doc = doc
        schemas = doc["components"]["schemas"]
        self.properties = {name: set(schemas[name]["properties"])
                           for name in ("Span", "ResourceSample", "EngineSample", "Score")}
        self.requests = 0

    def batch(self, endpoint: Endpoint, items: list, **kwargs) -> Req:
        body = json.dumps({endpoint.field: items}).encode()
        return Req(endpoint.path, body, items=items, **kwargs)

    def send(self, req: Req, endpoint: Endpoint, *, auth: bool = True):
        headers = dict(req.headers)
        if auth:
            headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {self.key}")
        self.requests += 1
        response = self.client.generic(req.method, req.path, data=req.body, content_type=req.content_type, **headers)
        return response, self.check(response, req, endpoint)

    def check(self, response, req: Req, endpoint: Endpoint) -> dict:
        status = response.status_code
        where = f"\nrequest: {req.describe()}\nanswer: {status} {response.content[:800]!r}"
        assert status < 500, "server error" + where
        assert response["Content-Type"] == JSON, f"answer is {response['Content-Type']!r}, not JSON" + where
        try:
            body = json.loads(response.content)
        except ValueError:
            raise AssertionError("answer is not valid JSON" + where) from None
        assert isinstance(body, dict), where
        if status >= 400:
            assert set(body) == {"error"}, where
            error = body["error"]
            assert isinstance(error, dict) and set(error) == {"code", "message", "details"}, where
            assert isinstance(error["code"], str) and re.fullmatch(r"[a-z0-9_]+", error["code"]), where
            assert isinstance(error["message"], str) and error["message"].strip(), "empty message" + where
            assert isinstance(error["details"], list), where
            for detail in error["details"]:
                assert isinstance(detail, dict) and isinstance(detail.get("field"), str) and detail["field"], where
                assert isinstance(detail.get("message"), str) and detail["message"].strip(), where
            if error["code"] == f"invalid_{endpoint.field}":
                assert status == 400 and error["details"], where
                self._check_rejected(error["details"], req, endpoint, where)
            required_header = {401: "WWW-Authenticate", 405: "Allow", 429: "Retry-After", 503: "Retry-After"}
            if status in required_header:
                assert response.get(required_header[status]), f"no {required_header[status]} header" + where
            if status in (429, 503):
                assert int(response["Retry-After"]) >= 1, where
            return body
        assert status == 200, "unexpected status" + where
        assert set(body) == {"accepted", "rejected"}, where
        assert isinstance(body["accepted"], int) and body["accepted"] >= 0, where
        assert isinstance(body["rejected"], list), where
        self._check_rejected(body["rejected"], req, endpoint, where)
        if req.items is not None:
            assert body["accepted"] + len(body["rejected"]) == len(req.items), where
        return body

    def _check_rejected(self, rejected: list, req: Req, endpoint: Endpoint, where: str) -> None:
        previous = -1
        for item in rejected:
            assert isinstance(item, dict) and set(item) == {"index", "field", "message"}, where
            assert isinstance(item["index"], int) and item["index"] > previous, where  # batch order, once each
            previous = item["index"]
            if req.items is not None:
                assert item["index"] < len(req.items), where
            assert isinstance(item["message"], str) and item["message"].strip(), "empty message" + where
            assert isinstance(item["field"], str) and item["field"], where
            root = re.match(r"[A-Za-z_][A-Za-z0-9_]*", item["field"])
            assert root and (root.group() in self.properties[endpoint.schema] or item["field"] == endpoint.kind), \
                f"rejected field {item['field']!r} is not a property of {endpoint.schema}" + where


class Ledger:
    """Which generated items must be stored (once) and which must not be stored at all."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.expected: dict[str, int] = {}
        self.contents: dict[str, Callable[[dict], None]] = {}  # id -> check of the stored row

    def expect(self, item_id: str, rows: int, check_row: Callable[[dict], None] | None = None) -> None:
        if not re.fullmatch(r"[0-9a-f]{32}|fuzz-[0-9a-f]{16}", item_id):
            assert rows == 0, f"expected a row for the malformed id {item_id!r}"
            return  # a mutated id: the table's total count covers it
        # Stored ids are fresh each time; a rejected (mutated) id may come back as Hypothesis replays.
        assert item_id not in self.expected or rows == self.expected[item_id] == 0, f"id {item_id!r} twice"
        self.expected[item_id] = rows
        if check_row is not None and rows:
            self.contents[item_id] = check_row

    def record(self, req: Req, body: dict, status: int) -> None:
        """After a batch answer: 200 stores exactly the items not listed as rejected; else nothing."""
        rejected = {r["index"] for r in body.get("rejected", [])} if status == 200 else set(range(len(req.items)))
        for index, item in enumerate(req.items):
            if isinstance(item, dict) and isinstance(item.get(self.endpoint.id_column), str):
                self.expect(self.endpoint.item_id(item), 0 if index in rejected else 1)

    def verify(self) -> None:
        column, table = self.endpoint.id_column, self.endpoint.table
        # The ids travel as one comma-separated String: the chdb backend cannot take a list for an
        # Array(String) parameter (and every tracked id is hex, or "fuzz-" and hex).
        ids = ",".join(self.expected)
        rows = get_store().query(
            f"SELECT toString({column}) AS id, count() AS n FROM {table}"
            f" WHERE has(splitByChar(',', {{ids:String}}), toString({column})) GROUP BY id",
            {"ids": ids}, tag="tests.fuzz").rows if ids else []
        counts = {row[0]: row[1] for row in rows}
        wrong = {i: (n, counts.get(i, 0)) for i, n in self.expected.items() if counts.get(i, 0) != n}
        assert not wrong, f"(expected rows, stored rows) by {column}: {dict(list(wrong.items())[:20])}"
        total = get_store().query(f"SELECT count() FROM {table}", tag="tests.fuzz").scalar()
        assert total == sum(self.expected.values()), f"{table} holds {total} rows, expected {sum(self.expected.values())}"
        if self.contents:
            stored = get_store().query(
                f"SELECT * FROM {table} WHERE has(splitByChar(',', {{ids:String}}), toString({column}))",
                {"ids": ",".join(self.contents)}, tag="tests.fuzz").dicts()
            for row in stored:
                self.contents[row[column]](row)


@pytest.fixture(autouse=True)
def private_writer(tmp_path, monkeypatch):
    """A writer and spool of this test's own: whatever a request breaks stays here."""
    writer = IngestWriter(Spool(tmp_path / "spool" / "slot-0", max_bytes=10**9))
    monkeypatch.setattr(writer_module, "_writer", writer)
    yield writer
    writer.stop(timeout=10)


@pytest.fixture
def api(project_with_key, private_writer):
    _, key = project_with_key()
    client = Client(raise_request_exception=False)
    response = client.get(OPENAPI)  # public: no key
    assert response.status_code == 200 and response["Content-Type"] == JSON
    return Api(client, key, response.json())


def finish(api: Api, ledger: Ledger, writer: IngestWriter) -> None:
    ledger.verify()
    assert writer.spool.pending() == 0, f"acknowledged rows wait in the spool: {writer.health()}"
    print(f"{api.requests} requests, {len(ledger.expected)} items tracked")


# --- the OpenAPI document -----------------------------------------------------------------------
def resolve(doc: dict, ref: str):
    assert ref.startswith("#/"), f"$ref {ref!r} points outside the document"
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"$ref {ref!r} does not resolve"
        node = node[part]
    return node


def walk_refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from walk_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk_refs(item)


def branches(prop: dict) -> list[dict]:
    return prop["anyOf"] if "anyOf" in prop else [prop]


def test_the_openapi_document_describes_the_api(client):
    response = client.get(OPENAPI)
    assert response.status_code == 200 and response["Content-Type"] == JSON
    doc = response.json()
    assert doc["openapi"] == "3.1.0" and doc["info"]["title"] and doc["info"]["version"]
    assert {"/api/v1/traces", "/api/v1/resources", "/v1/traces", "/api/public/otel/v1/traces",
            "/v1/metrics", "/v1/logs"} <= set(doc["paths"])
    refs = list(walk_refs(doc))
    assert refs
    for ref in refs:
        resolve(doc, ref)

    schemas = doc["components"]["schemas"]
    assert {"Span", "Event", "ResourceSample", "Process", "IngestResult", "Error"} <= set(schemas)
    for name, struct in (("Span", SpanIn), ("Event", EventIn), ("ResourceSample", ResourceSampleIn),
                         ("Process", ProcessIn), ("Score", ScoreIn)):
        schema = schemas[name]
        fields = msgspec.structs.fields(struct)
        assert set(schema["required"]) == {f.name for f in fields if f.required}, name
        assert set(schema["properties"]) == {f.name for f in fields}, name
        assert schema["additionalProperties"] is True and schema["title"] == name and schema["description"]
        for prop_name, prop in schema["properties"].items():
            assert prop.get("description"), f"{name}.{prop_name} has no description"
    assert set(schemas["Span"]["required"]) == {"trace_id", "span_id", "name", "start_time"}
    assert set(schemas["IngestResult"]["required"]) == {"accepted", "rejected"}
    assert set(schemas["Error"]["properties"]["error"]["required"]) == {"code", "message", "details"}

    scheme = doc["components"]["securitySchemes"]["bearerAuth"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    basic = doc["components"]["securitySchemes"]["basicAuth"]  # the key pair (Langfuse SDK)
    assert basic["type"] == "http" and basic["scheme"] == "basic"
    for path, item in (("/api/v1/traces", "Span"), ("/api/v1/resources", "ResourceSample")):
        operation = doc["paths"][path]["post"]
        assert operation["security"] == [{"bearerAuth": []}, {"basicAuth": []}]
        body = operation["requestBody"]["content"][JSON]["schema"]
        (envelope,) = body["required"]
        assert body["properties"][envelope]["items"] == {"$ref": f"#/components/schemas/{item}"}
        parameters = [resolve(doc, p["$ref"]) if "$ref" in p else p for p in operation["parameters"]]
        assert any(p["in"] == "header" and p["name"] == "Content-Encoding" and "gzip" in p["schema"]["enum"]
                   for p in parameters)
        responses = operation["responses"]
        assert {"200", "400", "401", "405", "413", "415", "429", "503"} <= set(responses)
        assert responses["200"]["content"][JSON]["schema"]["$ref"] == "#/components/schemas/IngestResult"
        for code in ("400", "401", "405", "413", "415", "429", "503"):
            assert responses[code]["content"][JSON]["schema"]["$ref"] == "#/components/schemas/Error"
        for code in ("429", "503"):
            assert "Retry-After" in responses[code]["headers"]
    for path in ("/v1/traces", "/api/public/otel/v1/traces", "/v1/metrics", "/v1/logs"):
        assert doc["paths"][path]["post"]["security"] == [{"bearerAuth": []}, {"basicAuth": []}]
        content = doc["paths"][path]["post"]["requestBody"]["content"]
        assert {"application/x-protobuf", JSON} <= set(content)

    # Built once: the same document each time, and POSTing to it is a JSON 405.
    assert client.get(OPENAPI).content == response.content
    refused = client.post(OPENAPI, data="{}", content_type=JSON)
    assert refused.status_code == 405 and refused.json()["error"]["code"] == "method_not_allowed"


# --- schema-driven mutations --------------------------------------------------------------------
@dataclass(frozen=True)
class Mutation:
    path: tuple  # ("name",), ("events", 0, "time"), ("processes", 0)
    label: str
    value: Any = DELETE  # DELETE, a JSON value, or a function of the item giving one
    expect: str | None = None  # the field the answer must name, when not the path itself

    @property
    def field(self) -> str:
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return self.expect or out

    def apply(self, item: dict) -> dict:
        item = copy.deepcopy(item)
        *parents, last = self.path
        target = item
        for part in parents:
            target = target[part]
        value = self.value(item) if callable(self.value) else self.value
        if value is DELETE:
            target.pop(last, None)
        else:
            target[last] = value
        return item

    def __repr__(self) -> str:
        value = self.value
        text = "<delete>" if value is DELETE else ("<rule>" if callable(value) else repr(value))
        return f"Mutation({self.field!r}, {self.label}, {text[:200]}{'...' if len(text) > 200 else ''})"


def repeat_to(length: int, chunk: str) -> str:
    return (chunk * (length // len(chunk) + 1))[:length]


def long_text(min_length: int, max_length: int):
    """Strings of min..max code points (built by repetition: Hypothesis cannot draw 100 kB directly)."""
    return st.builds(repeat_to, st.integers(min_length, max_length),
                     st.sampled_from(["x", "é", "€", "😀", "ab", " \t", "\x00", "\\u0000"]))


def nested(depth: int, leaf=1) -> dict:
    """``depth`` objects, one inside the other (the innermost is nested depth - 1 levels deep)."""
    value: Any = leaf
    for _ in range(depth):
        value = {"n": value}
    return value


def strictly_invalid(pattern: str) -> Callable[[str], bool]:
    """Not matching ``pattern`` as JSON Schema reads it (whole string, ASCII \\d) -- and not matched
    by Python's lenient reading either (``$`` before a final newline, Unicode digits): those
    strings are known finding F2, pinned by its own test."""
    strict = re.compile(pattern, re.ASCII)
    lenient = re.compile(pattern)

    def check(value: str) -> bool:
        return not strict.fullmatch(value) and not lenient.search(value)

    return check


WRONG_TYPE_VALUES = {
    "null": st.none(),
    "boolean": st.booleans(),
    "integer": st.integers(min_value=-(2**80), max_value=2**80),
    "number": st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()),
    "string": st.text(max_size=20),
    "array": st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=4),
    "object": st.dictionaries(st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=5)), max_size=4),
}
BAD_TIME_TEXT = [  # near misses of RFC 3339
    "2026-11-30", "2026-11-30T01:02:03", "2026-11-30T01:02:03.1234567890Z", "2026/11/30T01:02:03Z",
    "2026-11-30T01:02:03+0100", "+2026-11-30T01:02:03Z", " 2026-11-30T01:02:03Z", "2026-11-30T1:02:03Z",
    "yesterday", "now", "1764464523", "1764464523.5", "",
]
IMPOSSIBLE_TIMES = [  # match the pattern, but no such time or out of range
    "2026-02-30T00:00:00Z", "2026-11-30T24:00:00Z", "2026-13-01T00:00:00Z", "2026-11-30T12:60:00Z",
    "1999-12-31T23:59:59Z", "2200-01-01T00:00:00Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
]


def json_types(prop: dict) -> set[str]:
    types = set()
    for branch in branches(prop):
        if "enum" in branch:
            types |= {{str: "string", int: "integer", float: "number"}[type(v)] for v in branch["enum"]}
        elif "$ref" in branch:
            types.add("object")
        else:
            types.add(branch["type"])
    if "number" in types:
        types.add("integer")
    return types


def value_mutations(prop: dict, time_field: bool) -> list[tuple[str, Any]]:
    """(label, strategy) pairs whose every value violates ``prop`` (its schema or its description).

    Numbers without a documented maximum get no "above" values: what the store cannot hold there
    is known finding F1."""
    allowed = json_types(prop)
    out = [("type", WRONG_TYPE_VALUES[t]) for t in WRONG_TYPE_VALUES if t not in allowed]
    strings_bounded = True
    for branch in branches(prop):
        kind = branch.get("type")
        if kind in ("integer", "number"):
            if "minimum" in branch:
                low = branch["minimum"]
                out.append(("below", st.integers(max_value=math.ceil(low) - 1)))
                if kind == "number":
                    out.append(("below", st.floats(max_value=low, allow_nan=False, allow_infinity=False)
                                .filter(lambda x, low=low: x < low)))
            for bound, inclusive in (("maximum", True), ("exclusiveMaximum", False)):
                if bound in branch:
                    high = branch[bound]
                    out.append(("above", st.integers(min_value=math.floor(high) + 1 if inclusive else math.ceil(high))))
                    if kind == "number":  # a margin: the server compares whole nanoseconds
                        out.append(("above", st.floats(min_value=high + max(1.0, abs(high) * 1e-9),
                                                       max_value=1e300)))  # beyond: known finding F5
        elif kind == "string":
            if "maxLength" in branch:
                length = branch["maxLength"]
                out.append(("long", long_text(length + 1, length + 40)))
            if branch.get("minLength", 0) >= 1:
                out.append(("short", st.just("")))
            if "pattern" in branch:
                pattern = branch["pattern"]
                out.append(("pattern", st.text(max_size=40).filter(strictly_invalid(pattern))))
                if time_field:
                    out.append(("pattern", st.sampled_from(BAD_TIME_TEXT)))
                    out.append(("time", st.sampled_from(IMPOSSIBLE_TIMES)))
            if "maxLength" not in branch and "pattern" not in branch:
                strings_bounded = False
        elif "enum" in branch:
            members = set(branch["enum"])
            out.append(("enum", st.one_of(st.text(max_size=15), st.sampled_from(
                [m.upper() for m in members] + [m + " " for m in members] + [m.title() for m in members]))
                .filter(lambda s, members=members: s not in members)))
        elif kind == "array":
            ref = branch.get("items", {}).get("$ref")
            if "maxItems" in branch and ref:
                name = ref.rsplit("/", 1)[-1]
                limit = branch["maxItems"]
                out.append(("items", st.integers(limit + 1, limit + 3).map(
                    lambda n, name=name: [valid_nested(name) for _ in range(n)])))
        elif kind == "object" and "maxProperties" in branch:
            limit = branch["maxProperties"]
            out.append(("keys", st.integers(limit + 1, limit + 20).map(lambda n: {f"k{i}": i for i in range(n)})))
            out.append(("deep", st.integers(MAX_DEPTH + 2, 400).map(nested)))  # "nested at most 8 levels"
    if strings_bounded:
        out.append(("huge", long_text(VALUE_LIMIT + 1, 3 * VALUE_LIMIT)))
    if "object" not in allowed:
        out.append(("deep", st.integers(MAX_DEPTH + 2, 400).map(nested)))
    return out


# Known finding F4: errors in `resource` (the alias of resource_attributes) name `resource_attributes`.
SKIPPED_MUTATIONS = {("resource", "deep"), ("resource", "keys")}


def schema_mutations(doc: dict, schema_name: str) -> list:
    """One strategy of Mutation per (property path, kind of bad value), from the served schema."""
    schemas = doc["components"]["schemas"]
    strategies = []

    def add(path: tuple, schema: dict) -> None:
        for name, prop in schema["properties"].items():
            time_field = any(r"\d{4}" in b.get("pattern", "") for b in branches(prop))  # RFC 3339 text
            for label, values in value_mutations(prop, time_field):
                if (name, label) in SKIPPED_MUTATIONS and not path:
                    continue
                strategies.append(values.map(
                    lambda v, p=path + (name,), label=label: Mutation(p, label, v)))
            if name in schema.get("required", ()):
                strategies.append(st.just(Mutation(path + (name,), "delete")))
            for branch in branches(prop):  # list of components: mutate its first item, and inside it
                ref = branch.get("items", {}).get("$ref") if branch.get("type") == "array" else None
                if ref and not path:
                    item_path = (name, 0)
                    for t in ("null", "boolean", "integer", "string", "array"):
                        strategies.append(WRONG_TYPE_VALUES[t].map(lambda v, p=item_path: Mutation(p, "type", v)))
                    add(item_path, resolve(doc, ref))

    add((), schemas[schema_name])
    return strategies


def rule_mutations(endpoint: Endpoint) -> list:
    """Rules the descriptions state that need code rather than a JSON Schema keyword."""
    if endpoint is SPANS:
        return [
            st.integers(1, 10**12).map(lambda k: Mutation(("end_time",), "before-start",
                                                          lambda item, k=k: item["start_time"] - k)),
            st.just(Mutation(("parent_span_id",), "own-parent", lambda item: item["span_id"])),
            st.text(alphabet=" \t\n\r\u00a0\u2003\u3000", min_size=1, max_size=5).map(
                lambda s: Mutation(("name",), "blank", s)),
            st.just(Mutation(("duration_ms",), "no-end", DELETE, expect="end_time")),
            st.just(Mutation(("trace_id",), "zero", "0" * 32)),
            st.just(Mutation(("span_id",), "zero", "0" * 16)),
        ]
    if endpoint is SCORES:
        return [
            st.text(alphabet=" \t\n\r\u00a0\u2003\u3000", min_size=1, max_size=5).map(
                lambda s: Mutation(("name",), "blank", s)),
            st.just(Mutation(("trace_id",), "zero", "0" * 32)),
            st.just(Mutation(("span_id",), "zero", "0" * 16)),
            st.sampled_from(["numeric", "boolean", "categorical"]).map(
                lambda t: Mutation(("data_type",), "mismatch", lambda item, t=t: t if t != {
                    bool: "boolean", str: "categorical"}.get(type(item["value"]), "numeric") else "nope")),
        ]
    if endpoint is ENGINE_SAMPLES:
        return [
            st.text(min_size=1, max_size=64).filter(lambda m: m not in ENGINE_METRIC_NAMES).map(
                lambda m: Mutation(("metric",), "unknown", m)),
            st.floats(100.0, 1e15, exclude_min=True).map(
                lambda v: Mutation(("value",), "kv-over-100", lambda item, v=v: v if item["metric"] == "kv_cache_usage"
                                   else -1.0)),
        ]
    return [
        st.integers(1, 2**40).map(lambda k: Mutation(("gpu_memory_used",), "over-total",
                                                     lambda item, k=k: item["gpu_memory_total"] + k)),
        st.integers(1, 2**40).map(lambda k: Mutation(("memory_used",), "over-total",
                                                     lambda item, k=k: item["memory_total"] + k)),
    ]


def _engine_metric_names() -> set[str]:
    from agent.engines import HISTOGRAM, METRICS, SUM_SUFFIX

    return set(METRICS) | {m + SUM_SUFFIX for m, (kind, _) in METRICS.items() if kind == HISTOGRAM}


ENGINE_METRIC_NAMES = _engine_metric_names()


def with_items(endpoint: Endpoint, item: dict) -> dict:
    """Make sure list properties have a first item to mutate."""
    if endpoint is SPANS and not item.get("events"):
        item["events"] = [valid_nested("Event")]
    if endpoint is SAMPLES and not item.get("processes"):
        item["processes"] = [valid_nested("Process")]
    return item


def field_matches(field: str, expected: str) -> bool:
    return field == expected or field.startswith((expected + ".", expected + "["))


def run_mutation(api: Api, ledger: Ledger, endpoint: Endpoint, mutation: Mutation, variant: int,
                 with_good: bool, position: int) -> None:
    original = with_items(endpoint, endpoint.good_item(variant))
    bad = mutation.apply(original)
    items = [bad]
    if with_good:
        items.insert(position % 2, endpoint.good_item(variant + 1))
    bad_index = items.index(bad)
    req = api.batch(endpoint, items)
    response, body = api.send(req, endpoint)
    where = f"\n{mutation!r}\nrequest: {req.describe()}\nanswer: {response.status_code} {response.content[:800]!r}"
    if with_good:
        assert response.status_code == 200, where
        rejected = body["rejected"]
        assert body["accepted"] == 1 and len(rejected) == 1 and rejected[0]["index"] == bad_index, \
            "the mutated item was not rejected (alone)" + where
    else:
        assert response.status_code == 400 and body["error"]["code"] == f"invalid_{endpoint.field}", where
        rejected = body["error"]["details"]
        assert len(rejected) == 1 and rejected[0]["index"] == 0, where
    assert field_matches(rejected[0]["field"], mutation.field), \
        f"rejected field {rejected[0]['field']!r} does not name {mutation.field!r}" + where
    ledger.expect(endpoint.item_id(original), 0)
    if isinstance(bad.get(endpoint.id_column), str) and bad[endpoint.id_column] != endpoint.item_id(original):
        ledger.expect(bad[endpoint.id_column], 0)
    if with_good:
        ledger.expect(endpoint.item_id(items[1 - bad_index]), 1)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_schema_mutations_are_rejected_naming_the_property(api, endpoint, private_writer):
    strategies = schema_mutations(api.doc, endpoint.schema) + rule_mutations(endpoint)
    assert len(strategies) > 50
    ledger = Ledger(endpoint)

    @fuzz(350)
    @given(mutation=st.one_of(strategies), variant=st.integers(0, 4), with_good=st.booleans(),
           position=st.integers(0, 1))
    def run(mutation, variant, with_good, position):
        run_mutation(api, ledger, endpoint, mutation, variant, with_good, position)

    run()
    finish(api, ledger, private_writer)


# --- bad ids ------------------------------------------------------------------------------------
HEX = "0123456789abcdef"


def bad_ids(length: int, *, zero: bool):
    hex_text = lambda n: st.text(alphabet=HEX, min_size=n, max_size=n)  # noqa: E731
    wrong_length = st.integers(0, 4 * length).filter(lambda n: n != length).flatmap(hex_text)
    if length == 16:  # a parent id may be empty: that is a root span
        wrong_length = wrong_length.filter(bool)
    uppercase = st.tuples(hex_text(length), st.integers(0, length - 1), st.sampled_from("ABCDEF")).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1] + 1:])
    non_hex = st.tuples(hex_text(length), st.integers(0, length - 1),
                        st.characters(exclude_characters=HEX, exclude_categories=("Cs",))).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1] + 1:])
    padded = st.tuples(hex_text(length), st.sampled_from([" ", "\t", "0x", "-", "\u200b"]), st.booleans()).map(
        lambda t: t[1] + t[0] if t[2] else t[0] + t[1])
    options = [wrong_length, uppercase, non_hex, padded]
    if zero:
        options.append(st.just("0" * length))
    return st.one_of(options).filter(strictly_invalid(f"^[0-9a-f]{{{length}}}$"))


def test_bad_ids_are_rejected_naming_the_id(api, private_writer):
    endpoint = SPANS
    ledger = Ledger(endpoint)
    mutations = st.one_of(
        bad_ids(32, zero=True).map(lambda v: Mutation(("trace_id",), "id", v)),
        bad_ids(16, zero=True).map(lambda v: Mutation(("span_id",), "id", v)),
        bad_ids(16, zero=False).map(lambda v: Mutation(("parent_span_id",), "id", v)),
    )

    @fuzz(250)
    @given(mutation=mutations, variant=st.integers(1, 4), with_good=st.booleans(), position=st.integers(0, 1))
    def run(mutation, variant, with_good, position):
        run_mutation(api, ledger, endpoint, mutation, variant, with_good, position)

    run()
    finish(api, ledger, private_writer)


# --- broken bodies, content types, methods, keys ------------------------------------------------
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=10))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=4)), max_leaves=12)
WRONG_CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                       "application/xml", "application/x-protobuf", "application/jsonl", "application/json-seq",
                       "text/json", "application/ld+json", "application/octet-stream", "*/*", "json"]


# Positions inside generated bodies: their length varies with the random ids, and Hypothesis needs
# the same draws for the same choices, so a position is drawn first and taken modulo the length.
FRACTION = st.integers(0, 2**20)


@st.composite
def broken_requests(draw, endpoint: Endpoint):
    """(Req, expected status or None, expected error code or None, whether it may store its items)."""
    kind = draw(st.sampled_from(["bytes", "truncated", "utf8", "content-type", "not-object", "envelope",
                                 "non-object-items", "content-length", "method", "auth", "nan"]))
    items = [endpoint.good_item(draw(st.integers(0, 4)))]
    valid = json.dumps({endpoint.field: items, "note": "ünïcödé ✓ 😀"}, ensure_ascii=False).encode()
    if kind == "bytes":
        return Req(endpoint.path, draw(st.binary(max_size=2000))), None, None, False
    if kind == "truncated":
        cut = 1 + draw(FRACTION) % (len(valid) - 1)  # (an empty body has no Content-Type: a 415)
        return Req(endpoint.path, valid[:cut], items=items), 400, None, False
    if kind == "utf8":
        position = draw(FRACTION) % (len(valid) + 1)
        junk = draw(st.sampled_from([b"\xff", b"\xfe", b"\xc3", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80",
                                     b"\xf0\x9f\x98", b"\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"]))
        return Req(endpoint.path, valid[:position] + junk + valid[position:], items=items), 400, "invalid_utf8", False
    if kind == "content-type":
        content_type = draw(st.one_of(st.sampled_from(WRONG_CONTENT_TYPES), st.from_regex(
            r"\A[a-z]{1,10}/[a-z.+-]{1,12}\Z").filter(lambda c: c != JSON)))
        return Req(endpoint.path, valid, content_type=content_type, items=items), 415, "unsupported_media_type", False
    if kind == "not-object":
        value = draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
        return Req(endpoint.path, json.dumps(value).encode()), 400, "invalid_payload", False
    if kind == "envelope":
        envelope = draw(st.dictionaries(st.text(max_size=8).filter(lambda k: k != endpoint.field), JSON_VALUES,
                                        max_size=3))
        if draw(st.booleans()):
            envelope[endpoint.field] = draw(JSON_VALUES.filter(lambda v: not isinstance(v, list)))
        return Req(endpoint.path, json.dumps(envelope).encode()), 400, "invalid_payload", False
    if kind == "non-object-items":
        junk = draw(st.lists(JSON_VALUES.filter(lambda v: not isinstance(v, dict)), min_size=1, max_size=4))
        with_good = draw(st.booleans())
        batch = junk + items if with_good else junk
        req = Req(endpoint.path, json.dumps({endpoint.field: batch}).encode(), items=batch)
        return req, 200 if with_good else 400, None if with_good else f"invalid_{endpoint.field}", True
    if kind == "content-length":
        length = draw(st.sampled_from(["abc", "1e3", "0x10", "", " ", "1 0", "99999999999999999999999999"]))
        headers = {"CONTENT_LENGTH": length}
        return Req(endpoint.path, valid, headers=headers, items=items), None, None, False
    if kind == "method":
        method = draw(st.sampled_from(["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]))
        return Req(endpoint.path, valid, method=method, items=items), 405, "method_not_allowed", False
    if kind == "auth":
        header = draw(st.one_of(
            st.none(), st.just(""), st.just("Bearer"), st.just("Bearer "),
            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(lambda t: f"Bearer {t}"),
            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(lambda t: f"Basic {t}"),
            st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
        ))
        headers = {} if header is None else {"HTTP_AUTHORIZATION": header}
        return Req(endpoint.path, valid, headers=headers, items=items), 401, None, False
    # "nan": JSON's forbidden numbers, where an item's number goes
    word = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e99999", "-0x10", "01", ".5", "1.", "+1"]))
    numbers = {"value": "@@"} if endpoint in (ENGINE_SAMPLES, SCORES) else {"cost_usd": "@@", "cpu_percent": "@@"}
    text = json.dumps({endpoint.field: [{**items[0], **numbers}]})
    return Req(endpoint.path, text.replace('"@@"', word).encode(), items=items), None, None, False


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_broken_requests_get_json_errors(api, endpoint, private_writer):
    ledger = Ledger(endpoint)

    @fuzz(400)
    @given(case=broken_requests(endpoint))
    def run(case):
        req, status, code, may_store = case
        response, body = api.send(req, endpoint, auth="HTTP_AUTHORIZATION" not in req.headers and status != 401)
        where = f"\nrequest: {req.describe()}\nanswer: {response.status_code} {response.content[:500]!r}"
        if status is not None:
            assert response.status_code == status, where
        if code is not None:
            assert body["error"]["code"] == code, where
        if req.items is not None:
            if response.status_code == 200:
                assert may_store or req.headers.get("CONTENT_LENGTH") is not None, "stored a broken request" + where
            ledger.record(req, body, response.status_code)

    run()
    finish(api, ledger, private_writer)


# --- gzip ---------------------------------------------------------------------------------------
MAX_BODY = 64 * 1024  # lowered for these tests, so bombs stay cheap


def bomb(size: int, chunk: bytes) -> bytes:
    """A gzip body inflating to ``size`` bytes of ``{"spans": [<chunk repeated>`` (compressed in pieces)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = b'{"spans": ['
    parts = [compressor.compress(head)]
    remaining = size - len(head)
    block = chunk * (65536 // len(chunk))
    while remaining > 0:
        piece = block[:remaining]
        parts.append(compressor.compress(piece))
        remaining -= len(piece)
    parts.append(compressor.flush())
    return b"".join(parts)


@st.composite
def gzip_requests(draw, endpoint: Endpoint):
    """(Req, allowed (status, code) answers; code None: any)."""
    kind = draw(st.sampled_from(["corrupted", "truncated", "bomb", "encoding", "double", "at-limit", "plain"]))
    items = [endpoint.good_item(draw(st.integers(0, 4))) for _ in range(draw(st.integers(1, 3)))]
    raw = json.dumps({endpoint.field: items}).encode()
    body = gzip.compress(raw, mtime=0)
    gz = {"HTTP_CONTENT_ENCODING": draw(st.sampled_from(["gzip", "GZIP", " gzip ", "Gzip"]))}
    if kind == "plain":
        return Req(endpoint.path, body, headers=gz, items=items), {(200, None)}
    if kind == "corrupted":
        data = bytearray(body)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(FRACTION) % len(data)] ^= draw(st.integers(1, 255))
        return Req(endpoint.path, bytes(data), headers=gz, items=items), {
            (200, None), (400, "bad_gzip"), (413, "body_too_large")}
    if kind == "truncated":
        cut = 1 + draw(FRACTION) % (len(body) - 1)  # (an empty body has no Content-Type: a 415)
        return Req(endpoint.path, body[:cut], headers=gz, items=items), {
            (400, "bad_gzip")}
    if kind == "bomb":
        size = draw(st.integers(MAX_BODY + 1, 40 * MAX_BODY))
        chunk = draw(st.sampled_from([b" ", b"{}, ", b"[[[[", b"\x00", b'"aaaaaaaa", ']))
        return Req(endpoint.path, bomb(size, chunk), headers=gz, items=None), {(413, "body_too_large")}
    if kind == "at-limit":  # a valid batch padded to exactly the limit, or one byte over
        over = draw(st.integers(0, 1))
        padded = raw[:-1] + b" " * (MAX_BODY + over - len(raw)) + b"}"
        assert len(padded) == MAX_BODY + over
        return Req(endpoint.path, gzip.compress(padded), headers=gz, items=items), {
            (413, "body_too_large")} if over else {(200, None)}
    if kind == "double":  # gzip inside gzip: inflated once, the rest is not JSON text
        return Req(endpoint.path, gzip.compress(body), headers=gz, items=items), {(400, "invalid_utf8"), (400, "invalid_json")}
    encoding = draw(st.one_of(
        st.sampled_from(["br", "deflate", "compress", "zstd", "x-gzip", "gzip, br", "br, gzip", "identity, gzip",
                         "gzip;q=1", "gzip, gzip", "*", "chunked", "gz"]),
        st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=15)
        .filter(lambda e: e.strip().lower() not in ("gzip", "identity"))))
    payload = draw(st.sampled_from([body, raw]))
    return Req(endpoint.path, payload, headers={"HTTP_CONTENT_ENCODING": encoding}, items=items), {
        (415, "unsupported_encoding")}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_broken_gzip_and_bombs_get_json_errors(api, endpoint, private_writer, settings):
    settings.TRACEDASH_INGEST_MAX_BODY_BYTES = MAX_BODY
    ledger = Ledger(endpoint)

    @fuzz(200)
    @given(case=gzip_requests(endpoint))
    def run(case):
        req, allowed = case
        response, body = api.send(req, endpoint)
        code = body["error"]["code"] if response.status_code >= 400 else None
        assert (response.status_code, code) in allowed or (response.status_code, None) in allowed, \
            f"answer {response.status_code} {code} not in {allowed}\nrequest: {req.describe()}\n" \
            f"answer: {response.content[:500]!r}"
        if req.items is not None:
            if response.status_code == 200:
                assert body == {"accepted": len(req.items), "rejected": []}, req.describe()
            ledger.record(req, body, response.status_code)

    run()
    finish(api, ledger, private_writer)


# --- attribute limits, at and around their bounds ------------------------------------------------
def exact_bytes(n: int, tail: str) -> str:
    """A string of exactly ``n`` UTF-8 bytes ending with ``tail`` (a multi-byte character)."""
    tail = tail if len(tail.encode()) <= n else ""
    return "v" * (n - len(tail.encode())) + tail


@st.composite
def attribute_cases(draw):
    """(target path, attributes object, expected stored {flat key: value} or None when it must be rejected,
    whether the whole body may be refused for nesting)."""
    target = draw(st.sampled_from(["attributes", "resource_attributes", "events[0].attributes"]))
    kind = draw(st.sampled_from(["value", "key", "keys", "depth", "list", "deep-json"]))
    tail = draw(st.sampled_from(["", "é", "€", "😀"]))
    near = lambda limit, spread: st.one_of(st.integers(limit - 3, limit + 3), st.integers(0, limit * spread))  # noqa: E731
    if kind == "value":
        n = draw(near(VALUE_LIMIT, 3))
        value = exact_bytes(n, tail)
        return target, {"big": value, "small": 1}, ({"big": value, "small": "1"} if n <= VALUE_LIMIT else None), False
    if kind == "key":
        n = draw(near(KEY_LIMIT, 8).filter(bool))
        key = exact_bytes(n, tail).replace("v", "k")
        return target, {key: "x"}, ({key: "x"} if n <= KEY_LIMIT else None), False
    if kind == "keys":
        n = draw(near(KEYS_LIMIT, 3))
        attributes = {f"k{i}": i for i in range(n)}
        return target, attributes, ({f"k{i}": str(i) for i in range(n)} if n <= KEYS_LIMIT else None), False
    if kind == "depth":
        depth = draw(st.integers(0, 2 * MAX_DEPTH + 2))
        key = ".".join(["n"] * depth + ["leaf"])
        return target, {"n": nested(depth - 1, {"leaf": "v"})} if depth else {"leaf": "v"}, \
            ({key: "v"} if depth <= MAX_DEPTH else None), False
    if kind == "list":  # lists are stored as JSON text, and that text is what the value limit counts
        n = draw(near(VALUE_LIMIT, 2).filter(lambda n: n >= 4))
        value = ["x" * (n - 4)]
        return target, {"list": value}, ({"list": json.dumps(value)} if n <= VALUE_LIMIT else None), False
    depth = draw(st.integers(400, 5000))  # may trip the JSON decoder's own nesting limit: a whole-body 400
    return target, depth, None, True  # (made in the test: Hypothesis's report could not print it)


def test_attribute_limits_hold_at_their_bounds(api, private_writer):
    endpoint = SPANS
    ledger = Ledger(endpoint)

    @fuzz(250)
    @given(case=attribute_cases(), variant=st.integers(0, 4), with_good=st.booleans())
    def run(case, variant, with_good):
        target, attributes, expected, body_may_fail = case
        deep = attributes if isinstance(attributes, int) else None
        if deep is not None:  # written as text: json.dumps cannot nest that deep
            attributes = "@deep@"
        span = with_items(endpoint, endpoint.good_item(variant))
        if target == "events[0].attributes":
            span["events"][0]["attributes"] = attributes
        else:
            span[target] = attributes
        items = [span, endpoint.good_item(variant + 1)] if with_good else [span]
        req = api.batch(endpoint, items)
        if deep is not None:
            req.body = req.body.replace(b'"@deep@"', b'{"n": ' * deep + b"1" + b"}" * deep)
        response, body = api.send(req, endpoint)
        where = f"\ncase: {target} {str(attributes)[:300]}\nanswer: {response.status_code} {response.content[:500]!r}"
        if body_may_fail and response.status_code == 400 and body["error"]["code"] == "invalid_json":
            ledger.record(req, body, 400)
            return
        if expected is None:
            rejected = body["rejected"] if with_good else body["error"]["details"]
            assert response.status_code == (200 if with_good else 400), where
            assert [r["index"] for r in rejected] == [0], where
            assert field_matches(rejected[0]["field"], target), f"{rejected[0]['field']!r} is not {target!r}" + where
            ledger.record(req, body, response.status_code)
            return
        assert response.status_code == 200 and body == {"accepted": len(items), "rejected": []}, where
        ledger.expect(span["trace_id"], 1, stored_as(target, expected))
        if with_good:
            ledger.expect(items[1]["trace_id"], 1)

    run()
    finish(api, ledger, private_writer)


def stored_as(target: str, expected: dict) -> Callable[[dict], None]:
    def check(row: dict) -> None:
        stored = row["event_attributes"][0] if target.startswith("events") else row[target]
        for key, value in expected.items():
            assert stored.get(key) == value, \
                f"{row['trace_id']} {target}[{key[:40]!r}] stored as {str(stored.get(key))[:80]!r}, sent {value[:80]!r}"

    return check


# --- FINDINGS ----------------------------------------------------------------------------------
# Server behaviour this fuzzer found breaking the rules above, fixed since; each keeps a test.
def post_items(api: Api, endpoint: Endpoint, items: list, **kwargs):
    return api.send(api.batch(endpoint, items, **kwargs), endpoint)


# Regression (found by this fuzzer, now fixed): F1: numbers the store cannot hold (ttft_ms over
# ~1.8e13, byte counts >= 2**64)  answer an HTML 500 (OverflowError in the spool) instead of rejecting
# the field
@pytest.mark.parametrize("endpoint, path, value", [
    pytest.param(SPANS, ("ttft_ms",), 1e300, id="ttft_ms-1e300"),
    pytest.param(SPANS, ("ttft_ms",), 2e13, id="ttft_ms-2e13"),
    pytest.param(SAMPLES, ("gpu_memory_total",), 2**64, id="gpu_memory_total-2**64"),
    pytest.param(SAMPLES, ("processes", 0, "gpu_memory"), 2**64, id="process-gpu_memory-2**64"),
])
def test_known_finding_f1_values_too_large_for_the_store(api, private_writer, endpoint, path, value):
    bad = Mutation(path, "too-large", value).apply(endpoint.good_item(3))
    if path == ("gpu_memory_total",):
        bad["gpu_memory_used"] = 1
    response, body = post_items(api, endpoint, [bad, endpoint.good_item(1)])
    assert response.status_code == 200 and [r["field"] for r in body["rejected"]] == [Mutation(path, "").field]


# Regression (found by this fuzzer, now fixed): F2: ids with a trailing newline pass the ^...$
# patterns (Python's $), are accepted,  and trace/span ids are then stored as NUL bytes (the
# FixedString overflows)
@pytest.mark.parametrize("field_name", ["trace_id", "span_id", "parent_span_id"])
def test_known_finding_f2_trailing_newline_in_ids(api, private_writer, field_name):
    span = SPANS.good_item(1)
    span[field_name] += "\n"
    response, body = post_items(api, SPANS, [span, SPANS.good_item(2)])
    assert response.status_code == 200 and [r["field"] for r in body["rejected"]] == [field_name]


# Regression (found by this fuzzer, now fixed): F3: a gzip body is inflated only up to the end of its
# first member: further  members (RFC 1952 allows several) and trailing garbage are silently ignored
@pytest.mark.parametrize("tail", ["member", "garbage"])
def test_known_finding_f3_gzip_after_the_first_member(api, private_writer, tail):
    first, second = [SPANS.good_item(1)], [SPANS.good_item(2)]
    body = gzip.compress(json.dumps({"spans": first}).encode())
    body += gzip.compress(json.dumps({"spans": second}).encode()) if tail == "member" else b"trailing junk"
    response, answer = api.send(Req(SPANS.path, body, headers={"HTTP_CONTENT_ENCODING": "gzip"}), SPANS)
    # Either the concatenation is read (it is not one JSON document: a 400), or the body refused.
    assert response.status_code == 400, f"{response.status_code} {answer}"


# Regression (found by this fuzzer, now fixed): F4: the rejected field is not the one sent: errors in
# `resource` name  `resource_attributes`, and an end_time over 7 days after start names `duration_ms`
@pytest.mark.parametrize("case", ["resource-deep", "resource-keys", "end_time-7-days"])
def test_known_finding_f4_rejected_field_names_another_property(api, private_writer, case):
    span = SPANS.good_item(1)
    if case == "resource-deep":
        span["resource"], sent = nested(20), "resource"
    elif case == "resource-keys":
        span["resource"], sent = {f"k{i}": i for i in range(200)}, "resource"
    else:
        del span["duration_ms"]
        span["end_time"], sent = span["start_time"] + 8 * 86400 * 10**9, "end_time"
    response, body = post_items(api, SPANS, [span, SPANS.good_item(2)])
    assert response.status_code == 200 and [r["field"] for r in body["rejected"]] == [sent], body


# Regression (found by this fuzzer, now fixed): F5: duration_ms or ttft_ms of 1.8e302 or more overflow
# to infinity when turned into  nanoseconds: round() raises OverflowError in parse_span, an HTML 500
# for the whole batch
@pytest.mark.parametrize("field_name", ["duration_ms", "ttft_ms"])
def test_known_finding_f5_milliseconds_overflowing_to_infinity(api, private_writer, field_name):
    span = SPANS.good_item(3)
    span[field_name] = 1e303
    response, body = post_items(api, SPANS, [span, SPANS.good_item(2)])
    assert response.status_code == 200 and [r["field"] for r in body["rejected"]] == [field_name]
