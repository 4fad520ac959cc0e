"""ZSTD(1) instead of ZSTD(3) for the large text columns (prompts, completions, messages).

Measured with bench/ingest.py: level 3 costs noticeably more CPU on every insert and every merge
for a few percent of disk; ingestion is CPU-bound on small machines.
"""

from store.schema import SPANS

TEXT_COLUMNS = ("status_message", "attributes", "resource_attributes", "event_attributes")


def statements(ctx):
    types = SPANS.column_types()
    # A codec is how the stored rows are compressed: the ``_local`` tables only (a Distributed
    # table stores nothing).
    return [
        statement
        for name in TEXT_COLUMNS
        for statement in ctx.alter("spans", f"MODIFY COLUMN `{name}` {types[name]} CODEC(ZSTD(1))")
    ]
