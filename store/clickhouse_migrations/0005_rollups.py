"""Rollups (minute, hour, day) of the traces table, the dirty-minute marks that drive them, and
the per-project watermarks of the summariser and rollup jobs."""

from store.schema import ROLLUP_DAY, ROLLUP_DIRTY, ROLLUP_HOUR, ROLLUP_MINUTE, TASK_WATERMARKS


def statements(ctx):
    return [
        *ctx.create(ROLLUP_MINUTE),
        *ctx.create(ROLLUP_HOUR),
        *ctx.create(ROLLUP_DAY),
        *ctx.create(ROLLUP_DIRTY),
        *ctx.create(TASK_WATERMARKS),
    ]
