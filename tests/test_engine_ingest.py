"""Inference engines' metrics in: the agent scraping real HTTP ``/metrics`` endpoints (vLLM's current
and V0 names as vLLM's own library, prometheus_client, prints them; TGI's text), the native
``POST /api/v1/engine_samples`` and its bad-input answers, and the same names over OTLP/HTTP (the
real OpenTelemetry SDK exporter) -> rows of ``engine_samples``, scoped to the key's project."""

from __future__ import annotations

import gzip
import http.server
import json
import math
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent import cli
from agent.engines import parse_exposition, parse_target, samples_rows
from store import get_store
from tests.conftest import wait_until

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]

# TGI's /metrics as its Rust exporter (metrics-exporter-prometheus) prints it: counters without
# ``_total``, no ``_created``, histograms with ``le`` buckets (docs: TGI "reference/metrics").
TGI_TEXT = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 7
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 24000
# TYPE tgi_request_count counter
tgi_request_count 120
# TYPE tgi_request_success counter
tgi_request_success 117
# TYPE tgi_request_failure counter
tgi_request_failure{err="validation"} 2
tgi_request_failure{err="generation"} 1
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="0.01"} 40
tgi_request_queue_duration_bucket{le="0.1"} 100
tgi_request_queue_duration_bucket{le="1"} 115
tgi_request_queue_duration_bucket{le="+Inf"} 117
tgi_request_queue_duration_sum 9.5
tgi_request_queue_duration_count 117
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 10
tgi_request_duration_bucket{le="2"} 100
tgi_request_duration_bucket{le="+Inf"} 117
tgi_request_duration_sum 150.25
tgi_request_duration_count 117
"""


class MetricsEndpoint:
    """A real HTTP server answering ``GET /metrics`` with whatever text the test sets."""

    def __init__(self):
        self.text = ""
        self.status = 200
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = endpoint.text.encode()
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint():
    server = MetricsEndpoint()
    yield server
    server.close()


def vllm_v1_text(*, running=3, waiting=5, kv=(0.5, 0.7), preemptions=(2, 1), ttft=(0.03, 0.2, 0.9, 3.0)) -> str:
    """What a vLLM V1 server (two data-parallel engine ranks) prints, through vLLM's own library."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
          registry=registry).labels("llama-8b", "0").set(running)
    Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
          registry=registry).labels("llama-8b", "0").set(waiting)
    usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=registry)
    usage.labels("llama-8b", "0").set(kv[0])
    usage.labels("llama-8b", "1").set(kv[1])
    preempted = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels,
                        registry=registry)
    preempted.labels("llama-8b", "0").inc(preemptions[0])
    preempted.labels("llama-8b", "1").inc(preemptions[1])
    success = Counter("vllm:request_success", "Count of successfully processed requests.",
                      ["model_name", "engine", "finished_reason"], registry=registry)
    success.labels("llama-8b", "0", "stop").inc(4)
    success.labels("llama-8b", "0", "length").inc(1)
    Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
            registry=registry).labels("llama-8b", "0").inc(1200)
    Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
            registry=registry).labels("llama-8b", "0").inc(300)
    hist = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels,
                     buckets=VLLM_TTFT_BUCKETS, registry=registry)
    for value in ttft:
        hist.labels("llama-8b", "0").observe(value)
    Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", ["block_size"],
          registry=registry).labels("16").set(1)  # not a figure tracedash keeps: ignored
    return generate_latest(registry).decode()


def vllm_v0_text() -> str:
    """The V0 engine's names (``gpu_cache_usage_perc``, ``time_per_output_token_seconds``, swapped)."""
    registry = CollectorRegistry()
    labels = ["model_name"]
    Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", labels,
          registry=registry).labels("opt-125m").set(0.42)
    Gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", labels,
          registry=registry).labels("opt-125m").set(2)
    Counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", labels,
            registry=registry).labels("opt-125m").inc(9)
    Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", labels,
              buckets=[0.01, 0.025, 0.05, 0.1], registry=registry).labels("opt-125m").observe(0.02)
    return generate_latest(registry).decode()


