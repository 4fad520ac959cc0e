"""A bloom filter on the keys of ``spans.dims``, so the reads that assign traces to an attribute's
values (grouping by an attribute, the Variants view, the grouped latency rules, comparing two
values) skip the granules where no span carries the key, instead of reading every span's ``dims``
of the window. Attributes such as ``user.tier`` or a prompt version are usually set on a few spans
of a trace (its entry point); the spans of the other services lie in granules of their own
(``spans`` is ordered by service, then time), which the filter skips. Measured on 10 M spans
(bench/load_spans.py, ``user.tier`` on each root): docs/BENCHMARKS.md "Variants view".

Parts stored before get the index when ``MATERIALIZE INDEX`` has run (a mutation, in the background
on a server); until then they are read as before, with the same results."""


def statements(ctx):
    return [
        *ctx.alter("spans", "ADD INDEX IF NOT EXISTS idx_dims_keys dims.keys TYPE bloom_filter(0.01) GRANULARITY 1"),
        *ctx.alter("spans", "MATERIALIZE INDEX idx_dims_keys"),
    ]
