"""GenAI events sent as OTLP log records (``POST /v1/logs``), kept per trace and span
(store.schema.SPAN_LOGS): what the trace page and ``GET /api/v1/traces/<id>`` show with each span.
Expired like the spans (the global TTL, and each project's retention)."""

from store.schema import SPAN_LOGS


def statements(ctx):
    return ctx.create(SPAN_LOGS)
