"""Inference engines' own metrics (vLLM, TGI, SGLang, TensorRT-LLM): what they are called, and how a
scrape of their Prometheus ``/metrics`` (or the same metrics over OTLP) becomes tracedash engine samples.

Django-free and standard library only, apart from ``prometheus_client``'s text parser (the agent
never parses the exposition format itself), so the agent on a GPU host and the server's OTLP
mapping (``ingest.otlp``) share this one catalogue.

An engine sample is one value of one canonical metric of one engine instance at one time::

    {"time": ns, "host": ..., "engine": "vllm", "target": "http://gpu-1:8000/metrics",
     "model": "llama-3.1-8b", "metric": "kv_cache_usage", "value": 42.5}

Kinds of canonical metrics (``METRICS``):

- ``gauge``: the value now (running and waiting requests; KV-cache usage as a percentage 0..100,
  whatever fraction the engine reports);
- ``counter``: the cumulative count since the engine started (preemptions, tokens, requests);
  readers take increases between samples, a drop (an engine restart) starting again from 0;
- ``histogram``: the cumulative bucket counts, one sample per bucket with ``le`` (the bucket's
  upper bound in seconds; ``"+Inf"`` for the count), plus ``<metric>_sum`` (seconds): percentiles over a
  window come from bucket increases, as Prometheus' ``histogram_quantile`` does.

Series an engine splits by labels tracedash does not keep (vLLM's ``engine`` rank of a
data-parallel server, ``finished_reason``) are added up per model — except fractions (KV-cache
usage), which are averaged. Everything not in the catalogue is left out and counted as ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GAUGE = "gauge"
COUNTER = "counter"
HISTOGRAM = "histogram"

# canonical metric -> (kind, what it is). The names users see in docs/engines.md and the API.
METRICS: dict[str, tuple[str, str]] = {
    "requests_running": (GAUGE, "requests being processed (in the running batch)"),
    "requests_waiting": (GAUGE, "requests queued, waiting for a batch slot or KV-cache room"),
    "requests_swapped": (GAUGE, "requests swapped out to CPU memory (vLLM V0)"),
    "kv_cache_usage": (GAUGE, "KV-cache blocks in use, % (100 = full: new requests wait, running ones are preempted)"),
    "preemptions": (COUNTER, "requests preempted (their KV cache freed, recomputed later)"),
    "prompt_tokens": (COUNTER, "prompt (prefill) tokens processed"),
    "generation_tokens": (COUNTER, "tokens generated"),
    "requests_succeeded": (COUNTER, "requests finished successfully"),
    "requests_failed": (COUNTER, "requests that failed"),
    "requests": (COUNTER, "requests received"),
    "ttft_seconds": (HISTOGRAM, "engine-side time to first token: arrival to first token, queueing included"),
    "e2e_seconds": (HISTOGRAM, "engine-side request latency: arrival to last token"),
    "queue_seconds": (HISTOGRAM, "time a request waited in the engine's queue before it was scheduled"),
    "inter_token_seconds": (HISTOGRAM, "time between two output tokens (TPOT)"),
}
SUM_SUFFIX = "_sum"  # <histogram metric>_sum: the sum of the observed values, seconds

# Source metric family (Prometheus name, ``_total`` stripped) -> (engine, canonical metric, scale).
# vLLM: V1 engine names (vllm/v1/metrics/loggers.py) and the V0 ones they replaced.
# TGI: docs "text-generation-inference/reference/metrics"; its counters have no ``_total``.
# SGLang: sglang/srt/metrics/collector.py. TensorRT-LLM below.
SOURCES: dict[str, tuple[str, str, float]] = {
    "vllm:num_requests_running": ("vllm", "requests_running", 1.0),
    "vllm:num_requests_waiting": ("vllm", "requests_waiting", 1.0),
    "vllm:num_requests_swapped": ("vllm", "requests_swapped", 1.0),
    "vllm:kv_cache_usage_perc": ("vllm", "kv_cache_usage", 100.0),  # a fraction 0..1, despite the name
    "vllm:gpu_cache_usage_perc": ("vllm", "kv_cache_usage", 100.0),  # V0 / early V1 name, also 0..1
    "vllm:num_preemptions": ("vllm", "preemptions", 1.0),
    "vllm:prompt_tokens": ("vllm", "prompt_tokens", 1.0),
    "vllm:generation_tokens": ("vllm", "generation_tokens", 1.0),
    "vllm:request_success": ("vllm", "requests_succeeded", 1.0),
    "vllm:time_to_first_token_seconds": ("vllm", "ttft_seconds", 1.0),
    "vllm:e2e_request_latency_seconds": ("vllm", "e2e_seconds", 1.0),
    "vllm:request_queue_time_seconds": ("vllm", "queue_seconds", 1.0),
    "vllm:inter_token_latency_seconds": ("vllm", "inter_token_seconds", 1.0),
    "vllm:time_per_output_token_seconds": ("vllm", "inter_token_seconds", 1.0),  # V0 name
    "tgi_batch_current_size": ("tgi", "requests_running", 1.0),
    "tgi_queue_size": ("tgi", "requests_waiting", 1.0),
    "tgi_request_count": ("tgi", "requests", 1.0),
    "tgi_request_success": ("tgi", "requests_succeeded", 1.0),
    "tgi_request_failure": ("tgi", "requests_failed", 1.0),
    "tgi_request_duration": ("tgi", "e2e_seconds", 1.0),
    "tgi_request_queue_duration": ("tgi", "queue_seconds", 1.0),
    "tgi_request_mean_time_per_token_duration": ("tgi", "inter_token_seconds", 1.0),
    "sglang:num_running_reqs": ("sglang", "requests_running", 1.0),
    "sglang:num_queue_reqs": ("sglang", "requests_waiting", 1.0),
    "sglang:token_usage": ("sglang", "kv_cache_usage", 100.0),  # fraction of KV-cache tokens in use
    "sglang:prompt_tokens": ("sglang", "prompt_tokens", 1.0),
    "sglang:generation_tokens": ("sglang", "generation_tokens", 1.0),
    "sglang:time_to_first_token_seconds": ("sglang", "ttft_seconds", 1.0),
    "sglang:e2e_request_latency_seconds": ("sglang", "e2e_seconds", 1.0),
    "sglang:inter_token_latency_seconds": ("sglang", "inter_token_seconds", 1.0),
    "sglang:time_per_output_token_seconds": ("sglang", "inter_token_seconds", 1.0),
}
# TensorRT-LLM: trtllm-serve's Prometheus metrics (tensorrt_llm/metrics/collector.py, ``trtllm_``
# names); older NVIDIA Dynamo releases forwarded its first five (per-request) metrics as
# ``trtllm:<name>``.
_TRTLLM = {
    "num_requests_running": ("requests_running", 1.0),
    "num_requests_waiting": ("requests_waiting", 1.0),
    "kv_cache_utilization": ("kv_cache_usage", 100.0),  # used blocks / max blocks, a fraction 0..1
    "request_success": ("requests_succeeded", 1.0),
    "request_error": ("requests_failed", 1.0),  # all http_codes
    "prompt_tokens": ("prompt_tokens", 1.0),
    "generation_tokens": ("generation_tokens", 1.0),
    "time_to_first_token_seconds": ("ttft_seconds", 1.0),
    "e2e_request_latency_seconds": ("e2e_seconds", 1.0),
    "request_queue_time_seconds": ("queue_seconds", 1.0),
    "time_per_output_token_seconds": ("inter_token_seconds", 1.0),
}
_TRTLLM_DYNAMO = ("request_success", "time_to_first_token_seconds", "e2e_request_latency_seconds",
                  "request_queue_time_seconds", "time_per_output_token_seconds")
SOURCES.update({f"trtllm_{name}": ("trtllm", metric, scale) for name, (metric, scale) in _TRTLLM.items()})
SOURCES.update({f"trtllm:{name}": ("trtllm", *_TRTLLM[name]) for name in _TRTLLM_DYNAMO})
ENGINES = ("vllm", "tgi", "sglang", "trtllm")
# Fractions: averaged over the series an engine splits them into, never added up.
_AVERAGED = {"kv_cache_usage"}
# The label that names the served model, per engine (TGI serves one model and does not label it).
MODEL_LABELS = ("model_name", "model")
MAX_LABEL_CHARS = 256
MAX_VALUE = 1e15


def family_name(name: str) -> str:
    """A metric family's name as the catalogue keys it (``…_total`` of a counter stripped)."""
    return name[:-6] if name.endswith("_total") else name