def _rows(project_id: int) -> list[dict]:
    rows = get_store().query(
        "SELECT host, engine, target, model, metric, le, isInfinite(le) AS inf, value, "
        "toUnixTimestamp64Milli(time) AS ms FROM engine_samples "
        "WHERE project_id = {p:UInt64} ORDER BY metric, le", {"p": project_id}, tag="tests.engines").dicts()
    for row in rows:  # the store answers JSON-like rows: an infinite bound comes back as None
        if row.pop("inf"):
            row["le"] = math.inf
    return rows


def _by_metric(rows: list[dict]) -> dict:
    out: dict = {}
    for row in rows:
        out.setdefault(row["metric"], []).append(row)
    return out


def test_the_agent_scrapes_vllm_v1_and_the_rows_land_in_engine_samples(asgi_server, project_with_key, endpoint):
    project, key = project_with_key()
    other, _ = project_with_key()
    endpoint.text = vllm_v1_text()
    assert cli.main(["--endpoint", asgi_server.url, "--api-key", key, "--once", "--host", "gpu-1",
                     "--scrape", f"vllm={endpoint.url}"], environ={}) == 0
    rows = wait_until(lambda: _rows(project.pk), message="engine samples")
    assert _rows(other.pk) == []
    metrics = _by_metric(rows)
    assert {r["engine"] for r in rows} == {"vllm"} and {r["target"] for r in rows} == {endpoint.url}
    assert {r["host"] for r in rows} == {"gpu-1"} and {r["model"] for r in rows} == {"llama-8b"}
    assert len({r["ms"] for r in rows}) == 1  # one scrape, one time
    one = {m: rs[0]["value"] for m, rs in metrics.items() if len(rs) == 1}
    assert one["requests_running"] == 3 and one["requests_waiting"] == 5
    assert one["kv_cache_usage"] == pytest.approx(60.0)  # the two ranks' fractions averaged, as a percentage
    assert one["preemptions"] == 3  # the ranks' counters added up
    assert one["requests_succeeded"] == 5  # finished_reason stop + length
    assert one["prompt_tokens"] == 1200 and one["generation_tokens"] == 300
    assert one["ttft_seconds_sum"] == pytest.approx(0.03 + 0.2 + 0.9 + 3.0)
    buckets = {r["le"]: r["value"] for r in metrics["ttft_seconds"]}
    assert set(buckets) == set(VLLM_TTFT_BUCKETS) | {math.inf}
    assert (buckets[0.02], buckets[0.04], buckets[0.25], buckets[1.0], buckets[2.5], buckets[5.0]) == (0, 1, 2, 3, 3, 4)
    assert buckets[math.inf] == 4
    assert "cache_config_info" not in str(metrics)  # unknown metrics are kept out of the way


def test_vllm_v0_names_map_to_the_same_metrics(endpoint):
    endpoint.text = vllm_v0_text()
    from agent.scrape import EngineScraper

    rows = EngineScraper([endpoint.url], host="h").scrape()
    metrics = _by_metric(rows)
    assert {r["engine"] for r in rows} == {"vllm"}  # recognised from the names, no label given
    assert metrics["kv_cache_usage"][0]["value"] == pytest.approx(42.0)
    assert metrics["requests_swapped"][0]["value"] == 2 and metrics["preemptions"][0]["value"] == 9
    buckets = {r["le"]: r["value"] for r in metrics["inter_token_seconds"]}
    assert buckets[0.01] == 0 and buckets[0.025] == 1 and buckets["+Inf"] == 1


def test_tgi_text_maps_queue_batch_and_histograms(asgi_server, project_with_key, endpoint):
    project, key = project_with_key()
    endpoint.text = TGI_TEXT
    assert cli.main(["--endpoint", asgi_server.url, "--api-key", key, "--once", "--scrape", endpoint.url],
                    environ={}) == 0
    metrics = _by_metric(wait_until(lambda: _rows(project.pk), message="engine samples"))
    assert {r["engine"] for rs in metrics.values() for r in rs} == {"tgi"}
    assert {r["model"] for rs in metrics.values() for r in rs} == {""}  # TGI serves one model, unlabelled
    assert metrics["requests_waiting"][0]["value"] == 7 and metrics["requests_running"][0]["value"] == 12
    assert metrics["requests"][0]["value"] == 120 and metrics["requests_succeeded"][0]["value"] == 117
    assert metrics["requests_failed"][0]["value"] == 3
    assert {r["le"]: r["value"] for r in metrics["queue_seconds"]} == {0.01: 40, 0.1: 100, 1.0: 115, math.inf: 117}
    assert metrics["e2e_seconds_sum"][0]["value"] == pytest.approx(150.25)
    assert "tgi_batch_current_max_tokens" not in str(metrics)


