"""Six-hour rollups (per service/model, and summed over all): the step of 30-day series, so a
month's chart merges 120 rows instead of 720 (docs/BENCHMARKS.md "Panels")."""

from store.schema import ROLLUP_6H, ROLLUP_6H_ALL


def statements(ctx):
    return [*ctx.create(ROLLUP_6H), *ctx.create(ROLLUP_6H_ALL)]
