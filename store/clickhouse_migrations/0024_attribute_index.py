"""The attribute index: ``dim_keys`` (the keys each project groups by) and ``span_key_values`` (for
each such key, each trace carrying it: its earliest value, ordered by project, key and start).
Assigning a week's traces to the values of ``user.tier`` read every span's ``dims`` in the week's
granules holding the key (10 M spans: 230 of a 420 ms grouped series on a busy machine); the index
reads that key's rows only (docs/BENCHMARKS.md "The attribute index").

analytics.attribute_index declares a key on its first use and backfills it; the summariser indexes
the declared keys of every trace it summarises. Nothing else writes here: an insert into ``spans``
costs what it did (a materialized view on ``spans`` cost every insert 3–10 ms, declared key or
not: bench/insert_cost.py).
"""

from store.schema import DIM_KEYS, SPAN_KEY_VALUES


def statements(ctx):
    return [*ctx.create(DIM_KEYS), *ctx.create(SPAN_KEY_VALUES)]
