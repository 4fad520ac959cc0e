"""Per-trace summaries (DESIGN §4), and a minmax index on spans.ingested_at so the summariser
finds the spans that arrived since its last run without reading the whole column."""

from store.schema import TRACES


def statements(ctx):
    return [
        *ctx.create(TRACES),
        *ctx.alter("spans", "ADD INDEX IF NOT EXISTS idx_ingested_at ingested_at TYPE minmax GRANULARITY 1"),
        *ctx.alter("spans", "MATERIALIZE INDEX idx_ingested_at"),
    ]
