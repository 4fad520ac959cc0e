"""Scores of traces and spans (``POST /api/v1/scores``, the SDK's ``score``, OTel attributes, the
trace page's review buttons): store.schema.SCORES, expired from when each score was given."""

from store.schema import SCORES


def statements(ctx):
    return ctx.create(SCORES)
