"""The trace page (``/traces/<id>/``), its JSON (``GET /api/v1/traces/<id>``) and the comparison
page (``/traces/compare/``). Thin: they find the project, call ``trace_detail`` and render."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from charts import PHASE_COLORS
from config.fast_path import key_read_fast_path
from ingest.auth import authenticate_request
from ingest.http import ApiError
from projects.scope import current_project
from projects.selectors import project_for_user, projects_for_user
from store import StoreError

from analytics.scores import trace_scores

from . import trace_detail
from .score_views import score_rows
from .views import STORE_DOWN

log = logging.getLogger("tracedash.dashboard")
MS = 1_000_000


def _candidate_projects(request):
    """The projects a session user may read a trace from: ``?project=`` alone if given (member
    only: 404 otherwise), else the current project first, then the user's others, so a shared
    link to a trace opens whichever of the user's projects holds it."""
    requested = request.GET.get("project")
    if requested is not None:
        project = project_for_user(user=request.user, project_id=requested)
        if project is None:
            raise Http404("No such project")
        return [project]
    current = current_project(request)
    others = [p for p in projects_for_user(user=request.user) if current is None or p.pk != current.pk]
    return ([current] if current is not None else []) + others


def _find_trace(projects, trace_id: str, *, with_genai_events: bool = False):
    for project in projects:
        detail = trace_detail.trace_get(project_id=project.pk, trace_id=trace_id, with_genai_events=with_genai_events)
        if detail is not None:
            return project, detail
    return None, None


def _ms(ns) -> float | None:
    return None if ns is None else ns / MS


def _header(detail: trace_detail.TraceDetail) -> dict:
    s = detail.summary
    phases = [{**p, "ms": p["ns"] / MS, "percent": None if p["share"] is None else 100 * p["share"],
               "color": PHASE_COLORS[p["phase"]]} for p in detail.phases()]
    return {"e2e_ms": _ms(s.e2e_ns), "ttft_ms": _ms(s.ttft_ns), "tpot_ms": _ms(s.tpot_ns), "summary": s,
            "phases": phases, "flags": detail.flags}


def genai_event_rows(events: list[dict], *, start_ns: int) -> list[dict]:
    """GenAI events as the page lists them: offset from ``start_ns`` in ms and the body as text (a
    string as sent, any other value as indented JSON). The template escapes all of it."""
    return [{"offset_ms": (e["time_ns"] - start_ns) / MS, "name": e["name"] or "(no event name)",
             "severity": e["severity"], "body": _body_text(e["body"]), "attributes": sorted(e["attributes"].items())}
            for e in events]


def _body_text(body) -> str:
    if body is None:
        return ""
    return body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, indent=2)


MAX_SHOWN_ID = 200  # a malformed id is echoed (escaped) up to this many characters


def _trace_not_found(request, trace_id: str, *, malformed: bool = False, other_project: bool = False):
    """The in-app 404 of the trace page: what was asked for (escaped), why it may be missing, a
    search box for another id and the way back to the explorer."""
    shown = trace_id[:MAX_SHOWN_ID]
    if other_project:
        # The layout shows the current project; ?project= names one that is not the user's, which
        # the project scope refuses: the page falls back to the user's own.
        request.GET = request.GET.copy()
        request.GET.pop("project", None)
    return render(request, "dashboard/trace_not_found.html", {
        "trace_id": shown, "truncated": len(trace_id) > MAX_SHOWN_ID, "malformed": malformed,
        "other_project": other_project,
    }, status=404)


@login_required
@require_GET
def trace_page(request, trace_id: str):
    trace_id = trace_id.lower()
    if not trace_detail.trace_id_valid(trace_id):
        return _trace_not_found(request, trace_id, malformed=True)
    try:
        projects = _candidate_projects(request)
    except Http404:  # ?project= names a project the user is not a member of
        return _trace_not_found(request, trace_id, other_project=True)
    try:
        project, detail = _find_trace(projects, trace_id, with_genai_events=True)
    except StoreError as exc:
        log.error("trace page failed: %s", exc)
        return render(request, "dashboard/trace.html", {"store_error": STORE_DOWN, "trace_id": trace_id}, status=503)
    if detail is None:
        return _trace_not_found(request, trace_id)
    try:
        candidates = [{"trace_id": t.trace_id, "start": datetime.fromtimestamp(t.start_ns / 1e9, tz=timezone.utc),
                       "e2e_ms": t.e2e_ns / MS, "status": t.status}
                      for t in trace_detail.endpoint_recent_traces(
                          project_id=project.pk, trace_id=trace_id, service=detail.summary.service,
                          root_name=detail.summary.root_name)] if detail.summary.has_root else []
    except StoreError as exc:  # the page is still useful without the candidates
        log.error("trace page: recent traces of the endpoint failed: %s", exc)
        candidates = []
    try:
        scores = score_rows(trace_scores(project_id=project.pk, trace_id=trace_id))
    except StoreError as exc:  # the page is still useful without the scores
        log.error("trace page: scores failed: %s", exc)
        scores = None
    return render(request, "dashboard/trace.html", {
        "trace_scores": scores,
        "trace_id": trace_id, "trace_project": project, "header": _header(detail),
        "trace_data": trace_detail.trace_json(detail, columnar=True), "phase_colors": PHASE_COLORS,
        "compare_candidates": candidates,
        "trace_genai_events": genai_event_rows(detail.genai_events, start_ns=detail.start_ns),
    })


