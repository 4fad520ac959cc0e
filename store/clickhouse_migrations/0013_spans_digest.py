"""``spans_digest`` on the per-trace summaries: the summariser, which computes summaries in
ClickHouse, leaves out a trace whose spans hash to the digest its latest summary was computed from
(nothing arrived since), so the runs' overlap re-reads a few columns instead of summarising again.

Summaries written before have digest 0 and are summarised once more when next touched. The
materialized view that copies ``traces`` into ``traces_by_start`` lists its columns, so it is
created again with the new one.
"""

from store.schema import TRACES, TRACES_BY_START

ALL_COLUMNS = ", ".join(f"`{c.name}`" for c in TRACES.columns)


def statements(ctx):
    digest = {c.name: c for c in TRACES.columns}["spans_digest"].ddl()
    return [
        f"ALTER TABLE traces{ctx.on_cluster} ADD COLUMN IF NOT EXISTS {digest}",
        f"ALTER TABLE traces_by_start{ctx.on_cluster} ADD COLUMN IF NOT EXISTS {digest}",
        f"DROP VIEW IF EXISTS traces_by_start_mv{ctx.on_cluster}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv{ctx.on_cluster} TO traces_by_start"
        f" AS SELECT {ALL_COLUMNS} FROM traces",
    ]
