"""Demo workload support for tracedash.

``demo.simulator`` is an OpenAI-compatible LLM simulator (a plain ASGI app run by uvicorn) that the
demo workload and the load tests talk to instead of a real model provider: configurable queueing,
prefill and decode latencies, output lengths, injected errors and a concurrency capacity, all cheap
enough on CPU to serve hundreds of streamed requests a second.
"""
