"""Remove outdated parts every 5-10 s (``CLEANUP_SETTINGS``), not after up to 300 s: each table's
cleanup thread backed off while ingestion kept its merges going, the outdated parts (with their
metadata in memory) piled up, and a round that found over 100 spawned up to 128 threads that stayed
in the process (store/schema.py, ``CLEANUP_SETTINGS``; docs/BENCHMARKS.md "outdated parts removed every 5-10 s").

Tables created by 0001 after this change already carry the settings; MODIFY SETTING is idempotent.
On a cluster it applies to the ``_local`` tables that keep the rows.
"""

from store.schema import CLEANUP_SETTINGS, TABLES


def statements(ctx):
    return [statement for table in TABLES for statement in ctx.alter(table, f"MODIFY SETTING {CLEANUP_SETTINGS}")]
