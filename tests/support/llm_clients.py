"""Drive a real, unmodified LLM instrumentation library the way its users do, in a process of its
own (the libraries install global tracer/logger providers, patch the ``openai`` client and, for
OpenLIT, write ``OTEL_EXPORTER_OTLP_*`` into the environment: one process each keeps them apart).

    python tests/support/llm_clients.py LIBRARY --llm http://127.0.0.1:PORT/v1 --tracedash http://127.0.0.1:PORT --key td_…

LIBRARY is ``openinference``, ``openlit``, ``otel-genai`` (opentelemetry-instrumentation-openai-v2) or ``langfuse`` (which takes ``--public-key``/``--secret-key``: for
tracedash, a key's public prefix ``td_…`` and the key). The ``openai`` client makes three calls
against the LLM simulator (``demo.simulator``): a plain one, a streamed one and one that fails (an
unknown model: the simulator answers 404), each inside an app span named ``plain``, ``stream`` or
``fail``, so the test finds them. The library exports over OTLP/HTTP to tracedash, configured only
through its own documented settings; nothing here builds a payload. Prints one JSON line,
``{"done": [...], "errors": [...]}``, and exits 0 when all three calls went as planned.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

MODEL = "sim-gpt"
MISSING_MODEL = "no-such-model"
MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Say <b>hello</b> & goodbye."}]


def _calls(client, span) -> dict:
    """The three calls, each inside ``span(name)`` (a context manager of the library's own app spans)."""
    done, errors = [], []
    # A first call outside the app spans: the openai client imports and connects lazily on its first
    # request (~0.1 s here), time that is neither the model's nor tracedash's.
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    with span("plain"):
        reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12)
        done.append(["plain", reply.usage.prompt_tokens, reply.usage.completion_tokens])
    with span("stream"):
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, stream=True,
                                                stream_options={"include_usage": True})
        chunks = [chunk for chunk in stream]
        done.append(["stream", len(chunks)])
    import openai

    with span("fail"):
        try:
            client.chat.completions.create(model=MISSING_MODEL, messages=MESSAGES, max_tokens=4)
            errors.append("the failing call did not fail")
        except openai.NotFoundError:
            done.append(["fail"])
    return {"done": done, "errors": errors}


def run_openinference(args) -> dict:
    # What openinference-instrumentation-openai's README does: an SDK tracer provider with the OTLP/HTTP
    # exporter (configured by the standard OTEL_EXPORTER_OTLP_* variables), then instrument().
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = args.tracedash
    os.environ["OTEL_EXPORTER_OTLP_HEADERS"] = f"Authorization=Bearer%20{args.key}"
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "oi-app"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    import openai

    client = openai.OpenAI(base_url=args.llm, api_key="sk-test", max_retries=0)
    tracer = provider.get_tracer("app")
    result = _calls(client, tracer.start_as_current_span)
    if not provider.force_flush(30_000):
        result["errors"].append("force_flush timed out")
    provider.shutdown()
    return result


def run_otel_genai(args) -> dict:
    # The official OpenTelemetry instrumentation (opentelemetry-instrumentation-openai-v2) as its README
    # sets it up: SDK tracer, logger (its GenAI events are logs) and meter providers with the OTLP/HTTP
    # exporters, configured by the standard OTEL_* variables; message content and events on. With the
    # pinned util-genai it always follows the latest GenAI conventions, and records no first-token
    # time for a stream (no span attribute, event or TTFT histogram).
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = args.tracedash
    os.environ["OTEL_EXPORTER_OTLP_HEADERS"] = f"Authorization=Bearer%20{args.key}"
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_AND_EVENT"
    os.environ["OTEL_INSTRUMENTATION_GENAI_EMIT_EVENT"] = "true"
    from opentelemetry import _logs, metrics, trace
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": "otel-genai-app"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    _logs.set_logger_provider(logger_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource,
                                             metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]))
    OpenAIInstrumentor().instrument()
    import openai

    client = openai.OpenAI(base_url=args.llm, api_key="sk-test", max_retries=0)
    result = _calls(client, trace.get_tracer("app").start_as_current_span)
    _flush_globals(result)
    return result


def run_openlit(args) -> dict:
    # openlit.init with its documented arguments. pricing_json points at a local file: without it OpenLIT
    # downloads its price list from the internet at start-up. Batched export (its default): with
    # disable_batch=True each span is exported synchronously as it ends, inside the app's span.
    pricing = os.path.join(tempfile.mkdtemp(), "pricing.json")
    with open(pricing, "w", encoding="utf-8") as f:  # USD per 1,000 tokens, OpenLIT's format
        json.dump({"chat": {MODEL: {"promptPrice": 0.5, "completionPrice": 1.5}}, "embeddings": {}, "images": {},
                   "audio": {}}, f)
    import openlit

    openlit.init(otlp_endpoint=args.tracedash, otlp_headers={"Authorization": f"Bearer {args.key}"},
                 application_name="openlit-app", environment="test", pricing_json=pricing,
                 collect_gpu_stats=False)
    import openai
    from opentelemetry import trace

    client = openai.OpenAI(base_url=args.llm, api_key="sk-test", max_retries=0)
    result = _calls(client, trace.get_tracer("app").start_as_current_span)
    _flush_globals(result)
    return result


def run_langfuse(args) -> dict:
    # Langfuse's own configuration: its key pair and its host, nothing else.
    os.environ["LANGFUSE_PUBLIC_KEY"] = args.public_key
    os.environ["LANGFUSE_SECRET_KEY"] = args.secret_key
    os.environ["LANGFUSE_HOST"] = args.tracedash
    from langfuse import get_client, propagate_attributes
    from langfuse.openai import OpenAI  # the drop-in client Langfuse documents

    langfuse = get_client()
    client = OpenAI(base_url=args.llm, api_key="sk-test", max_retries=0)

    from contextlib import contextmanager

    @contextmanager
    def span(name):
        with langfuse.start_as_current_observation(as_type="span", name=name):
            with propagate_attributes(trace_name=f"chat-{name}", user_id="u-42", session_id="s-7"):
                yield

    result = _calls(client, span)
    langfuse.flush()
    langfuse.shutdown()
    return result


def _flush_globals(result: dict) -> None:
    from opentelemetry import _logs, metrics, trace

    for provider in (trace.get_tracer_provider(), _logs.get_logger_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "force_flush", None)
        if flush is not None and flush(30_000) is False:
            result["errors"].append(f"{type(provider).__name__}.force_flush timed out")
    for provider in (trace.get_tracer_provider(), _logs.get_logger_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


RUNNERS = {"openinference": run_openinference, "openlit": run_openlit, "langfuse": run_langfuse,
           "otel-genai": run_otel_genai}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("library", choices=sorted(RUNNERS))
    parser.add_argument("--llm", required=True, help="the simulator's OpenAI base URL (…/v1)")
    parser.add_argument("--tracedash", required=True, help="tracedash's base URL")
    parser.add_argument("--key", default="", help="ingest key (Bearer)")
    parser.add_argument("--public-key", default="", help="Langfuse public key")
    parser.add_argument("--secret-key", default="", help="Langfuse secret key")
    args = parser.parse_args(argv)
    result = RUNNERS[args.library](args)
    print(json.dumps(result), flush=True)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
