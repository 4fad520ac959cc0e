"""Short attribute values per span and per trace, so grouping by an attribute and the Variants view
read a few bytes per trace instead of the spans' attribute maps with their prompts.

- ``spans.dims``: each span's short attribute values (span attribute over resource attribute, empty
  values and values over 256 bytes left out), filled by ClickHouse at insert. Spans stored before
  keep none of their own: ClickHouse computes the column from their attribute maps when they are
  read (same values, at the old cost) until those parts are merged or age out;
  ``ALTER TABLE spans MATERIALIZE COLUMN dims`` writes it for them at once (a mutation that
  rewrites the parts, not run here).
- ``traces.dims`` / ``traces_by_start.dims``: the trace's value of each key (its earliest span's),
  written by the summariser, with ``dims_ok`` = 1. Summaries written before have ``dims_ok`` = 0,
  and the readers take those traces' values from their spans (analytics.grouping), so every
  figure stays the same; they get ``dims`` when summarised again.

The materialized view that copies ``traces`` into ``traces_by_start`` lists its columns, so it is
created again with the new ones.
"""

from store.schema import SPANS, TRACES, TRACES_BY_START

ALL_COLUMNS = ", ".join(f"`{c.name}`" for c in TRACES.columns)


def _ddl(table, name: str) -> str:
    return {c.name: c for c in table.columns}[name].ddl()


def statements(ctx):
    return [
        f"ALTER TABLE spans{ctx.on_cluster} ADD COLUMN IF NOT EXISTS {_ddl(SPANS, 'dims')}",
        *(f"ALTER TABLE {table.name}{ctx.on_cluster} ADD COLUMN IF NOT EXISTS {_ddl(table, name)}"
          for table in (TRACES, TRACES_BY_START) for name in ("dims", "dims_ok")),
        f"DROP VIEW IF EXISTS traces_by_start_mv{ctx.on_cluster}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS traces_by_start_mv{ctx.on_cluster} TO traces_by_start"
        f" AS SELECT {ALL_COLUMNS} FROM traces",
    ]