def source_of(name: str) -> tuple[str, str, float] | None:
    """(engine, canonical metric, scale) of a source family name (with or without ``_total``), or None."""
    return SOURCES.get(name) or SOURCES.get(family_name(name))


def is_engine_metric(name: str) -> bool:
    """Whether an OTLP metric of this name (or its histogram) carries an engine figure."""
    return source_of(name) is not None


@dataclass(frozen=True)
class Sample:
    """One exposition sample: its full name (``x_bucket``, ``x_sum``, ``x_total``…), labels, value."""

    name: str
    labels: dict
    value: float


def _model(labels: dict) -> str:
    for key in MODEL_LABELS:
        value = labels.get(key)
        if value:
            return str(value)[:MAX_LABEL_CHARS]
    return ""


def _le(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def samples_rows(families, *, time_ns: int, host: str, target: str, engine: str = "") -> tuple[list[dict], int]:
    """Families of ``(family name, type, samples)`` -> (engine sample rows, ignored samples).

    ``type`` is the exposition type (``gauge``/``counter``/``histogram``/``unknown``…); histogram
    samples are the ``_bucket`` (with ``le``), ``_sum`` and ``_count`` ones. ``engine`` (the
    ``--scrape`` label) wins over the engine a name belongs to."""
    sums: dict[tuple, float] = {}
    counts: dict[tuple, int] = {}
    seen_engines: list[str] = []
    ignored = 0
    for name, kind, samples in families:
        source = source_of(name)
        if source is None and kind in ("unknown", "untyped", ""):
            # No TYPE line: each histogram part comes as a family of its own (``x_bucket``, ``x_sum``).
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and source_of(name[: -len(suffix)]):
                    source, name = source_of(name[: -len(suffix)]), name[: -len(suffix)]
                    break
        if source is None:
            ignored += len(samples)
            continue
        own_engine, metric, scale = source
        histogram = METRICS[metric][0] == HISTOGRAM
        for sample in samples:
            value = float(sample.value)
            if not math.isfinite(value) or value < 0:
                ignored += 1
                continue
            model = _model(sample.labels)
            if histogram:
                if sample.name.endswith("_bucket"):
                    le = _le(sample.labels.get("le"))
                    if le is None:
                        ignored += 1
                        continue
                    key = (metric, model, le)
                elif sample.name.endswith("_sum"):
                    key = (metric + SUM_SUFFIX, model, 0.0)
                else:  # _count (the +Inf bucket says the same), _created, gsum…
                    continue
            elif sample.name.endswith("_created"):  # a creation timestamp, not a value
                continue
            else:
                key = (metric, model, 0.0)
                value *= scale
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
            if own_engine not in seen_engines:
                seen_engines.append(own_engine)
    engine = engine or (seen_engines[0] if seen_engines else "")
    rows = []
    for key, total in sums.items():
        metric, model, le = key
        value = total / counts[key] if metric in _AVERAGED else total
        row = {"time": int(time_ns), "host": host[:MAX_LABEL_CHARS], "engine": engine,
               "target": target[:MAX_LABEL_CHARS], "model": model, "metric": metric,
               "value": min(value, MAX_VALUE)}
        if METRICS.get(metric, (None,))[0] == HISTOGRAM:
            row["le"] = "+Inf" if le == math.inf else le  # JSON has no infinity: the API takes "+Inf"
        rows.append(row)
    return rows, ignored


def parse_exposition(text: str) -> list[tuple[str, str, list[Sample]]]:
    """Prometheus text exposition (``/metrics``) -> families, by ``prometheus_client``'s parser.
    Raises ValueError for text it cannot parse."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(family.name, family.type, [Sample(s.name, dict(s.labels), s.value) for s in family.samples])
            for family in text_string_to_metric_families(text)]


_TARGET = re.compile(r"^(?:(?P<engine>[A-Za-z][\w.-]{0,63})=)?(?P<url>https?://\S+)$")


def parse_target(text: str) -> tuple[str, str]:
    """``--scrape`` value -> (engine label or '', URL). ``vllm=http://gpu-1:8000/metrics`` or just the
    URL (the engine is then recognised from its metric names); a URL without a path gets ``/metrics``."""
    match = _TARGET.match(text.strip())
    if not match:
        raise ValueError(f"expected [ENGINE=]http(s)://host:port[/path], got {text!r}")
    url = match.group("url")
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url = f"{scheme}://{rest}/metrics"
    return (match.group("engine") or "").lower(), url
