"""The trace explorer: ``/traces/`` (the page) and ``/traces/rows.json`` (the same query as JSON,
used by the page's live updates). Both read the whole query from the URL; a bad value is a form
error (400) naming the parameter, never a 500."""

from __future__ import annotations

import logging
import re

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render

from charts import PHASE_COLORS
from projects.scope import current_project
from store import StoreError

from .explorer import (
    DIRECTIONS, MIN_TRACE_ID_PREFIX, MS, PAGE_SIZE, PHASES, SORTS, STATUSES, TRACE_ID_PREFIX, Cursor, ExplorerQuery,
    QueryError, explorer_count, explorer_facets, explorer_page, explorer_rows_for_ids,
)
from .filters import FilterBar, filter_bar_from_query
from .views import json_login_required

log = logging.getLogger("tracedash.dashboard")
STORE_DOWN = "The trace store is unavailable right now; this page will work again when it returns."
DEFAULT_RANGE = "24h"
MAX_MS = 7 * 24 * 3600 * 1000  # a span lasts at most 7 days (ingest limit)
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
LIVE_IDS_MAX = 200
SORT_LABELS = {"start": "Start (UTC)", "duration": "Duration", "ttft": "TTFT", "cost": "Cost"}


def _ms(params, key: str, errors: dict) -> int | None:
    text = (params.get(key) or "").strip()
    if not text:
        return None
    if not _NUMBER.match(text) or float(text) > MAX_MS:
        errors[key] = f"must be a number of milliseconds between 0 and {MAX_MS}"
        return None
    return round(float(text) * MS)


def explorer_query_parse(params, *, bar: FilterBar) -> tuple[ExplorerQuery | None, dict[str, str]]:
    """The explorer query of a request, or None and ``{parameter: message}``."""
    errors: dict[str, str] = {}
    for name, message in bar.field_errors:  # messages without the name: the page shows it beside them
        errors.setdefault(name, message)
    status = (params.get("status") or "").strip()
    if status and status not in STATUSES:
        errors["status"] = "must be ok, recovered or error"
    phase = (params.get("phase") or "").strip()
    if phase and phase not in PHASES:
        errors["phase"] = f"must be one of {', '.join(PHASES)}"
    min_ns, max_ns, ttft_ns = _ms(params, "min_ms", errors), _ms(params, "max_ms", errors), _ms(params, "ttft_ms", errors)
    if min_ns is not None and max_ns is not None and min_ns > max_ns:
        errors["max_ms"] = "must not be below the minimum duration"
    attribute = None
    attr = (params.get("attr") or "").strip()
    if attr:
        key, sep, value = attr.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            errors["attr"] = "must be key=value, e.g. user.id=u-00042"
        elif len(key) > 256 or len(value) > 1024:
            errors["attr"] = "key at most 256 characters, value at most 1024"
        else:
            attribute = (key, value)
    trace_id = (params.get("trace_id") or "").strip().lower()
    if trace_id and not TRACE_ID_PREFIX.match(trace_id):
        errors["trace_id"] = (f"must be a trace id (32 hex characters) or its first {MIN_TRACE_ID_PREFIX} or more,"
                              " as the list shows it")
    sort = params.get("sort") or "start"
    if sort not in SORTS:
        errors["sort"] = f"must be one of {', '.join(SORTS)}"
    direction = params.get("dir") or "desc"
    if direction not in DIRECTIONS:
        errors["dir"] = "must be asc or desc"
    cursor = None
    if params.get("cursor") and "sort" not in errors and "dir" not in errors:
        try:
            cursor = Cursor.decode(params["cursor"], sort=sort, direction=direction)
        except QueryError as exc:
            errors[exc.field] = exc.message
    if errors:
        return None, errors
    try:
        query = ExplorerQuery(
            start_ns=bar.start_ns, end_ns=bar.end_ns, service=bar.service, model=bar.model, status=status,
            phase=phase, min_duration_ns=min_ns, max_duration_ns=max_ns, min_ttft_ns=ttft_ns, attribute=attribute,
            trace_id=trace_id, sort=sort, direction=direction, cursor=cursor, limit=PAGE_SIZE,
        )
    except QueryError as exc:
        return None, {exc.field: exc.message}
    return query, {}