def test_a_target_that_is_down_or_not_prometheus_costs_only_its_own_samples(asgi_server, project_with_key, endpoint,
                                                                             closed_port_url, caplog):
    project, key = project_with_key()
    endpoint.text = "<html>not metrics</html>{"
    assert cli.main(["--endpoint", asgi_server.url, "--api-key", key, "--once", "--host", "h-down",
                     "--scrape", f"{closed_port_url}/metrics", "--scrape", endpoint.url], environ={}) == 0
    assert "scraping" in caplog.text and "cannot reach" in caplog.text
    assert "did not answer the Prometheus text format" in caplog.text or "serves no metric" in caplog.text
    resources = get_store().query("SELECT count() AS n FROM resource_samples WHERE project_id = {p:UInt64}",
                                  {"p": project.pk}, tag="tests.engines").dicts()
    assert resources[0]["n"] >= 1  # the host's own sample still went
    assert _rows(project.pk) == []


@pytest.mark.parametrize("text, message", [
    ("vllm:8000", "expected [ENGINE=]http"),
    ("ftp://x/metrics", "expected [ENGINE=]http"),
])
def test_bad_scrape_targets_stop_with_a_message(capsys, text, message):
    with pytest.raises(SystemExit):
        cli.parse_args(["--endpoint", "http://x", "--api-key", "k", "--scrape", text], environ={})
    assert message in capsys.readouterr().err


def test_scrape_targets_default_the_path():
    assert parse_target("vllm=http://gpu-1:8000") == ("vllm", "http://gpu-1:8000/metrics")
    assert parse_target("http://gpu-1:8000/custom") == ("", "http://gpu-1:8000/custom")


def test_families_without_type_lines_still_map_histograms():
    text = ('vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 2\n'
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="m"} 4.5\n'
            'vllm:num_requests_waiting{model_name="m"} 1\n')
    rows, ignored = samples_rows(parse_exposition(text), time_ns=1_800_000_000 * 10**9, host="h", target="t")
    got = {(r["metric"], r.get("le")): r["value"] for r in rows}
    assert got == {("e2e_seconds", 1.0): 2, ("e2e_seconds", "+Inf"): 3, ("e2e_seconds_sum", None): 4.5,
                   ("requests_waiting", None): 1}
    assert ignored == 0


