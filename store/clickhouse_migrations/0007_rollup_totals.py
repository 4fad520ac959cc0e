"""Hour and day rollups summed over every service and model, read when a page filters neither:
a 30-day series merges several times fewer histogram entries (docs/BENCHMARKS.md "Panels")."""

from store.schema import ROLLUP_DAY_ALL, ROLLUP_HOUR_ALL


def statements(ctx):
    return [*ctx.create(ROLLUP_HOUR_ALL), *ctx.create(ROLLUP_DAY_ALL)]
