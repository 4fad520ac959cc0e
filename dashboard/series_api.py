"""JSON series endpoints over the rollups (``analytics.rollups``), for scripts and the pages:

- ``GET /api/v1/series/overview``   — KPIs of the window and the previous one, and the series
- ``GET /api/v1/series/latency``    — E2E latency histogram per time bucket (heatmap) and in total
- ``GET /api/v1/series/costs``      — cost KPIs, spend per model over time, projected monthly spend
- ``GET /api/v1/series/compare``    — two windows, two models, or two values of a span attribute

Auth: ``Authorization: Bearer <project key>`` reads the key's project; a logged-in user reads
the project of ``?project=<id>`` (one they are a member of) or their current one. Parameters:
``range`` (15m, 1h, 6h, 24h, 7d, 30d; default 24h) or ``from``/``to`` (ISO 8601, UTC without an
offset), ``service``, ``model``, ``points`` (buckets wanted, 1–1000, default 120); on overview,
latency and costs, ``group_by`` (an attribute key) and ``group_top`` (1–20, default 5) add ``grouped``: the
series split per value of the attribute (``analytics.grouping``). Bad parameters
answer 400 naming the parameter; errors are ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from django.http import Http404, JsonResponse
from django.views.decorators.http import require_GET

from analytics import grouping, rollups
from config.fast_path import key_read_fast_path
from ingest.auth import authenticate_request
from ingest.http import ApiError
from projects.scope import current_project
from store import StoreError

from .timewindow import MAX_SPAN, PRESETS

log = logging.getLogger("tracedash.dashboard.series_api")
MAX_NAME = 256
MAX_POINTS = 1000


def _bad(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid_parameter", f"{field}: {message}", details=[{"field": field, "message": message}])


def _project(request):
    if request.headers.get("Authorization") or not request.user.is_authenticated:
        return authenticate_request(request).project
    try:
        project = current_project(request)
    except Http404:
        raise ApiError(404, "not_found", "no such project among yours",
                       details=[{"field": "project", "message": "not a project you are a member of"}]) from None
    if project is None:
        raise ApiError(404, "no_project", "you are not a member of any project")
    return project


def _time(query, field: str) -> datetime:
    text = query.get(field, "").strip()
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _bad(field, "expected an ISO 8601 time such as 2026-11-30T12:00:00Z") from None
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def parse_window(query, *, prefix: str = "", now: datetime | None = None, default: str = "24h") -> tuple[datetime, datetime]:
    """[start, end) from ``{prefix}range`` or ``{prefix}from``/``{prefix}to``; ApiError 400 naming the
    parameter at fault."""
    now = now or datetime.now(timezone.utc)
    f_from, f_to, f_range = f"{prefix}from", f"{prefix}to", f"{prefix}range"
    if query.get(f_from) or query.get(f_to):
        if not query.get(f_from):
            raise _bad(f_from, f"required with {f_to}")
        start = _time(query, f_from)
        end = _time(query, f_to) if query.get(f_to) else now
        if not start < end:
            raise _bad(f_from, f"must be before {f_to}")
        if end - start > MAX_SPAN:
            raise _bad(f_from, f"the window may be at most {MAX_SPAN.days} days")
        return start, end
    preset = query.get(f_range) or default
    if preset not in PRESETS:
        raise _bad(f_range, f"must be one of {', '.join(PRESETS)}")
    return now - PRESETS[preset], now


def _name(query, field: str) -> str:
    value = (query.get(field) or "").strip()
    if len(value) > MAX_NAME:
        raise _bad(field, f"at most {MAX_NAME} characters")
    return value


def _points(query) -> int:
    raw = query.get("points") or "120"
    try:
        points = int(raw)
    except ValueError:
        raise _bad("points", f"expected a whole number, got {raw[:40]!r}") from None
    if not 1 <= points <= MAX_POINTS:
        raise _bad("points", f"must be from 1 to {MAX_POINTS}")
    return points


def group_params(query) -> tuple[str, int] | None:
    """(attribute key, top N) of ``group_by``/``group_top``, None without ``group_by``; ApiError 400
    naming the parameter at fault."""
    key = (query.get("group_by") or "").strip()
    if len(key) > grouping.MAX_KEY:
        raise _bad("group_by", f"at most {grouping.MAX_KEY} characters")
    raw = (query.get("group_top") or str(grouping.DEFAULT_TOP)).strip()
    try:
        top = int(raw)
    except ValueError:
        raise _bad("group_top", f"expected a whole number, got {raw[:40]!r}") from None
    if not 1 <= top <= grouping.MAX_TOP:
        raise _bad("group_top", f"must be from 1 to {grouping.MAX_TOP}")
    return (key, top) if key else None


def _grouped(request, args, points: int) -> dict:
    """``{"grouped": …}`` when the request has ``group_by``, else ``{}``."""
    group = group_params(request.GET)
    if group is None:
        return {}
    return {"grouped": grouping.grouped_json(grouping.grouped_series(**args, key=group[0], top=group[1], points=points))}


def _q(values: dict) -> dict:
    return {f"p{int(q * 100)}": v for q, v in values.items()}


def stats_json(stats: rollups.WindowStats) -> dict:
    return {
        "seconds": stats.seconds, "requests": stats.requests, "errors": stats.errors, "recovered": stats.recovered,
        "error_spans": stats.error_spans, "rps": stats.rps,
        "output_tokens_per_second": stats.output_tps, "concurrency": stats.concurrency,
        "error_rate": stats.error_rate, "availability": stats.availability,
        "input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens, "cost_usd": stats.cost_usd,
        "cost_estimated_requests": stats.cost_estimated, "cost_per_request": stats.cost_per_request,
        "cost_per_1k_tokens": stats.cost_per_1k_tokens, "inference_share": stats.inference_share,
        "e2e_mean_ms": stats.e2e_mean_ms, "e2e_ms": _q(stats.e2e_ms), "ttft_ms": _q(stats.ttft_ms),
        "tpot_ms": _q(stats.tpot_ms), "phase_ms": {p: _q(v) for p, v in stats.phase_ms.items()},
        "phase_mean_ms": stats.phase_mean_ms,
    }


def _series_json(series: rollups.WindowSeries) -> dict:
    return {"step_seconds": series.step_seconds, "times": [t.isoformat() for t in series.times],
            "buckets": [None if b is None else stats_json(b) for b in series.buckets]}


def _endpoint(build):
    """A GET endpoint: auth, common parameters, the store-down answer, JSON errors."""
    @key_read_fast_path
    @require_GET
    def view(request):
        try:
            project = _project(request)
            start, end = parse_window(request.GET)
            args = {"project_id": project.pk, "start": start, "end": end,
                    "service": _name(request.GET, "service"), "model": _name(request.GET, "model")}
            try:
                body = build(request, args)
            except StoreError as exc:
                log.error("series endpoint failed: %s", exc)
                raise ApiError(503, "store_unavailable", "the trace store is unavailable; retry later",
                               headers={"Retry-After": "5"}) from exc
        except ApiError as exc:
            return exc.response()
        return JsonResponse({"project_id": project.pk, "start": start.isoformat(), "end": end.isoformat(),
                             "service": args["service"], "model": args["model"], **body})
    view.__doc__ = build.__doc__
    return view


def _overview(request, args) -> dict:
    """KPIs of the window and of the window just before it, and the series."""
    points = _points(request.GET)
    grouped = _grouped(request, args, points)
    previous = {**args, "start": args["start"] - (args["end"] - args["start"]), "end": args["start"]}
    return {"stats": stats_json(rollups.window_stats(**args)), "previous": stats_json(rollups.window_stats(**previous)),
            "series": _series_json(rollups.window_series(**args, points=points, histograms=rollups.HISTOGRAMS)),
            **grouped}


def _latency(request, args) -> dict:
    """E2E latency histogram: requests per latency bucket per time bucket, and in total."""
    points = _points(request.GET)
    grouped = _grouped(request, args, points)
    heatmap = rollups.latency_heatmap(**args, points=points)
    return {"step_seconds": heatmap.step_seconds, "times": [t.isoformat() for t in heatmap.times],
            "edges_ms": list(heatmap.edges_ms), "labels": heatmap.labels, "counts": heatmap.counts,
            "totals": heatmap.totals, **grouped}


def _costs(request, args) -> dict:
    """Cost KPIs (and the previous window's), spend per model over time, projected monthly spend."""
    points = _points(request.GET)
    grouped = _grouped(request, args, points)
    previous = {**args, "start": args["start"] - (args["end"] - args["start"]), "end": args["start"]}
    spend = rollups.spend_by_model(**args, points=points)
    totals = rollups.model_totals(**args)
    projection = rollups.spend_projection(project_id=args["project_id"], now=args["end"], service=args["service"],
                                          model=args["model"])
    return {"stats": stats_json(rollups.window_stats(**args)), "previous": stats_json(rollups.window_stats(**previous)),
            "spend_by_model": {"step_seconds": spend.step_seconds, "times": [t.isoformat() for t in spend.times],
                               "cost_usd": spend.cost_by_model},
            "by_model": [{"model": t.model, "input_tokens": t.input_tokens, "output_tokens": t.output_tokens,
                          "cost_usd": t.cost_usd} for t in totals],
            "projection": {"label": projection_label(projection),
                           "from": projection.start.isoformat(), "to": projection.end.isoformat(),
                           "covered_seconds": projection.covered_seconds,
                           "cost_last_7_days": projection.cost_covered, "cost_covered": projection.cost_covered,
                           "projected_monthly_usd": projection.projected_monthly, "by_model": projection.by_model},
            **grouped}


def projection_label(projection: rollups.SpendProjection) -> str:
    if not projection.covered_seconds:
        return f"projection: no requests in the last {rollups.PROJECTION_DAYS} days"
    return (f"projection: cost over the last {projection.basis} × 30 days / {projection.basis}"
            f" (based on {projection.basis} of data)")


def _compare(request, args) -> dict:
    """``mode=windows`` (a_range|a_from/a_to against b_range|b_from/b_to), ``mode=models``
    (model_a, model_b over the window) or ``mode=attribute`` (key, value_a, value_b)."""
    query = request.GET
    mode = query.get("mode", "windows")
    common = {"project_id": args["project_id"], "service": args["service"]}
    if mode == "windows":
        a, b = parse_window(query, prefix="a_"), parse_window(query, prefix="b_")
        result = rollups.compare_windows(**common, model=args["model"], a=a, b=b)
        sides = {"a": {"from": a[0].isoformat(), "to": a[1].isoformat()}, "b": {"from": b[0].isoformat(), "to": b[1].isoformat()}}
    elif mode == "models":
        model_a, model_b = _name(query, "model_a"), _name(query, "model_b")
        for field, value in (("model_a", model_a), ("model_b", model_b)):
            if not value:
                raise _bad(field, "required with mode=models")
        result = rollups.compare_models(**common, start=args["start"], end=args["end"], model_a=model_a, model_b=model_b)
        sides = {"a": {"model": model_a}, "b": {"model": model_b}}
    elif mode == "attribute":
        key, value_a, value_b = _name(query, "key"), _name(query, "value_a"), _name(query, "value_b")
        for field, value in (("key", key), ("value_a", value_a), ("value_b", value_b)):
            if not value:
                raise _bad(field, "required with mode=attribute")
        result = rollups.compare_attribute(**common, model=args["model"], start=args["start"], end=args["end"],
                                           key=key, value_a=value_a, value_b=value_b)
        sides = {"a": {key: value_a}, "b": {key: value_b}}
    else:
        raise _bad("mode", "must be windows, models or attribute")
    return {"mode": mode, "sides": sides, "a": stats_json(result.a), "b": stats_json(result.b),
            "rows": [{"name": r.name, "unit": r.unit, "a": r.a, "b": r.b, "change_percent": r.change_percent,
                      "better": r.better} for r in result.rows]}


overview = _endpoint(_overview)
latency = _endpoint(_latency)
costs = _endpoint(_costs)
compare = _endpoint(_compare)
