"""``spans.dims``: each span's short attribute values (span attribute over resource attribute, empty
and over-long values left out), filled by ClickHouse at insert, so grouping by an attribute and the
Variants view read a few bytes per span instead of the attribute maps with their prompts.

Spans stored before keep no ``dims`` of their own: ClickHouse computes the column's expression from
their ``attributes`` when they are read, so figures are the same, at the old cost, until those parts
are merged or age out. ``ALTER TABLE spans MATERIALIZE COLUMN dims`` writes it for them at once
(a mutation: it rewrites the parts, and is not run here).
"""

from store.schema import SPANS


def statements(ctx):
    dims = {c.name: c for c in SPANS.columns}["dims"].ddl()
    return ctx.alter("spans", f"ADD COLUMN IF NOT EXISTS {dims}", distributed=True)
