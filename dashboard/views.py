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


@login_required
def traces_list(request):
    project = current_project(request)
    context = {"traces": [], "store_error": None}
    if project is not None:
        try:
            context["traces"] = selectors.traces_recent(project_id=project.pk)
        except StoreError as exc:
            log.error("traces list failed: %s", exc)
            context["store_error"] = "The trace store is unavailable right now; this page will work again when it returns."
    status = 503 if context["store_error"] else 200
    return render(request, "dashboard/traces.html", context, status=status)


@login_required
def resources_latest(request):
    """Latest host and GPU figures (the charts over time arrive with the panels work)."""
    project = current_project(request)
    context = {"rows": [], "store_error": None, "gpu_memory_threshold": GPU_MEMORY_THRESHOLD,
               "cpu_threshold": CPU_THRESHOLD}
    if project is not None:
        try:
            context["rows"] = selectors.resources_latest(project_id=project.pk)
        except StoreError as exc:
            log.error("resources page failed: %s", exc)
            context["store_error"] = "The trace store is unavailable right now; this page will work again when it returns."
    return render(request, "dashboard/resources.html", context, status=503 if context["store_error"] else 200)


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
