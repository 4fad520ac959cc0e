"""What a cache in front of the model saved (docs/definitions.md "Cache").

- ``spans.cache`` (UInt8): 0 the span consulted no cache (or said nothing of one), 1 it consulted
  one and missed, 2 the cache answered. Mapped at ingestion from ``tracedash.cache.hit`` and the
  conventions listed in docs/otlp.md, so the cache figures never read the attributes (prompts).
  Rows written before get 0: they said nothing the figures can use.
- ``traces.cache`` (and ``traces_by_start``): the request's outcome, the highest of its spans' (2 when
  any span was a hit, 1 when a span consulted a cache and none hit). Summaries written before are
  0 until they are summarised again (``manage.py summarize_traces``).

The materialized view that copies ``traces`` into ``traces_by_start`` lists its columns, so it is
created again with the new one.
"""

from store.schema import SPANS, TRACES, TRACES_BY_START

ALL_COLUMNS = ", ".join(f"`{c.name}`" for c in TRACES.columns)


def _ddl(table, name: str) -> str:
    return {c.name: c for c in table.columns}[name].ddl()


def statements(ctx):
    return [
        *ctx.alter("spans", f"ADD COLUMN IF NOT EXISTS {_ddl(SPANS, 'cache')} AFTER phase_fallback", distributed=True),
        *ctx.alter("traces", f"ADD COLUMN IF NOT EXISTS {_ddl(TRACES, 'cache')}", distributed=True),
        *ctx.alter("traces_by_start", f"ADD COLUMN IF NOT EXISTS {_ddl(TRACES_BY_START, 'cache')}", distributed=True),
        f"DROP VIEW IF EXISTS traces_by_start_mv{ctx.on_cluster}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv{ctx.on_cluster} TO {ctx.local('traces_by_start')}"
        f" AS SELECT {ALL_COLUMNS} FROM {ctx.local('traces')}",
    ]
