"""Merge small parts of the summaries less often: ``merge_selector_base = 20`` on ``traces`` and
``traces_by_start`` (ClickHouse's default: 5), as 0023 did for ``spans``.

The summariser writes a part into each every run (every 2 s under traffic, a few thousand rows), and
with the default selector every few such parts were merged, then the results again: the merges of
the summaries were the largest cost the summaries add to ingestion after their own computation.
With a higher base young small parts wait until about twenty of a size have gathered: 240 parts of
2,813 summaries each cost 10.8-9.8 s of merge CPU against 17.5-16.4 s, for 9-16 parts alive against
6-9; a 60 s window read of ``traces_by_start`` with FINAL costs ~1.5 ms more, a read by trace id the
same (docs/BENCHMARKS.md "The summaries' merges").

Tables created by 0001/0009 after this change already carry the setting; MODIFY SETTING is
idempotent. On a cluster it applies to the ``_local`` tables that keep the rows.
"""

from store.schema import FEWER_MERGES, TRACES, TRACES_BY_START


def statements(ctx):
    return [statement for table in (TRACES.name, TRACES_BY_START.name)
            for statement in ctx.alter(table, f"MODIFY SETTING {FEWER_MERGES}")]
