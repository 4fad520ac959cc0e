"""``traces_by_start``: the per-trace summaries ordered by (project_id, start_time, trace_id) and
partitioned by day, kept in step with ``traces`` by a materialized view, so that the explorer's
time-window queries read only the window's days and granules. ``traces`` stays ordered by trace id
(a trace id finds its summary by the primary key) and unpartitioned (a summary's start can move).

Measured on 10 M spans (bench/load_spans.py + bench/query.py; docs/BENCHMARKS.md "Trace queries"):
the explorer's first page with a service filter over 24 h read all 151 granules of ``traces``.

The view is created before the backfill, so a summary written meanwhile is copied twice at worst
(the same key and version: one row after FINAL); a run that stopped half-way can run again.
"""

from store.schema import TRACES, TRACES_BY_START

# The columns ``traces`` had then (later migrations add more and create the view again).
_NAMES = [c.name for c in TRACES.columns]
COLUMNS = ", ".join(f"`{name}`" for name in _NAMES[:_NAMES.index("error_spans")])


def statements(ctx):
    # On a cluster the view joins each shard's local tables (both sharded by trace); the backfill
    # goes through the Distributed tables.
    return [
        *ctx.create(TRACES_BY_START),
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv{ctx.on_cluster} TO {ctx.local('traces_by_start')}"
        f" AS SELECT {COLUMNS} FROM {ctx.local('traces')}",
        f"INSERT INTO traces_by_start ({COLUMNS}) SELECT {COLUMNS} FROM traces",
    ]
