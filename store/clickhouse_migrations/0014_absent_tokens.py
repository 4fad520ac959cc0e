"""Tokens a span did not report are unknown, not 0 (definitions.md "Missing is not zero").

``spans.input_tokens`` / ``output_tokens`` become ``Nullable(UInt32)``: both ingestion paths store
NULL when a span carries no token count (a failed call, a span that is not a model call). Rows
written before keep their 0. The summaries add what was reported (NULL counts as nothing), so the
per-trace sums are unchanged; the trace page shows "—" for a span or request that reported none.

A server rewrites the two columns of every part (a mutation, in the background).
"""

from store.schema import SPANS

_COLUMNS = {c.name: c for c in SPANS.columns}


def statements(ctx):
    modify = ", ".join(f"MODIFY COLUMN {_COLUMNS[name].ddl()}" for name in ("input_tokens", "output_tokens"))
    # A new type: the Distributed table takes it too, or it would turn a NULL into 0 on insert.
    return ctx.alter("spans", modify, distributed=True)