@key_read_fast_path
@csrf_exempt  # read-only: any other method gets a JSON 405, not the CSRF page
def trace_api(request, trace_id: str):
    """``GET /api/v1/traces/<id>``: a project key (Bearer) reads its project's traces; a logged-in
    user reads the traces of projects they are a member of."""
    try:
        if request.method not in ("GET", "HEAD"):
            raise ApiError(405, "method_not_allowed", "use GET", headers={"Allow": "GET, HEAD"})
        trace_id = trace_id.lower()
        if request.headers.get("Authorization") or not request.user.is_authenticated:
            projects = [authenticate_request(request).project]
        else:
            try:
                projects = _candidate_projects(request)
            except Http404:
                raise ApiError(404, "not_found", "no such project among yours",
                               details=[{"field": "project", "message": "not a project you are a member of"}]) from None
        if not trace_detail.trace_id_valid(trace_id):
            raise ApiError(400, "invalid_trace_id", "trace_id must be 32 lowercase hex characters",
                           details=[{"field": "trace_id", "message": "expected 32 hex characters"}])
        # A key names one project: its scores are read beside the spans (one round trip's time).
        scores = (trace_detail.read_beside(trace_scores, project_id=projects[0].pk, trace_id=trace_id)
                  if len(projects) == 1 else None)
        try:
            _, detail = _find_trace(projects, trace_id, with_genai_events=True)
        except StoreError as exc:
            log.error("trace api failed: %s", exc)
            raise ApiError(503, "store_unavailable", "the trace store is unavailable; retry later",
                           headers={"Retry-After": "5"}) from exc
        if detail is None:
            raise ApiError(404, "not_found", f"no trace {trace_id} in this project")
    except ApiError as exc:
        return exc.response()
    columnar = request.GET.get("spans") == "columns"
    body = trace_detail.trace_json(detail, columnar=columnar)
    try:
        body["scores"] = (scores.result() if scores is not None
                          else trace_scores(project_id=detail.project_id, trace_id=trace_id))
    except StoreError as exc:
        log.error("trace api: scores failed: %s", exc)
        return ApiError(503, "store_unavailable", "the trace store is unavailable; retry later",
                        headers={"Retry-After": "5"}).response()
    return JsonResponse(body)


_FIGURE_LABELS = {
    "e2e_ns": ("End-to-end", "ms"), "ttft_ns": ("TTFT", "ms"), "input_tokens": ("Input tokens", "tokens"),
    "output_tokens": ("Output tokens", "tokens"), "cost_usd": ("Cost", "USD"),
    "network_ns": ("Network", "ms"), "preprocess_ns": ("Pre-processing", "ms"),
    "inference_ns": ("Inference", "ms"), "postprocess_ns": ("Post-processing", "ms"), "other_ns": ("Other", "ms"),
}


def _compare_table(rows):
    out = []
    for row in rows:
        label, unit = _FIGURE_LABELS[row.figure]
        scale = MS if unit == "ms" else 1

        def conv(v):
            return None if v is None else v / scale

        phase = row.figure[:-3] if row.figure.endswith("_ns") and row.figure[:-3] in PHASE_COLORS else None
        out.append({"figure": row.figure, "label": label, "unit": unit, "a": conv(row.a), "b": conv(row.b),
                    "diff": conv(row.diff), "percent": row.diff_percent, "phase": phase,
                    "color": PHASE_COLORS.get(phase or "", "")})
    return out


@login_required
@require_GET
def trace_compare(request):
    """Two traces side by side (``?a=<id>&b=<id>``), or a trace and the P50 of its endpoint
    (``?a=<id>&b=p50``): per-phase differences, E2E, TTFT, tokens and cost."""
    a_id = (request.GET.get("a") or "").strip().lower()
    b_id = (request.GET.get("b") or "").strip().lower()
    context = {"a_id": a_id, "b_id": b_id, "errors": [], "rows": None}
    if not a_id:
        return render(request, "dashboard/trace_compare.html", context)
    for name, value in (("a", a_id), ("b", b_id)):
        if value and value != "p50" and not trace_detail.trace_id_valid(value):
            context["errors"].append(f"{name.upper()}: {value!r} is not a trace id (32 hex characters)")
    if a_id == "p50":
        context["errors"].append("A must be a trace; only B can be the endpoint's P50")
    if context["errors"]:
        return render(request, "dashboard/trace_compare.html", context, status=400)
    try:
        projects = _candidate_projects(request)
        project, a = _find_trace(projects, a_id)
        if a is None:
            raise Http404("No such trace in your projects")
        if not b_id or b_id == "p50":
            baseline = trace_detail.endpoint_p50(project_id=project.pk, service=a.summary.service,
                                                 root_name=a.summary.root_name)
            b_label, b_figures, b_trace = baseline.label, baseline.figures, None
            context["baseline_traces"] = baseline.traces
        else:
            _, b = _find_trace([project], b_id)
            if b is None:
                raise Http404("No trace B in the same project")
            b_label, b_figures, b_trace = f"Trace {b_id}", trace_detail.trace_figures(b.summary), b
    except StoreError as exc:
        log.error("trace compare failed: %s", exc)
        context["store_error"] = STORE_DOWN
        return render(request, "dashboard/trace_compare.html", context, status=503)
    a_figures = trace_detail.trace_figures(a.summary)
    if b_trace is None:
        # Against the endpoint's P50 the baseline comes first, so "B vs A" reads "this trace vs usual".
        rows = trace_detail.compare_rows(b_figures, a_figures)
        context.update(a=None, b=a, a_label=b_label, b_label=f"Trace {a_id}")
    else:
        rows = trace_detail.compare_rows(a_figures, b_figures)
        context.update(a=a, b=b_trace, a_label=f"Trace {a_id}", b_label=b_label)
    context.update(rows=_compare_table(rows), b_is_p50=b_trace is None, trace_project=project)
    return render(request, "dashboard/trace_compare.html", context)
