"""Summaries computed in ClickHouse (analytics.summary_sql).

- ``traces.spans_digest``: the summariser leaves out a trace whose spans hash to the digest its
  latest summary was computed from (nothing arrived since), so the runs' overlap re-reads a few
  columns instead of summarising again. Summaries written before have digest 0 and are summarised
  once more when next touched.
- ``spans.loadtest_run_id``, filled by ClickHouse from ``attributes['loadtest.run_id']`` at insert
  (for older parts it is computed on read), and ``traces.loadtest``: load-test traffic is told from
  the summaries (latency alerts leave it out) without reading the span attributes.

The materialized view that copies ``traces`` into ``traces_by_start`` lists its columns, so it is
created again with the new ones.
"""

from store.schema import SPANS, TRACES

# The columns ``traces`` has after this migration (0018 adds one and creates the view again).
_NAMES = [c.name for c in TRACES.columns]
ALL_COLUMNS = ", ".join(f"`{name}`" for name in _NAMES[:_NAMES.index("cache")])


def _ddl(table, name: str) -> str:
    return {c.name: c for c in table.columns}[name].ddl()


def statements(ctx):
    adds = f"ADD COLUMN IF NOT EXISTS {_ddl(TRACES, 'spans_digest')}, ADD COLUMN IF NOT EXISTS {_ddl(TRACES, 'loadtest')}"
    return [
        *ctx.alter("spans", f"ADD COLUMN IF NOT EXISTS {_ddl(SPANS, 'loadtest_run_id')}", distributed=True),
        *ctx.alter("traces", adds, distributed=True),
        *ctx.alter("traces_by_start", adds, distributed=True),
        f"DROP VIEW IF EXISTS traces_by_start_mv{ctx.on_cluster}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv{ctx.on_cluster} TO {ctx.local('traces_by_start')}"
        f" AS SELECT {ALL_COLUMNS} FROM {ctx.local('traces')}",
    ]
