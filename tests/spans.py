"""Builders of native-API span payloads for tests."""

from __future__ import annotations

import secrets
import time


def trace_id() -> str:
    return secrets.token_hex(16)


def span_id() -> str:
    return secrets.token_hex(8)


def llm_trace(*, service="chat-api", model="gpt-4o-mini", start_ns=None, error=False, name="chat") -> list[dict]:
    """A realistic four-phase LLM request: root + network, preprocess, inference, postprocess."""
    tid = trace_id()
    root = span_id()
    start = start_ns or time.time_ns() - 5_000_000_000
    ms = 1_000_000
    spans = [{
        "trace_id": tid, "span_id": root, "parent_span_id": None, "name": name, "phase": "other",
        "service": service, "model": model, "start_time": start, "duration_ms": 1200.0,
        "status": "error" if error else "ok", "status_message": "upstream timeout" if error else "",
        "attributes": {"http.route": "/v1/chat", "user.tier": "pro"},
    }]
    offset = 0
    for phase, dur in (("network", 80), ("preprocess", 120), ("inference", 900), ("postprocess", 60)):
        span = {
            "trace_id": tid, "span_id": span_id(), "parent_span_id": root, "name": phase,
            "phase": phase, "service": service, "start_time": start + offset * ms, "duration_ms": dur,
        }
        if phase == "inference":
            span.update(model=model, ttft_ms=210.5, input_tokens=812, output_tokens=164, cost_usd=0.00042,
                        events=[{"name": "first_token", "time": start + (offset + 210) * ms}])
        spans.append(span)
        offset += dur
    return spans
