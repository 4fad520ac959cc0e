"""Spans and resource samples (DESIGN §4)."""

from store.schema import RESOURCE_SAMPLES, SPANS


def statements(ctx):
    return [*ctx.create(SPANS), *ctx.create(RESOURCE_SAMPLES)]