# --- the native endpoint ----------------------------------------------------------------------
def _post(url: str, key: str, body, *, path="/api/v1/engine_samples") -> tuple[int, dict]:
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    request = urllib.request.Request(url + path, data=gzip.compress(data), method="POST", headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


NOW_NS = time.time_ns()


def _sample(**over) -> dict:
    return {"time": NOW_NS, "host": "gpu-1", "engine": "vllm", "target": "http://gpu-1:8000/metrics",
            "model": "llama", "metric": "requests_waiting", "value": 4, **over}


@pytest.mark.parametrize("sample, field, words", [
    (_sample(metric="gpu_magic"), "metric", "unknown engine metric"),
    (_sample(metric="requests_waiting_sum"), "metric", "unknown engine metric"),
    (_sample(metric="ttft_seconds"), "le", "needs its le"),
    (_sample(metric="ttft_seconds", le=-1), "le", "above 0"),
    (_sample(metric="ttft_seconds", le="lots"), "le", "+Inf"),
    (_sample(metric="ttft_seconds", le=0.5, value=2.5), "value", "whole number"),
    (_sample(le=0.5), "le", "only histogram buckets"),
    (_sample(metric="kv_cache_usage", value=180), "value", "percentage"),
    (_sample(value=-1), "value", ">= 0"),
    (_sample(value="4"), "value", "Expected `float`"),
    (_sample(time="yesterday"), "time", "RFC 3339"),
    (_sample(host="h" * 300), "host", "length"),
    ({"metric": "requests_waiting", "value": 1}, "time", "missing required field"),
])
def test_bad_samples_are_refused_naming_the_field(asgi_server, project_with_key, sample, field, words):
    project, key = project_with_key()
    status, body = _post(asgi_server.url, key, {"samples": [sample]})
    assert status == 400, body
    detail = body["error"]["details"][0]
    assert detail["index"] == 0 and detail["field"] == field and words in detail["message"], detail
    assert _rows(project.pk) == []


def test_a_batch_stores_the_good_samples_and_names_the_bad_ones(asgi_server, project_with_key):
    project, key = project_with_key()
    status, body = _post(asgi_server.url, key, {"samples": [
        _sample(), _sample(metric="kv_cache_usage", value=101), _sample(metric="ttft_seconds", le="+Inf", value=3),
        _sample(metric="ttft_seconds_sum", value=1.25)]})
    assert status == 200 and body["accepted"] == 3
    assert [(r["index"], r["field"]) for r in body["rejected"]] == [(1, "value")]
    got = {(r["metric"], r["le"]): r["value"] for r in _rows(project.pk)}
    assert got == {("requests_waiting", 0.0): 4, ("ttft_seconds", math.inf): 3, ("ttft_seconds_sum", 0.0): 1.25}


@pytest.mark.parametrize("body, code", [(b"{", "invalid_json"), ({"spans": []}, "invalid_payload"),
                                        ({"samples": "x"}, "invalid_payload")])
def test_bad_envelopes_are_400(asgi_server, project_with_key, body, code):
    _, key = project_with_key()
    status, answer = _post(asgi_server.url, key, body)
    assert status == 400 and answer["error"]["code"] == code


def test_a_wrong_key_is_401(asgi_server):
    status, answer = _post(asgi_server.url, "td_nope_nope", {"samples": [_sample()]})
    assert status == 401 and answer["error"]["code"]


# --- OTLP ---------------------------------------------------------------------------------------
def _otel_meter(asgi_server, key, *, temporality=None):
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader  # noqa: F401
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from opentelemetry.sdk.resources import Resource

    exporter = OTLPMetricExporter(endpoint=f"{asgi_server.url}/v1/metrics", headers={"Authorization": f"Bearer {key}"},
                                  **({"preferred_temporality": temporality} if temporality else {}))
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create({"service.name": "tgi", "service.instance.id": "tgi-0:80", "host.name": "gpu-7"}),
        views=[View(instrument_name="tgi_request_queue_duration",
                    aggregation=ExplicitBucketHistogramAggregation([0.01, 0.1, 1.0]))])
    return provider, provider.get_meter("tgi-bridge")


def test_otlp_metrics_with_engine_names_land_beside_the_resources(asgi_server, project_with_key):
    """The OpenTelemetry SDK's own OTLP exporter, sending TGI's names (vLLM's have a ':' that the SDK
    refuses in an instrument name; they arrive from an OTel Collector's Prometheus receiver, below)."""
    project, key = project_with_key()
    provider, meter = _otel_meter(asgi_server, key)
    meter.create_observable_gauge("tgi_queue_size", callbacks=[lambda _o: [__import__(
        "opentelemetry.metrics", fromlist=["Observation"]).Observation(9)]])
    meter.create_counter("tgi_request_success").add(41)
    queue = meter.create_histogram("tgi_request_queue_duration", unit="s")
    for value in (0.005, 0.05, 0.5, 5.0):
        queue.record(value)
    meter.create_counter("http.server.requests").add(3)  # not an engine metric: ignored
    assert provider.force_flush(30_000)
    provider.shutdown()
    metrics = _by_metric(wait_until(lambda: _rows(project.pk), message="engine samples"))
    assert {(r["engine"], r["target"], r["host"]) for rs in metrics.values() for r in rs} == {("tgi", "tgi-0:80", "gpu-7")}
    assert metrics["requests_waiting"][0]["value"] == 9 and metrics["requests_succeeded"][0]["value"] == 41
    assert {r["le"]: r["value"] for r in metrics["queue_seconds"]} == {0.01: 1, 0.1: 2, 1.0: 3, math.inf: 4}
    assert metrics["queue_seconds_sum"][0]["value"] == pytest.approx(5.555)


