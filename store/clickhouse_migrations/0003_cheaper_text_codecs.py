"""ZSTD(1) instead of ZSTD(3) for the large text columns (prompts, completions, messages).

Measured with bench/ingest.py: level 3 costs noticeably more CPU on every insert and every merge
for a few percent of disk; ingestion is CPU-bound on small machines.
"""

from store.schema import SPANS

TEXT_COLUMNS = ("status_message", "attributes", "resource_attributes", "event_attributes")


def statements(ctx):
    types = SPANS.column_types()
    return [
        f"ALTER TABLE spans{ctx.on_cluster} MODIFY COLUMN `{name}` {types[name]} CODEC(ZSTD(1))"
        for name in TEXT_COLUMNS
    ]
