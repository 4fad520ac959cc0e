"""Keep insert deduplication tokens, so a replayed spool segment is stored once.

Tables created by 0001 after this change already carry the setting; MODIFY SETTING is idempotent.

On a cluster the setting is the replicated tables' own (``replicated_deduplication_window``…), on
the ``_local`` tables that keep the rows.
"""

from store.schema import RESOURCE_SAMPLES, SPANS


def statements(ctx):
    return [s for table in (SPANS, RESOURCE_SAMPLES) for s in ctx.alter(table.name, f"MODIFY SETTING {ctx.dedup_window}")]
