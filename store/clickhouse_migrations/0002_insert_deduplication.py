"""Keep insert deduplication tokens, so a replayed spool segment is stored once.

Tables created by 0001 after this change already carry the setting; MODIFY SETTING is idempotent.
"""

from store.schema import DEDUP_WINDOW, RESOURCE_SAMPLES, SPANS


def statements(ctx):
    return [f"ALTER TABLE {table.name}{ctx.on_cluster} MODIFY SETTING {DEDUP_WINDOW}" for table in (SPANS, RESOURCE_SAMPLES)]
