"""A span beneath a model call is part of that call (docs/otlp.md "Phase").

``spans.phase_fallback`` is 1 when a span did not state its phase and it was derived by the
fallback rules (an HTTP client span is ``network``, anything else ``other``): the summaries and the
trace page count such a span as ``inference`` when it lies beneath a model call (OpenLIT's and
httpx/requests auto-instrumentation's HTTP span under each LLM span). A stated phase (the native
``phase`` field, ``tracedash.phase``, a GenAI operation, an OpenInference or Langfuse kind) is kept.
Rows written before get 0: they keep the phase they were stored with.
"""

from store.schema import SPANS


def statements(ctx):
    column = {c.name: c for c in SPANS.columns}["phase_fallback"]
    return ctx.alter("spans", f"ADD COLUMN IF NOT EXISTS {column.ddl()} AFTER phase", distributed=True)
