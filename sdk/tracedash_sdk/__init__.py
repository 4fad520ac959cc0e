"""tracedash-sdk: trace LLM app requests into tracedash, with the standard library only.

Five lines::

    import tracedash_sdk as td
    tracer = td.Tracer(service="chat-api")          # TRACEDASH_ENDPOINT, TRACEDASH_API_KEY
    with tracer.trace("POST /chat") as t:
        with t.phase("inference"):
            answer = call_model()

Spans are batched and sent to ``POST /api/v1/traces`` by a background thread; the host app only
pays a few microseconds per span. See ``docs/sdk.md``.
"""

from __future__ import annotations

from ._encode import span_to_dict
from ._exporter import BatchExporter, InMemoryExporter, SpanExporter
from ._openai import instrument_openai
from ._span import PHASES, CacheLookup, NonRecordingSpan, Span, SpanContext, current_span
from ._stream import AsyncTracedStream, TracedStream, astream, stream
from ._tracer import CapturedContext, Tracer, cache, configure, get_tracer, parse_traceparent, wrap

__version__ = "0.1.0"

__all__ = [
    "PHASES",
    "AsyncTracedStream",
    "BatchExporter",
    "CacheLookup",
    "CapturedContext",
    "InMemoryExporter",
    "NonRecordingSpan",
    "Span",
    "SpanContext",
    "SpanExporter",
    "TracedStream",
    "Tracer",
    "astream",
    "cache",
    "configure",
    "current_span",
    "get_tracer",
    "instrument_openai",
    "parse_traceparent",
    "span_to_dict",
    "stream",
    "wrap",
]
