"""Builders for the alerts tests: resource samples and spans at scripted times, rules and channels."""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta, timezone

from store import get_store

GiB = 2**30
# Scripted time, an hour ago: recent enough that the tables' retention TTL never drops the rows.
T0 = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=1)


def ns(when: datetime) -> int:
    return int(when.timestamp() * 1e9)


def sample(project_id, when, *, host="gpu-1", gpu_index=0, mem_pct=None, util=None, temp=None, cpu=None,
           host_mem_pct=None, processes=()):
    return {
        "project_id": project_id, "time": ns(when), "host": host, "gpu_index": gpu_index,
        "gpu_uuid": f"GPU-{host}-{gpu_index}" if gpu_index >= 0 else "", "gpu_name": "Fake H100" if gpu_index >= 0 else "",
        "gpu_utilization": util, "gpu_memory_used": None if mem_pct is None else int(80 * GiB * mem_pct / 100),
        "gpu_memory_total": None if mem_pct is None else 80 * GiB, "gpu_temperature": temp, "gpu_power_watts": None,
        "cpu_percent": cpu, "memory_used": None if host_mem_pct is None else int(64 * GiB * host_mem_pct / 100),
        "memory_total": None if host_mem_pct is None else 64 * GiB,
        "process_pids": [p[0] for p in processes], "process_names": [p[1] for p in processes],
        "process_gpu_memory": [p[2] for p in processes],
    }


def insert_samples(rows):
    get_store().insert("resource_samples", rows, tag="tests.alerts.samples")


def span(project_id, trace_id, *, start, duration_ms, parent="", phase="other", service="chat-api", model="",
         status="ok", ttft_ms=None, span_id=None):
    return {
        "project_id": project_id, "trace_id": trace_id, "span_id": span_id or secrets.token_hex(8),
        "parent_span_id": parent, "name": phase, "phase": phase, "phase_fallback": 0, "cache": 0, "service": service, "model": model,
        "start_time": ns(start), "duration_ns": int(duration_ms * 1e6), "status": status, "status_message": "",
        "ttft_ns": None if ttft_ms is None else int(ttft_ms * 1e6), "input_tokens": 0, "output_tokens": 0,
        "cost_usd": None, "attributes": {}, "resource_attributes": {}, "event_times": [], "event_names": [],
        "event_attributes": [],
    }


def request(project_id, *, start, e2e_ms, network_ms=0, inference_ms=0, service="chat-api", model="m1",
            status="ok", ttft_ms=None):
    """One trace: a root of ``e2e_ms`` with a network child and an inference child laid end to end."""
    tid = secrets.token_hex(16)
    root = secrets.token_hex(8)
    rows = [span(project_id, tid, start=start, duration_ms=e2e_ms, span_id=root, service=service, status=status)]
    at = start
    if network_ms:
        rows.append(span(project_id, tid, start=at, duration_ms=network_ms, parent=root, phase="network", service=service))
        at += timedelta(milliseconds=network_ms)
    if inference_ms:
        rows.append(span(project_id, tid, start=at, duration_ms=inference_ms, parent=root, phase="inference",
                         service=service, model=model, ttft_ms=ttft_ms))
    return rows


def insert_spans(rows):
    get_store().insert("spans", rows, tag="tests.alerts.spans")


def alerts_project(*, webhook_url: str, name: str = "worker-alerts", threshold: float = 85.0, for_seconds: int = 0) -> dict:
    """worker_server ``--setup`` hook: a project, its ingest key, a webhook channel and one GPU
    memory rule (``for`` 0), in the worker process's own database."""
    from alerts.models import AlertRule
    from alerts.services import channel_create, rule_create
    from projects.services import project_create

    project, key = project_create(name=name)
    AlertRule.objects.filter(project=project).delete()  # only the rule under test
    channel = channel_create(project=project, name="hook", kind="webhook", url=webhook_url, secret="worker-secret",
                             group_interval_seconds=0)
    rule = rule_create(project=project, name="GPU memory ≥ 85 %", metric="gpu_memory_percent", aggregation="last",
                       window_seconds=60, comparator="gte", threshold=threshold, for_seconds=for_seconds,
                       channels=[channel])
    return {"project_id": project.pk, "key": key, "rule_id": rule.pk}
