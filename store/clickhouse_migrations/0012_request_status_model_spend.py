"""Request status and per-model spend (DOMAIN.md "Status", "Cost").

``traces`` (and ``traces_by_start``) gain ``error_spans`` (spans with status error: a request whose
root succeeded after a failed, retried call is ``recovered``, not an error) and tokens and cost per
model of the spans (each call priced and counted under its own model); the rollups gain
``recovered``, ``error_spans`` and the same per-model maps. The materialized view that copies
``traces`` into ``traces_by_start`` lists its columns, so it is created again with the new ones.

Summaries written before keep the old status (error if any span failed) and no per-model maps
until they are summarised again (``manage.py summarize_traces``, then ``manage.py rollup``).
"""

from store.schema import (ROLLUP_6H, ROLLUP_6H_ALL, ROLLUP_DAY, ROLLUP_DAY_ALL, ROLLUP_HOUR, ROLLUP_HOUR_ALL,
                          ROLLUP_MINUTE, TRACES, TRACES_BY_START)

TRACE_COLUMNS = ("error_spans", "model_input_tokens", "model_output_tokens", "model_cost_usd")
ROLLUP_COLUMNS = ("recovered", "error_spans", "model_input_tokens", "model_output_tokens", "model_cost_usd")
# The columns ``traces`` has after this migration (0013 adds one and creates the view again).
_NAMES = [c.name for c in TRACES.columns]
ALL_COLUMNS = ", ".join(f"`{name}`" for name in _NAMES[:_NAMES.index("spans_digest")])


def _add(table, names, ctx) -> list[str]:
    columns = {c.name: c for c in table.columns}
    adds = ", ".join(f"ADD COLUMN IF NOT EXISTS {columns[n].ddl()}" for n in names)
    return ctx.alter(table.name, adds, distributed=True)


def statements(ctx):
    out = [*_add(TRACES, TRACE_COLUMNS, ctx), *_add(TRACES_BY_START, TRACE_COLUMNS, ctx)]
    out += [s for t in (ROLLUP_MINUTE, ROLLUP_HOUR, ROLLUP_6H, ROLLUP_DAY, ROLLUP_HOUR_ALL, ROLLUP_6H_ALL, ROLLUP_DAY_ALL)
            for s in _add(t, ROLLUP_COLUMNS, ctx)]
    out += [
        f"DROP VIEW IF EXISTS traces_by_start_mv{ctx.on_cluster}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv{ctx.on_cluster} TO {ctx.local('traces_by_start')}"
        f" AS SELECT {ALL_COLUMNS} FROM {ctx.local('traces')}",
    ]
    return out
