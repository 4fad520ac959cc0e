"""Hand-computable cache traffic for the cache-figure tests (docs/definitions.md "Cache").

Three endpoints in a 10-minute window starting at ``t0`` (10-second series buckets), sent as
native-API spans through the ingest parser and summarised by the summariser's ClickHouse SQL:

| endpoint | request | E2E ms | cache | cost USD | tokens (in + out) | bucket |
| --- | --- | ---: | --- | ---: | ---: | --- |
| chat-api · POST /chat | miss 1 | 1000 | miss | 0.003 | 800 + 200 | 0 |
| | miss 2 | 1200 | miss | 0.004 | 900 + 300 | 0 |
| | hit 1 | 10 | hit | – | – | 0 |
| | no cache | 800 | – | 0.002 | 500 + 100 | 0 |
| | miss 3 | 1400 | miss | 0.005 | 1000 + 400 | 6 |
| | hit 2 | 30 | miss, then a late hit | – | – | 6 |
| chat-api · POST /summarize | miss 1 | 2000 | miss | 0.01 | 2000 + 1000 | 0 |
| | hit | 50 | hit (its root arrives late) | – | – | 0 |
| | miss 2 | 3000 | miss | unknown | 4000 + 1000 | 6 |
| search · GET /search | hit 1, hit 2 | 5, 15 | hit | – | – | 6 |

Expected, by the definitions: /chat hit rate 2/5, P50 of misses 1200 ms (nearest rank of 3) −
P50 of hits 10 ms (nearest rank of 2: the lower) = 1190 ms saved, mean miss cost 0.004 → 0.008
saved, mean miss tokens 1200 → 2400 saved; /summarize 1/3, 2000 − 50 = 1950 ms, 0.01 (the costed
miss only), 4000 tokens (both misses); /search 2/2, no miss: nothing priced, 2 unpriced hits.
Window: 10 requests consulted a cache, 5 hits (50 %), latency saved (2 × 1190 + 1950) / 3 ms,
0.018 USD and 6400 tokens saved. Bucket 0: 2/5, (990 + 1950) / 2 ms, 0.014 USD, 5200 tokens;
bucket 6: 3/5, 1370 ms, 0.004 USD, 1200 tokens.
"""

from __future__ import annotations

import json

from analytics.rollup_services import rollups_rebuild
from analytics.summarizer import traces_summarize
from ingest.schemas import Limits, parse_span
from store import get_store
from tests.spans import span_id, trace_id

S = 10**9
MS = 10**6


def request(*, service: str, name: str, start_ns: int, e2e_ms: float, cache: bool | None = None,
            cost: float | None = None, tokens: tuple[int, int] | None = None) -> list[dict]:
    """A request: its root, a ``cache`` span saying hit or miss (``cache`` True / False; None: no
    cache consulted), and on a miss (or without cache) a model call with its tokens and cost."""
    tid, root = trace_id(), span_id()
    spans = [{"trace_id": tid, "span_id": root, "parent_span_id": None, "name": name, "service": service,
              "start_time": start_ns, "duration_ms": e2e_ms}]
    if cache is not None:
        spans.append({"trace_id": tid, "span_id": span_id(), "parent_span_id": root, "name": "cache semantic",
                      "phase": "preprocess", "service": service, "start_time": start_ns, "duration_ms": min(e2e_ms, 3),
                      "attributes": {"tracedash.cache.hit": cache, "tracedash.cache.name": "semantic"}})
    if not cache:
        call = {"trace_id": tid, "span_id": span_id(), "parent_span_id": root, "name": "chat m-unpriced",
                "phase": "inference", "model": "m-unpriced", "service": service, "start_time": start_ns + 3 * MS,
                "duration_ms": e2e_ms - 3}
        if tokens:
            call.update(input_tokens=tokens[0], output_tokens=tokens[1])
        if cost is not None:
            call["cost_usd"] = cost
        spans.append(call)
    return spans


def insert(project_id: int, spans: list[dict]) -> None:
    rows = [parse_span(json.dumps(s).encode(), project_id=project_id, limits=Limits()) for s in spans]
    get_store().insert("spans", rows, tag="tests.cache_seed.spans")


def seed_cache_traffic(project_id: int, t0_ns: int) -> dict[str, list[dict]]:
    """Insert and summarise the table above (late spans and a re-sent trace included), and roll
    the window up (the pages' request figures)."""
    b0, b6 = t0_ns + 1 * S, t0_ns + 61 * S
    chat, summarize = ("chat-api", "POST /chat"), ("chat-api", "POST /summarize")
    r = {
        "chat_miss_1": request(service=chat[0], name=chat[1], start_ns=b0, e2e_ms=1000, cache=False, cost=0.003,
                               tokens=(800, 200)),
        "chat_miss_2": request(service=chat[0], name=chat[1], start_ns=b0 + S, e2e_ms=1200, cache=False, cost=0.004,
                               tokens=(900, 300)),
        "chat_hit_1": request(service=chat[0], name=chat[1], start_ns=b0 + 2 * S, e2e_ms=10, cache=True),
        "chat_plain": request(service=chat[0], name=chat[1], start_ns=b0 + 3 * S, e2e_ms=800, cost=0.002,
                              tokens=(500, 100)),
        "chat_miss_3": request(service=chat[0], name=chat[1], start_ns=b6, e2e_ms=1400, cache=False, cost=0.005,
                               tokens=(1000, 400)),
        "chat_hit_2": request(service=chat[0], name=chat[1], start_ns=b6 + S, e2e_ms=30, cache=False),
        "sum_miss_1": request(service=summarize[0], name=summarize[1], start_ns=b0 + 4 * S, e2e_ms=2000, cache=False,
                              cost=0.01, tokens=(2000, 1000)),
        "sum_hit": request(service=summarize[0], name=summarize[1], start_ns=b0 + 5 * S, e2e_ms=50, cache=True),
        "sum_miss_2": request(service=summarize[0], name=summarize[1], start_ns=b6 + 2 * S, e2e_ms=3000, cache=False,
                              tokens=(4000, 1000)),
        "search_hit_1": request(service="search", name="GET /search", start_ns=b6 + 3 * S, e2e_ms=5, cache=True),
        "search_hit_2": request(service="search", name="GET /search", start_ns=b6 + 4 * S, e2e_ms=15, cache=True),
    }
    # /chat hit 2 first looked like a miss (an exact-match cache missed and the model call was on
    # its way); the semantic cache's hit, and no model call, is what it finally was: its model-call
    # span never comes, and the hit arrives late.
    chat_hit_2 = r["chat_hit_2"]
    early_chat_hit_2 = [chat_hit_2[0], dict(chat_hit_2[1], name="cache exact",
                                            attributes={"tracedash.cache.hit": False})]
    late_semantic_hit = dict(chat_hit_2[1], span_id=span_id(), attributes={"tracedash.cache.hit": True})
    r["chat_hit_2"] = early_chat_hit_2 + [late_semantic_hit]
    # /summarize's hit: its cache span first, its root later (no request until the root arrives).
    early, late_root = r["sum_hit"][1:], r["sum_hit"][:1]
    first = [s for key, spans in r.items() if key not in ("chat_hit_2", "sum_hit") for s in spans]
    insert(project_id, first + early_chat_hit_2 + early)
    traces_summarize(project_ids=[project_id])
    insert(project_id, [late_semantic_hit] + late_root + r["chat_miss_1"])  # late spans, and a re-sent trace
    traces_summarize(project_ids=[project_id])
    rollups_rebuild(project_id=project_id, from_ns=t0_ns, to_ns=t0_ns + 600 * S)  # the request figures of the pages
    return r
