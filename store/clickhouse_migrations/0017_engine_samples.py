"""Inference engines' metrics (vLLM, TGI, SGLang ``/metrics`` scraped by the agent, or the same
names over OTLP) beside the resource samples: store.schema.ENGINE_SAMPLES, expired like them."""

from store.schema import ENGINE_SAMPLES


def statements(ctx):
    return ctx.create(ENGINE_SAMPLES)