def test_otlp_delta_counters_are_refused_in_partial_success(asgi_server, project_with_key):
    from opentelemetry.sdk.metrics import Counter as SdkCounter
    from opentelemetry.sdk.metrics import Histogram as SdkHistogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    project, key = project_with_key()
    provider, meter = _otel_meter(asgi_server, key, temporality={SdkCounter: AggregationTemporality.DELTA,
                                                                 SdkHistogram: AggregationTemporality.DELTA})
    meter.create_counter("tgi_request_success").add(5)
    assert provider.force_flush(30_000)  # answered 200 with partial_success: the exporter reports success
    provider.shutdown()
    time.sleep(0.5)
    assert _rows(project.pk) == []


def test_otlp_json_from_a_collector_prometheus_receiver_keeps_vllm_names(asgi_server, project_with_key):
    """What an OTel Collector scraping vLLM forwards: the Prometheus names unchanged (gauge, a
    cumulative monotonic sum, a histogram with per-bucket counts), built with the OTLP protobuf classes."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    project, key = project_with_key()
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    for k, v in (("service.name", "vllm"), ("service.instance.id", "gpu-1:8000"), ("host.name", "gpu-1")):
        attr = rm.resource.attributes.add()
        attr.key, attr.value.string_value = k, v
    metrics = rm.scope_metrics.add().metrics
    gauge = metrics.add(name="vllm:kv_cache_usage_perc")
    point = gauge.gauge.data_points.add(time_unix_nano=NOW_NS, as_double=0.93)
    point.attributes.add(key="model_name").value.string_value = "llama"
    counter = metrics.add(name="vllm:num_preemptions_total")
    counter.sum.aggregation_temporality = 2
    counter.sum.is_monotonic = True
    counter.sum.data_points.add(time_unix_nano=NOW_NS, as_double=12).attributes.add(key="model_name").value.string_value = "llama"
    hist = metrics.add(name="vllm:e2e_request_latency_seconds", unit="s")
    hist.histogram.aggregation_temporality = 2
    hp = hist.histogram.data_points.add(time_unix_nano=NOW_NS, count=10, sum=12.5, explicit_bounds=[0.5, 1.0, 2.5],
                                        bucket_counts=[2, 3, 4, 1])
    hp.attributes.add(key="model_name").value.string_value = "llama"
    status, _ = _post(asgi_server.url, key, MessageToDict(request), path="/v1/metrics")
    assert status == 200
    got = {(r["metric"], r["le"]): r["value"] for r in _rows(project.pk)}
    assert got[("kv_cache_usage", 0.0)] == pytest.approx(93.0) and got[("preemptions", 0.0)] == 12
    assert {le: v for (m, le), v in got.items() if m == "e2e_seconds"} == {0.5: 2, 1.0: 5, 2.5: 9, math.inf: 10}
    assert got[("e2e_seconds_sum", 0.0)] == pytest.approx(12.5)
    assert {r["engine"] for r in _rows(project.pk)} == {"vllm"} and {r["model"] for r in _rows(project.pk)} == {"llama"}


# --- the embedded server --------------------------------------------------------------------------
def test_the_embedded_sampler_scrapes_configured_and_registered_targets(project_with_key, endpoint, settings,
                                                                        monkeypatch):
    """``sample_local_host`` (the embedded beat's task) scrapes TRACEDASH_SCRAPE and the targets
    ``serve`` registers (the demo's simulator), into every project, through the ingest service."""
    import dataclasses

    from agent import tasks

    a, _ = project_with_key()
    b, _ = project_with_key()
    tgi = MetricsEndpoint()
    try:
        tgi.text = TGI_TEXT
        endpoint.text = vllm_v1_text(waiting=2)
        settings.ENV = dataclasses.replace(settings.ENV, scrape_targets=(f"tgi={tgi.url}",))  # restored by the fixture
        monkeypatch.setattr(tasks, "_scraper", None)
        tasks.scrape_target_add(f"vllm={endpoint.url}")
        try:
            assert tasks.sample_local_host() > 0
        finally:
            tasks.scrape_target_remove(f"vllm={endpoint.url}")
            monkeypatch.setattr(tasks, "_scraper", None)
    finally:
        tgi.close()
    for project in (a, b):
        rows = _rows(project.pk)
        assert {(r["engine"], r["target"]) for r in rows} == {("tgi", tgi.url), ("vllm", endpoint.url)}
        waiting = {r["engine"]: r["value"] for r in rows if r["metric"] == "requests_waiting"}
        assert waiting == {"tgi": 7, "vllm": 2}


def _collector_request(resource: dict, gauges: dict, counters: dict, histograms: dict):
    """An OTLP metrics export as an OTel Collector's Prometheus receiver builds it from a scrape:
    the Prometheus names unchanged, the model a point attribute."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    for k, v in resource.items():
        attr = rm.resource.attributes.add()
        attr.key, attr.value.string_value = k, v
    metrics = rm.scope_metrics.add().metrics
    for name, (model, value) in gauges.items():
        point = metrics.add(name=name).gauge.data_points.add(time_unix_nano=NOW_NS, as_double=value)
        point.attributes.add(key="model_name").value.string_value = model
    for name, (model, value) in counters.items():
        metric = metrics.add(name=name)
        metric.sum.aggregation_temporality, metric.sum.is_monotonic = 2, True
        point = metric.sum.data_points.add(time_unix_nano=NOW_NS, as_double=value)
        point.attributes.add(key="model_name").value.string_value = model
    for name, (model, bounds, counts, total) in histograms.items():
        metric = metrics.add(name=name, unit="s")
        metric.histogram.aggregation_temporality = 2
        point = metric.histogram.data_points.add(time_unix_nano=NOW_NS, count=sum(counts), sum=total,
                                                 explicit_bounds=bounds, bucket_counts=counts)
        point.attributes.add(key="model_name").value.string_value = model
    return MessageToDict(request)


def test_otlp_with_vllms_older_names_gives_the_rows_a_scrape_of_them_gives(asgi_server, project_with_key, endpoint):
    """vLLM V0's names (``gpu_cache_usage_perc``, ``time_per_output_token_seconds``, swapped) and the
    queue gauges over OTLP land as the same canonical metrics and values as the agent's scrape of them."""
    project, key = project_with_key()
    body = _collector_request(
        {"service.name": "vllm", "service.instance.id": "gpu-3:8000", "host.name": "gpu-3"},
        gauges={"vllm:gpu_cache_usage_perc": ("opt-125m", 0.42), "vllm:num_requests_swapped": ("opt-125m", 2),
                "vllm:num_requests_running": ("opt-125m", 6), "vllm:num_requests_waiting": ("opt-125m", 11)},
        counters={"vllm:num_preemptions_total": ("opt-125m", 9)},
        histograms={"vllm:time_per_output_token_seconds": ("opt-125m", [0.01, 0.025, 0.05, 0.1], [0, 1, 0, 0, 0], 0.02)})
    status, answer = _post(asgi_server.url, key, body, path="/v1/metrics")
    assert status == 200 and not answer.get("partialSuccess", {}).get("rejectedDataPoints"), answer
    stored = _rows(project.pk)
    assert {(r["engine"], r["target"], r["host"], r["model"]) for r in stored} == {("vllm", "gpu-3:8000", "gpu-3", "opt-125m")}
    got = {(r["metric"], r["le"]): r["value"] for r in stored}
    assert got[("kv_cache_usage", 0.0)] == pytest.approx(42.0)
    assert (got[("requests_running", 0.0)], got[("requests_waiting", 0.0)]) == (6, 11)
    # the agent scraping the same figures from vLLM V0's /metrics (its own library's text) maps them alike
    endpoint.text = vllm_v0_text()
    from agent.scrape import EngineScraper

    scraped = {(r["metric"], 0.0 if r.get("le") is None else (math.inf if r["le"] == "+Inf" else r["le"])): r["value"]
               for r in EngineScraper([endpoint.url], host="h").scrape()}
    assert {k: v for k, v in got.items() if k[0] not in ("requests_running", "requests_waiting")} == pytest.approx(scraped)


def test_several_labelled_scrape_targets_each_keep_their_engine(asgi_server, project_with_key, endpoint):
    """``--scrape`` given twice, each with its engine label: one agent run sends both instances'
    samples, each under its own label and target (a label of the user's own wins over the names)."""
    project, key = project_with_key()
    tgi = MetricsEndpoint()
    try:
        tgi.text = TGI_TEXT
        endpoint.text = vllm_v1_text(waiting=4)
        assert cli.main(["--endpoint", asgi_server.url, "--api-key", key, "--once", "--host", "gpu-2",
                         "--scrape", f"vllm={endpoint.url}", "--scrape", f"tgi-big={tgi.url}"], environ={}) == 0
    finally:
        tgi.close()
    rows = wait_until(lambda: (r := _rows(project.pk)) and len({x["engine"] for x in r}) == 2 and r,
                      message="both targets' samples")
    assert {(r["engine"], r["target"]) for r in rows} == {("vllm", endpoint.url), ("tgi-big", tgi.url)}
    waiting = {r["engine"]: r["value"] for r in rows if r["metric"] == "requests_waiting"}
    assert waiting == {"vllm": 4, "tgi-big": 7}


def trtllm_text() -> str:
    """What trtllm-serve prints (tensorrt_llm/metrics/collector.py: ``trtllm_`` names, the labels
    ``model_name`` and ``engine_type``), through prometheus_client as it does."""
    registry = CollectorRegistry()
    labels = {"model_name": "qwen3-8b", "engine_type": "trtllm"}
    for name, value in (("trtllm_num_requests_running", 9), ("trtllm_num_requests_waiting", 14),
                        ("trtllm_kv_cache_utilization", 0.955), ("trtllm_kv_cache_used_blocks", 955)):
        Gauge(name, name, list(labels), registry=registry).labels(**labels).set(value)
    success = Counter("trtllm_request_success_total", "ok", [*labels, "finished_reason"], registry=registry)
    success.labels(**labels, finished_reason="stop").inc(40)
    success.labels(**labels, finished_reason="length").inc(2)
    Counter("trtllm_request_error_total", "errors", [*labels, "http_code"], registry=registry).labels(
        **labels, http_code="400").inc(3)
    Counter("trtllm_generation_tokens_total", "out", list(labels), registry=registry).labels(**labels).inc(5000)
    ttft = Histogram("trtllm_time_to_first_token_seconds", "ttft", list(labels), buckets=[0.1, 0.5, 1.0],
                     registry=registry)
    for value in (0.05, 0.3, 0.7, 2.0):
        ttft.labels(**labels).observe(value)
    return generate_latest(registry).decode()


def test_tensorrt_llm_names_current_and_dynamos_older_ones(endpoint):
    from agent.scrape import EngineScraper

    endpoint.text = trtllm_text()
    rows = EngineScraper([endpoint.url], host="h").scrape()
    assert {(r["engine"], r["model"]) for r in rows} == {("trtllm", "qwen3-8b")}  # recognised from the names
    metrics = _by_metric(rows)
    assert (metrics["requests_running"][0]["value"], metrics["requests_waiting"][0]["value"]) == (9, 14)
    assert metrics["kv_cache_usage"][0]["value"] == pytest.approx(95.5)
    assert metrics["requests_succeeded"][0]["value"] == 42 and metrics["requests_failed"][0]["value"] == 3
    assert metrics["generation_tokens"][0]["value"] == 5000
    assert {r["le"]: r["value"] for r in metrics["ttft_seconds"]} == {0.1: 1, 0.5: 2, 1.0: 3, "+Inf": 4}
    assert "kv_cache_used_blocks" not in str(metrics)
    # older NVIDIA Dynamo releases forwarded the per-request metrics as trtllm:<name>
    endpoint.text = ('# TYPE trtllm:e2e_request_latency_seconds histogram\n'
                     'trtllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 2\n'
                     'trtllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 5\n'
                     'trtllm:e2e_request_latency_seconds_sum{model_name="m"} 9.5\n'
                     'trtllm:e2e_request_latency_seconds_count{model_name="m"} 5\n')
    got = {(r["engine"], r["metric"], r.get("le")): r["value"] for r in EngineScraper([endpoint.url], host="h").scrape()}
    assert got == {("trtllm", "e2e_seconds", 1.0): 2, ("trtllm", "e2e_seconds", "+Inf"): 5,
                   ("trtllm", "e2e_seconds_sum", None): 9.5}
