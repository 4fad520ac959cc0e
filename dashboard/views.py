from __future__ import annotations

import logging

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render

from store import StoreError, get_store

from . import selectors
from .project_scope import current_project

log = logging.getLogger("tracedash.dashboard")
GPU_MEMORY_THRESHOLD = 85.0  # DOMAIN.md: GPU memory % >= 85 — scale out before out-of-memory errors
CPU_THRESHOLD = 70.0  # DOMAIN.md: host CPU % > 70 — pre/post-processing needs optimising


STORE_DOWN = "The trace store is unavailable right now; this page will work again when it returns."


def _project_page(request, template: str, key: str, select, **extra):
    """A page of the current project's data: ``context[key] = select(project_id)``; a 503 page
    saying the store is down when ClickHouse fails."""
    project = current_project(request)
    context = {key: [], "store_error": None, **extra}
    if project is not None:
        try:
            context[key] = select(project.pk)
        except StoreError as exc:
            log.error("%s failed: %s", template, exc)
            context["store_error"] = STORE_DOWN
    return render(request, template, context, status=503 if context["store_error"] else 200)


@login_required
def traces_list(request):
    return _project_page(request, "dashboard/traces.html", "traces",
                         lambda project_id: selectors.traces_recent(project_id=project_id))


@login_required
def resources_latest(request):
    """Latest host and GPU figures (the charts over time arrive with the panels work)."""
    return _project_page(request, "dashboard/resources.html", "rows",
                         lambda project_id: selectors.resources_latest(project_id=project_id),
                         gpu_memory_threshold=GPU_MEMORY_THRESHOLD, cpu_threshold=CPU_THRESHOLD)


def healthz(request):
    """Readiness of the web process, ClickHouse and the metadata database."""
    checks = {"web": {"ok": True}}
    store = get_store()
    try:
        store.ping()
        checks["clickhouse"] = {"ok": True, "backend": store.kind}
    except StoreError as exc:
        checks["clickhouse"] = {"ok": False, "backend": store.kind, "error": str(exc)[:500]}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks["database"] = {"ok": True, "vendor": connection.vendor}
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported in the body
        checks["database"] = {"ok": False, "vendor": connection.vendor, "error": str(exc)[:500]}
    from ingest.writer import get_writer

    writer = get_writer().health()
    # Spooled data is safe, but a full spool means ingestion answers 503.
    writer["ok"] = writer["spool_bytes"] < writer["spool_limit_bytes"]
    checks["ingest"] = writer
    ok = all(check["ok"] for check in checks.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)
