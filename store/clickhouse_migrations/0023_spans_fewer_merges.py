"""Merge small parts of ``spans`` less often: ``merge_selector_base = 20`` (ClickHouse's default: 5).

The ingest writer stores what its requests brought since the last insert: under load from many
small batches (100-span requests) a part holds ~800 rows, and ClickHouse's default merge selector
soon merges every few such parts, then the results again: each span was rewritten (its skip
indexes rebuilt) several times, and those merges cost more CPU than the inserts themselves. With a
higher base, young small parts wait until about twenty of a size have gathered before they merge
(older and larger parts merge as before: the selector lowers the base with a part's age and size),
so a span is rewritten fewer times, for a few more parts alive in the current day's partition.
Measured in docs/BENCHMARKS.md ("Merges of small parts").

Tables created by 0001 after this change already carry the setting; MODIFY SETTING is idempotent.
On a cluster it applies to the ``_local`` tables that keep the rows.
"""

from store.schema import SPANS, FEWER_MERGES


def statements(ctx):
    return ctx.alter(SPANS.name, f"MODIFY SETTING {FEWER_MERGES}")
