"""HTTP Basic with a key pair, as the Langfuse SDK authenticates (issue 16, item 4): user name the
key's public prefix ``td_<prefix>`` (Settings lists it), password the ingest key. Accepted on every
ingest endpoint like a Bearer key (same cache, same revocation); a pair whose halves do not belong
together, or malformed credentials, are a 401 that says what is wrong."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from projects.models import ApiKey
from projects.services import api_key_public_key, api_key_revoke
from store import get_store
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("remembered_keys")]



def basic(public: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{public}:{secret}".encode()).decode()


def pair(raw_key: str) -> str:
    return basic(api_key_public_key(raw_key=raw_key), raw_key)


def _otlp_protobuf(name: str) -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex("5b8efff798038103d269b633813fc60c"), b"\x01" * 8, name
    span.start_time_unix_nano, span.end_time_unix_nano = 1_796_040_000_000_000_000, 1_796_040_000_500_000_000
    return request.SerializeToString()


def _names(project_id: int) -> set[str]:
    rows = get_store().query("SELECT name FROM spans WHERE project_id = {p:UInt64}", {"p": project_id},
                             tag="tests.basic_auth").dicts()
    return {row["name"] for row in rows}


def test_the_public_key_is_the_prefix_settings_lists(project_with_key):
    project, raw = project_with_key()
    key = ApiKey.objects.get(project=project)
    assert api_key_public_key(raw_key=raw) == key.public_key == f"td_{key.prefix}"
    assert raw.startswith(key.public_key + "_")
    assert api_key_public_key(raw_key="sk-lf-1234") is None


def test_a_key_pair_is_accepted_on_every_ingest_endpoint(client, project_with_key):
    project, raw = project_with_key()
    auth = {"HTTP_AUTHORIZATION": pair(raw)}
    langfuse = client.post("/api/public/otel/v1/traces", data=gzip.compress(_otlp_protobuf("via langfuse path")),
                           content_type="application/x-protobuf", HTTP_CONTENT_ENCODING="gzip", **auth)
    assert langfuse.status_code == 200 and langfuse["Content-Type"] == "application/x-protobuf", langfuse.content
    assert client.post("/v1/traces", data=_otlp_protobuf("via otlp path"), content_type="application/x-protobuf",
                       **auth).status_code == 200
    native = client.post("/api/v1/traces", data=json.dumps({"spans": llm_trace(name="via native")}),
                         content_type="application/json", **auth)
    assert native.status_code == 200 and native.json()["rejected"] == []
    assert client.post("/api/v1/resources", data=json.dumps({"samples": []}), content_type="application/json",
                       **auth).status_code == 200
    assert client.post("/v1/metrics", data=b"{}", content_type="application/json", **auth).status_code == 200
    assert {"via langfuse path", "via otlp path", "via native"} <= _names(project.pk)
    # The key reads that take a key take the pair too.
    read = client.get(f"/api/v1/traces/{'ab' * 16}", **auth)
    assert read.status_code == 404 and read.json()["error"]["code"] == "not_found"  # authenticated: no such trace
    # Bearer is unchanged.
    assert client.post("/v1/traces", data=b"{}", content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200


def test_a_mismatched_pair_is_refused_and_does_not_count_as_a_use(client, project_with_key):
    a, a_raw = project_with_key()
    b, b_raw = project_with_key()
    for auth in (basic(api_key_public_key(raw_key=b_raw), a_raw),  # two real keys, halves swapped
                 basic("td_000000000000", a_raw), basic(a_raw, a_raw), basic("pk-lf-anything", a_raw)):
        response = client.post("/api/public/otel/v1/traces", data=_otlp_protobuf("never stored"),
                               content_type="application/x-protobuf", HTTP_AUTHORIZATION=auth)
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "invalid_key" and "public key" in error["message"], error
        assert response["WWW-Authenticate"].startswith("Basic")
    assert not ApiKey.objects.filter(project__in=(a, b), last_used_at__isnull=False).exists()
    assert _names(a.pk) == set() and _names(b.pk) == set()
    # A matching public key with a wrong secret: the secret is checked like a Bearer key.
    wrong = a_raw[:-4] + ("AAAA" if not a_raw.endswith("AAAA") else "BBBB")
    response = client.post("/v1/traces", data=b"{}", content_type="application/json",
                           HTTP_AUTHORIZATION=basic(api_key_public_key(raw_key=a_raw), wrong))
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"
    assert "unknown or revoked" in response.json()["error"]["message"]
    # Langfuse's own keys are no tracedash key.
    response = client.post("/v1/traces", data=b"{}", content_type="application/json",
                           HTTP_AUTHORIZATION=basic("pk-lf-1234", "sk-lf-5678"))
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"
    assert "unknown or revoked" in response.json()["error"]["message"]


@pytest.mark.parametrize("header, problem", [
    ("Basic not*base64!", "not valid base64"),
    ("Basic " + base64.b64encode(b"td_0123456789ab").decode(), "no ':'"),
    ("Basic " + base64.b64encode(b"td_0123456789ab:").decode(), "both a public key and a key"),
    ("Basic " + base64.b64encode(b":td_0123456789ab_secret").decode(), "both a public key and a key"),
    ("Basic " + base64.b64encode(b"\xff\xfe:\xff").decode(), "not valid base64"),
    ("Basic", "'Bearer <key>' or 'Basic base64(<public key>:<key>)'"),
    ("Token abc", "'Bearer <key>' or 'Basic base64(<public key>:<key>)'"),
])
def test_malformed_credentials_are_a_401_naming_the_problem(client, project_with_key, header, problem):
    project_with_key()
    response = client.post("/api/public/otel/v1/traces", data=b"{}", content_type="application/json",
                           HTTP_AUTHORIZATION=header)
    assert response.status_code == 401 and "WWW-Authenticate" in response
    error = response.json()["error"]
    assert error["code"] == "bad_authorization" and problem in error["message"], error


def test_a_revoked_key_pair_is_refused_at_once(client, project_with_key):
    project, raw = project_with_key()
    send = lambda: client.post("/api/public/otel/v1/traces", data=b"{}", content_type="application/json",  # noqa: E731
                               HTTP_AUTHORIZATION=pair(raw))
    assert send().status_code == 200
    assert send().status_code == 200  # now answered from the process's memory of checked keys
    api_key_revoke(key=ApiKey.objects.get(project=project))
    response = send()
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"