def _sort_headers(bar: FilterBar, query: ExplorerQuery | None) -> dict[str, dict]:
    """Per sortable column: its link (toggling the direction when it is the current sort) and an arrow."""
    sort = query.sort if query else "start"
    direction = query.direction if query else "desc"
    headers = {}
    for key in SORTS:
        active = key == sort
        next_dir = ("asc" if direction == "desc" else "desc") if active else "desc"
        headers[key] = {"label": SORT_LABELS[key], "url": bar.url(sort=key, dir=next_dir, cursor=None),
                        "active": active, "arrow": ("▼" if direction == "desc" else "▲") if active else "",
                        "aria": ("descending" if direction == "desc" else "ascending") if active else "none"}
    return headers


@login_required
def traces_explorer(request):
    project = current_project(request)
    bar = filter_bar_from_query(request.GET, default_range=DEFAULT_RANGE)
    query, errors = explorer_query_parse(request.GET, bar=bar)
    context = {
        "filters": bar, "filter_choices": {"services": [], "models": []}, "errors": errors, "query": query,
        "rows": [], "next_url": "", "prev_url": "", "total": None, "store_error": None, "phase_colors": PHASE_COLORS, "phases": PHASES,
        # The filter bar lists its own errors (range, from/to, service, model): the page's box
        # only points at them, so no message is shown twice.
        "bar_fields": [name for name, _ in bar.field_errors if name in errors],
        "statuses": STATUSES, "sort_headers": _sort_headers(bar, query), "params": request.GET,
        "first_page_url": bar.url(cursor=None), "is_paged": bool(query and query.cursor),
        "live_inserts": bool(query and query.sort == "start" and query.direction == "desc" and not query.cursor),
    }
    status = 400 if errors else 200
    if project is not None:
        try:
            context["filter_choices"] = explorer_facets(project_id=project.pk, start_ns=bar.start_ns, end_ns=bar.end_ns)
            if query is not None:
                page = explorer_page(project_id=project.pk, query=query)
                context["rows"] = page.rows
                total = explorer_count(project_id=project.pk, query=query)
                context["total"] = total.traces
                context["total_more"] = total.more
                context["total_text"] = str(total)
                if page.next_cursor is not None:
                    context["next_url"] = bar.url(cursor=page.next_cursor.encode())
                if page.prev_cursor is not None:
                    context["prev_url"] = bar.url(cursor=page.prev_cursor.encode())
                elif query.cursor is not None and not query.cursor.before:  # past the end: back to the start
                    context["prev_url"] = context["first_page_url"]
        except StoreError as exc:
            log.error("trace explorer failed: %s", exc)
            context["store_error"] = STORE_DOWN
            status = 503
    return render(request, "dashboard/traces.html", context, status=status)


def _json_error(status: int, code: str, message: str, details: list | None = None) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "details": details or []}}, status=status)


@json_login_required
def traces_explorer_json(request):
    """GET /traces/rows.json?<the explorer's query>[&ids=<trace id>,…] — a page of rows (with
    ``next_cursor``), or with ``ids`` the rows among those traces that match the query (what the
    page inserts live). Session-authenticated, scoped to the current project."""
    project = current_project(request)
    if project is None:
        return _json_error(404, "no_project", "you are not a member of any project")
    bar = filter_bar_from_query(request.GET, default_range=DEFAULT_RANGE)
    query, errors = explorer_query_parse(request.GET, bar=bar)
    if errors:
        return _json_error(400, "invalid_query", "; ".join(f"{k}: {v}" for k, v in errors.items()),
                           [{"field": k, "message": v} for k, v in errors.items()])
    ids_text = request.GET.get("ids")
    try:
        if ids_text is not None:
            ids = [t for t in ids_text.split(",") if t]
            bad = [t for t in ids if not re.fullmatch(r"[0-9a-f]{32}", t)]
            if bad or len(ids) > LIVE_IDS_MAX:
                return _json_error(400, "invalid_query", f"ids must be at most {LIVE_IDS_MAX} trace ids of 32 lowercase hex characters",
                                   [{"field": "ids", "message": f"not a trace id: {t[:40]}"} for t in bad[:5]])
            rows = explorer_rows_for_ids(project_id=project.pk, query=query, trace_ids=ids)
            return JsonResponse({"project_id": project.pk, "rows": [r.as_json() for r in rows]})
        page = explorer_page(project_id=project.pk, query=query)
    except StoreError as exc:
        log.error("trace explorer JSON failed: %s", exc)
        return _json_error(503, "store_unavailable", STORE_DOWN)
    return JsonResponse({
        "project_id": project.pk, "rows": [r.as_json() for r in page.rows],
        "next_cursor": page.next_cursor.encode() if page.next_cursor else None,
        "prev_cursor": page.prev_cursor.encode() if page.prev_cursor else None,
    })
