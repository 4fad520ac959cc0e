from __future__ import annotations

import dataclasses
import logging
import re
from datetime import datetime, timedelta, timezone
from functools import wraps

from django.apps import apps
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import redirect, render

from analytics import cache_selectors, engines, grouping, panel_selectors, rollups, selectors
from analytics.group_targets import group_target_delete, group_target_set, group_targets_list
from analytics.rollups import PROJECTION_DAYS
from config import memory as config_memory
from projects.scope import current_project
from store import StoreError, get_store

from . import panels
from .compare import MODES as COMPARE_MODES
from .compare import compare_query_from, compare_rows
from .compare import side_stats as compare_side_stats
from .filters import FilterBar, filter_bar_from_query
from .panels import CPU_THRESHOLD, GPU_MEMORY_THRESHOLD, KV_CACHE_THRESHOLD
from ingest.http import ApiError

from .series_api import group_params, projection_label
from .templatetags.explorer_tags import kpi_traces_link
from .timewindow import PRESETS, TimeWindow, window_from_query

log = logging.getLogger("tracedash.dashboard")


STORE_DOWN = "The trace store is unavailable right now; this page will work again when it returns."


def json_login_required(view):
    """A JSON endpoint answers 401 with a JSON error when nobody is logged in (a script is not
    redirected to the login page)."""
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return _json_error(401, "not_authenticated", "log in first (these endpoints use the browser session)")
        return view(request, *args, **kwargs)

    return wrapper


def _json_error(status: int, code: str, message: str, details: list | None = None) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "details": details or []}}, status=status)


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


def _firing_alerts(project_id: int) -> list[dict]:
    """Firing alerts to mark on the charts (empty when the alerts app is not installed)."""
    if not apps.is_installed("alerts"):
        return []
    from alerts.selectors import alerts_firing_payload

    return alerts_firing_payload(project_id=project_id)


def _load_series(project_id: int, window: TimeWindow) -> selectors.LoadSeries:
    """Request rate and P95 E2E from the rollups, in the resource charts' buckets (the same point
    budget gives the same step)."""
    series = rollups.window_series(project_id=project_id, start=window.start, end=window.end,
                                   points=selectors.RESOURCE_POINTS)
    return selectors.LoadSeries(times=series.times, step_seconds=series.step_seconds,
                                rps=[0.0 if b is None else b.rps for b in series.buckets],
                                p95_e2e_ms=series.values(lambda b: b.e2e_ms[0.95]))


def _resources_panel(project_id: int, window: TimeWindow, host: str, *, latest: bool = False) -> dict:
    reads = {
        "series": lambda: selectors.resources_series(project_id=project_id, start=window.start, end=window.end,
                                                     host=host),
        "load": lambda: _load_series(project_id, window),
    }
    if latest:
        reads["latest"] = lambda: selectors.resources_latest(project_id=project_id)
        reads["hosts"] = lambda: selectors.resources_hosts(project_id=project_id, start=window.start, end=window.end)
    r = panel_selectors.reads_concurrently(**reads)
    return {**r, "figures": panels.resources_figures(r["series"], r["load"], alerts=_firing_alerts(project_id))}


def _fit_to(request, first_since):
    """``fit`` of a page's window: when the current project's data starts, by ``first_since``
    (``first_sample_since``, ``first_request_since``…; None: keep the default)."""
    def fit(since):
        project = current_project(request)
        if project is None:
            return None
        try:
            return first_since(project_id=project.pk, since=since)
        except StoreError:
            return None  # the page itself reports the store being down
    return fit


def _fit_to_samples(request):
    """The resources window starts with the project's resource samples."""
    return _fit_to(request, selectors.first_sample_since)


@login_required
def resources_latest(request):
    """Latest host and GPU figures, and each of them over time beside request rate and P95."""
    window = window_from_query(request.GET, fit=_fit_to_samples(request))
    host = request.GET.get("host", "")[:256]

    def select(project_id):
        return _resources_panel(project_id, window, host, latest=True)

    return _project_page(request, "dashboard/resources.html", "panel", select, window=window, host=host,
                         presets=PRESETS, gpu_memory_threshold=GPU_MEMORY_THRESHOLD, cpu_threshold=CPU_THRESHOLD)


def _utc_text(value) -> str:
    """A time as the pages write it: UTC wall clock, "2026-01-01 12:00:00" (a naive time is UTC)."""
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@json_login_required
def resources_series_json(request):
    """GET /resources/series.json?range=…|from=…&to=…&host=… — the series behind /resources/ (and the
    figures the page draws from them), for the page's live refresh and for scripts."""
    project = current_project(request)
    if project is None:
        return _json_error(404, "no_project", "you are not a member of any project")
    window = window_from_query(request.GET, fit=_fit_to_samples(request))
    if window.error:
        return _json_error(400, "invalid_window", window.error)
    try:
        panel = _resources_panel(project.pk, window, request.GET.get("host", "")[:256], latest=True)
    except StoreError as exc:
        log.error("resources series failed: %s", exc)
        return _json_error(503, "store_unavailable", STORE_DOWN)
    series, load = panel["series"], panel["load"]
    devices = [{"host": d.host, "gpu_index": d.gpu_index, "gpu_name": d.gpu_name, "values": d.values}
               for d in series.hosts + series.gpus]
    return JsonResponse({
        "project_id": project.pk, "start": window.start.isoformat(), "end": window.end.isoformat(),
        "step_seconds": series.step_seconds, "times": [t.isoformat() for t in series.times],
        "devices": devices,
        "processes": [{"host": p.host, "gpu_index": p.gpu_index, "pid": p.pid, "name": p.name,
                       "gpu_memory_bytes": p.memory_bytes} for p in series.processes],
        "load": {"rps": load.rps, "p95_e2e_ms": load.p95_e2e_ms},
        "figures": panel["figures"],
        # The page's latest-figures table, redrawn with the charts (everything on a live page updates together).
        "has_gpu": bool(series.gpus),
        "latest": [{**dataclasses.asdict(r), "last_seen": _utc_text(r.last_seen)} for r in panel["latest"]],
    })


# --- engines -------------------------------------------------------------------------------------
def _fit_to_engine_samples(request):
    """The engines window starts with the project's engine samples."""
    return _fit_to(request, engines.first_sample_since)


def _engine_filter(request) -> str:
    return request.GET.get("engine", "")[:64].strip().lower()


def _engines_panel(project_id: int, window: TimeWindow, engine: str) -> dict:
    """The engine series, and the app-side latency from the traces in the same buckets (the same
    point budget gives the same step): every trace, and each served model's own where the traces
    name it."""
    points = selectors.RESOURCE_POINTS
    step = selectors.bucket_seconds(start=window.start, end=window.end, points=points)
    now = datetime.now(timezone.utc)
    r = panel_selectors.reads_concurrently(
        newest=lambda: engines.latest_sample_time(project_id=project_id),
        series=lambda: engines.engine_series(project_id=project_id, start=window.start, end=window.end,
                                             engine=engine, step_seconds=step),
        engines=lambda: engines.engine_names(project_id=project_id, start=window.start, end=window.end),
        latest=lambda: engines.instances_latest(project_id=project_id, end=now, engine=engine),
        all_traces=lambda: rollups.window_series(project_id=project_id, start=window.start, end=window.end,
                                                 points=points))
    series = r["series"]
    app = {"": r["all_traces"]}
    if series.instances:
        app.update(engines.app_side_series(project_id=project_id, start=window.start, end=window.end,
                                           models=[i.instance.model for i in series.instances], points=points))
    return {"newest": r["newest"], "series": series, "engines": r["engines"], "latest": r["latest"], "app": app,
            "figures": panels.engines_figures(series, app, alerts=_firing_alerts(project_id)) if series.instances else {}}


@login_required
def engines_page(request):
    """Inference engines (vLLM, TGI, SGLang, TensorRT-LLM) of the project over time: queue, KV cache, preemptions,
    engine-side latency beside the app-side latency of the traces, throughput."""
    window = window_from_query(request.GET, fit=_fit_to_engine_samples(request))
    engine = _engine_filter(request)
    return _project_page(request, "dashboard/engines.html", "panel",
                         lambda project_id: _engines_panel(project_id, window, engine), window=window, engine=engine,
                         presets=PRESETS, kv_threshold=KV_CACHE_THRESHOLD,
                         ttft_caption=panels.GAP_CAPTIONS["fig-engine-ttft"], e2e_caption=panels.GAP_CAPTIONS["fig-engine-e2e"])


def _latest_json(row: engines.InstanceLatest) -> dict:
    i = row.instance
    return {"engine": i.engine, "target": i.target, "model": i.model, "label": i.label, "host": row.host,
            "last_seen": None if row.last_seen is None else _utc_text(row.last_seen),
            "requests_running": row.running, "requests_waiting": row.waiting, "kv_cache_usage": row.kv_cache_usage}


@json_login_required
def engines_series_json(request):
    """GET /engines/series.json?range=…|from=…&to=…&engine=… — the series behind /engines/ (and the
    figures the page draws from them), for the page's live refresh and for scripts."""
    project = current_project(request)
    if project is None:
        return _json_error(404, "no_project", "you are not a member of any project")
    window = window_from_query(request.GET, fit=_fit_to_engine_samples(request))
    if window.error:
        return _json_error(400, "invalid_window", window.error)
    engine = _engine_filter(request)
    try:
        panel = _engines_panel(project.pk, window, engine)
    except StoreError as exc:
        log.error("engines series failed: %s", exc)
        return _json_error(503, "store_unavailable", STORE_DOWN)
    series = panel["series"]
    return JsonResponse({
        "project_id": project.pk, "start": window.start.isoformat(), "end": window.end.isoformat(),
        "engine": engine, "engines": panel["engines"],
        "newest_sample": None if panel["newest"] is None else _utc_text(panel["newest"]),
        "step_seconds": series.step_seconds, "times": [t.isoformat() for t in series.times],
        "instances": panels.engine_instance_values(series, panel["app"]),
        "figures": panel["figures"],
        "latest": [_latest_json(r) for r in panel["latest"]],
    })


def _redis_health() -> dict | None:
    """Production mode: the Redis behind the channel layer and the Celery broker answers a PING.
    ``None`` when neither is on Redis (embedded mode). Live events are best-effort and ingestion
    does not need Redis, but periodic tasks (rollups, alerts) stop without the broker."""
    from django.conf import settings

    urls = {"channel_layer": settings.ENV.channel_layer_url, "broker": settings.ENV.broker_url}
    urls = {name: url for name, url in urls.items() if url and url.startswith(("redis://", "rediss://"))}
    if not urls:
        return None
    import redis as redis_client

    check: dict = {"ok": True}
    for name, url in urls.items():
        client = redis_client.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported in the body
            check["ok"] = False
            check.setdefault("error", f"{name}: {exc}"[:500])
        finally:
            client.close()
    return check


# ClickHouse's own accounting (system.metrics): what its allocations hold now, and its caches. On
# the embedded store these live in the web process's RSS; on a server, in the server's.
_CLICKHOUSE_MEMORY = {"MemoryTracking": "tracked_bytes", "MarkCacheBytes": "mark_cache_bytes",
                      "UncompressedCacheBytes": "uncompressed_cache_bytes",
                      "PrimaryIndexCacheBytes": "primary_index_cache_bytes", "QueryCacheBytes": "query_cache_bytes"}


def _clickhouse_memory(store) -> dict:
    names = ", ".join(f"'{name}'" for name in _CLICKHOUSE_MEMORY)
    values = dict(store.query(f"SELECT metric, value FROM system.metrics WHERE metric IN ({names})",
                              tag="healthz.memory").rows)
    return {key: int(values.get(metric, 0)) for metric, key in _CLICKHOUSE_MEMORY.items()}


def _process_memory() -> dict:
    """This process's resident memory (Linux /proc; absent elsewhere) and what Python's small-object
    allocator holds (``sys.getallocatedblocks``: a count that keeps climbing under steady load is
    Python objects kept, not memory the allocators keep cached)."""
    import resource
    import sys

    memory = {"python_allocated_blocks": sys.getallocatedblocks(),
              "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        with open("/proc/self/status") as status:
            text = status.read()
    except OSError:
        text = ""
    for key, field in (("rss_bytes", "VmRSS"), ("rss_anon_bytes", "RssAnon")):
        found = re.search(rf"{field}:\s+(\d+) kB", text)
        if found:
            memory[key] = int(found.group(1)) * 1024
    memory.update(config_memory.heap() or {})
    if "pyarrow" in sys.modules:  # Arrow's own allocator (the embedded inserts' and summaries' columns)
        memory["arrow_allocated_bytes"] = sys.modules["pyarrow"].total_allocated_bytes()
    return memory


def healthz(request):
    """Readiness of the web process, ClickHouse, the metadata database (and Redis when configured)."""
    checks = {"web": {"ok": True}}
    store = get_store()
    try:
        store.ping()
        checks["clickhouse"] = {"ok": True, "backend": store.kind}
        # How many parts the spans table holds: a number that keeps climbing means merges lag
        # behind inserts (bench/soak.py prints it every minute).
        checks["clickhouse"]["active_parts"] = int(store.query(
            "SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = 'spans' AND active",
            tag="healthz.parts").scalar() or 0)
        checks["clickhouse"]["memory"] = _clickhouse_memory(store)
    except StoreError as exc:
        checks["clickhouse"] = {"ok": False, "backend": store.kind, "error": str(exc)[:500]}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks["database"] = {"ok": True, "vendor": connection.vendor}
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready", reported in the body
        checks["database"] = {"ok": False, "vendor": connection.vendor, "error": str(exc)[:500]}
    redis = _redis_health()
    if redis is not None:
        checks["redis"] = redis
    from ingest.writer import get_writer

    checks["web"]["memory"] = _process_memory()
    writer = get_writer().health()
    # Spooled data is safe, but a full spool (or a full disk under it) means ingestion answers 503.
    writer["ok"] = writer["spool_bytes"] < writer["spool_limit_bytes"] and not writer["spool_disk_full"]
    checks["ingest"] = writer
    ok = all(check["ok"] for check in checks.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)


# --- overview, costs, compare -------------------------------------------------------------------
def _fit_to_requests(request):
    """The filter bar's window starts with the project's requests."""
    return _fit_to(request, panel_selectors.first_request_since)


def _panel_filters(request) -> tuple[FilterBar, dict[str, str]]:
    """The shared filter bar (range, service, model) of the request, and its service/model filters.
    Without a range in the URL the range is the smallest preset covering the project's data."""
    bar = filter_bar_from_query(request.GET, default_range="24h", fit=_fit_to_requests(request))
    return bar, {"service": bar.service, "model": bar.model}


CURRENT_RATE = timedelta(minutes=5)  # the "current" RPS: the window's last 5 minutes


def _current_windows(window: TimeWindow) -> tuple[TimeWindow, TimeWindow]:
    """The window's last 5 minutes (all of it when shorter) and the same span just before them."""
    current = TimeWindow(start=max(window.start, window.end - CURRENT_RATE), end=window.end, preset="")
    return current, current.previous()


def _cache_reads(project_id: int, window: TimeWindow, filters: dict[str, str]) -> dict:
    """The cache figures of the window (with their series) and of the previous one, as reads for
    ``reads_concurrently``. The model filter does not apply (a hit calls no model: see
    analytics.cache_selectors)."""
    previous = window.previous()
    return {
        "cache": lambda: cache_selectors.cache_savings(project_id=project_id, start=window.start, end=window.end,
                                                       service=filters["service"]),
        "cache_before": lambda: cache_selectors.cache_savings(project_id=project_id, start=previous.start,
                                                              end=previous.end, service=filters["service"],
                                                              series=False),
    }


def _cache_panel(r: dict, filters: dict[str, str], kpis, figures) -> dict:
    """What the page's cache section shows: the figures, tiles and charts (none when no request of
    the window consulted a cache: the page says so in one line)."""
    now = r["cache"]
    return {"savings": now, "previous": r["cache_before"], "kpis": kpis(now, r["cache_before"]),
            "figures": figures(now, filters=filters) if now.totals.consulted else {},
            "model_ignored": bool(filters.get("model"))}


def _group_reads(group, project_id: int, window: TimeWindow, filters: dict[str, str], *, suggest: bool) -> dict:
    """The reads of a grouped page (``group``: (attribute key, top N) or None): its series and, for
    the HTML page (``suggest``), the attribute keys the filter bar suggests."""
    reads = {}
    if suggest:
        reads["group_keys"] = lambda: grouping.attribute_keys(project_id=project_id, start=window.start, end=window.end)
    if group is not None:
        reads["grouped"] = lambda: grouping.grouped_series(project_id=project_id, start=window.start, end=window.end,
                                                           key=group[0], top=group[1], **filters)
    return reads


def _group_panel(r: dict, group, project_id: int, window: TimeWindow, *, cost: bool = False) -> dict:
    """What a grouped page shows: the series, its figures, the value targets and the key suggestions."""
    out = {"group": group, "group_keys": r.get("group_keys", []), "grouped": None, "group_figures": {}, "group_targets": []}
    if group is None:
        return out
    targets = group_targets_list(project_id=project_id, attribute_key=group[0])
    by_value = {t.value: t.target for t in targets if t.metric == "e2e_p95_ms"}
    grouped = r["grouped"]
    out.update(grouped=grouped, group_targets=targets, group_target_ms=by_value,
               group_figures=panels.grouped_figures(grouped, start=window.start, end=window.end, targets=by_value,
                                                    cost=cost))
    return out


def _overview(project_id: int, window: TimeWindow, filters: dict[str, str], group=None, *, suggest: bool = False) -> dict:
    args = {"project_id": project_id, "start": window.start, "end": window.end, **filters}
    previous = window.previous()
    current, current_before = _current_windows(window)
    r = panel_selectors.reads_concurrently(
        **_cache_reads(project_id, window, filters),
        now=lambda: rollups.window_stats(**args),
        before=lambda: rollups.window_stats(**{**args, "start": previous.start, "end": previous.end}),
        rates=lambda: rollups.request_rates(project_id=project_id, spans=[(current.start, current.end),
                                                                          (current_before.start, current_before.end)],
                                            **filters),
        series=lambda: rollups.window_series(**args),
        heatmap=lambda: rollups.latency_heatmap(**args),
        facets=lambda: panel_selectors.panel_facets(project_id=project_id, start=window.start, end=window.end),
        **_group_reads(group, project_id, window, filters, suggest=suggest))
    current_rate, before_rate = r["rates"]
    return {"stats": r["now"], "previous": r["before"], "series": r["series"], "current": current_rate,
            "kpis": panels.overview_kpis(r["now"], r["before"], current_rate, before_rate),
            "figures": panels.overview_figures(r["series"], r["heatmap"], filters=filters), "facets": r["facets"],
            "cache": _cache_panel(r, filters, panels.cache_overview_kpis, panels.cache_overview_figures),
            **_group_panel(r, group, project_id, window)}


def _page_group(request) -> tuple[tuple[str, int] | None, str]:
    """A page's (group, error message): a bad ``group_by``/``group_top`` is said on the page and
    the page shows ungrouped."""
    try:
        return group_params(request.GET), ""
    except ApiError as exc:
        return None, exc.message


def _target_post(request, project) -> tuple[dict, dict[str, list[str]]]:
    """The group-target form of a grouped page (POST, member of the project, CSRF-checked by the
    middleware): set or delete; (the form's values, errors by field)."""
    form = {k: request.POST.get(k, "") for k in ("attribute_key", "value", "target")}
    if request.POST.get("action") == "target_delete":
        group_target_delete(project_id=project.pk, attribute_key=form["attribute_key"], value=form["value"])
        return form, {}
    try:
        group_target_set(project_id=project.pk, **form)
    except ValidationError as exc:
        return form, exc.message_dict
    return form, {}


@login_required
def overview(request):
    """KPIs against the previous period, traffic, latency, the phase breakdown and the latency
    distribution of the chosen window, service and model; with ``group_by``, the series per value
    of an attribute, and the form setting each value's P95 target."""
    bar, filters = _panel_filters(request)
    group, group_error = _page_group(request)
    project = current_project(request)
    target_form, target_errors = {"attribute_key": group[0] if group else "", "value": "", "target": ""}, {}
    if request.method == "POST":
        if project is None:
            return redirect(request.get_full_path())
        target_form, target_errors = _target_post(request, project)
        if not target_errors:
            return redirect(f"{request.path}?{request.GET.urlencode()}#group-targets")
        key = target_form["attribute_key"].strip()
        if group is None and key and len(key) <= grouping.MAX_KEY:  # show the form (and its errors) under its key
            group = (key, grouping.DEFAULT_TOP)
    response = _project_page(request, "dashboard/overview.html", "panel",
                             lambda project_id: _overview(project_id, bar.window, filters, group, suggest=True), filters=bar,
                             group_error=group_error, target_form=target_form, target_errors=target_errors,
                             group_extra_fields="dashboard/_group_fields.html")
    if target_errors and response.status_code == 200:
        response.status_code = 400
    return response


def _panel_json(request, build):
    project = current_project(request)
    if project is None:
        return _json_error(404, "no_project", "you are not a member of any project")
    bar, filters = _panel_filters(request)
    if bar.errors:
        return _json_error(400, "invalid_filters", "; ".join(bar.errors))
    window = bar.window
    try:
        body = build(project.pk, window, filters, bar)
    except StoreError as exc:
        log.error("panel series failed: %s", exc)
        return _json_error(503, "store_unavailable", STORE_DOWN)
    return JsonResponse({"project_id": project.pk, "start": window.start.isoformat(), "end": window.end.isoformat(),
                         "filters": filters, **body})


def _stats_json(stats) -> dict:
    return {
        "requests": stats.requests, "errors": stats.errors, "recovered": stats.recovered,
        "error_spans": stats.error_spans, "rps": stats.rps, "output_tokens_per_second": stats.output_tps,
        "error_rate": stats.error_rate, "availability": stats.availability, "concurrency": stats.concurrency,
        "input_tokens": stats.input_tokens, "output_tokens": stats.output_tokens, "cost_usd": stats.cost_usd,
        "cost_per_request": stats.cost_per_request, "cost_per_1k_tokens": stats.cost_per_1k_tokens,
        "inference_share": stats.inference_share,
        "e2e_ms": {f"p{int(q * 100)}": v for q, v in stats.e2e_ms.items()},
        "ttft_ms": {f"p{int(q * 100)}": v for q, v in stats.ttft_ms.items()},
        "tpot_ms": {f"p{int(q * 100)}": v for q, v in stats.tpot_ms.items()},
        "phase_ms": {p: {f"p{int(q * 100)}": v for q, v in qs.items()} for p, qs in stats.phase_ms.items()},
        "phase_mean_ms": stats.phase_mean_ms,
    }


def _cache_figures_json(f) -> dict:
    return {"consulted": f.consulted, "hits": f.hits, "misses": f.misses, "hit_rate": f.hit_rate,
            "latency_saved_ms": f.latency_saved_ms, "cost_saved_usd": f.cost_saved_usd, "tokens_saved": f.tokens_saved,
            "hits_unpriced": f.hits_unpriced}


def _cache_json(cache: dict, bar: FilterBar) -> dict:
    """The page's cache figures (DOMAIN.md "Cache"): window, previous window, tiles, series, endpoints."""
    savings = cache["savings"]
    return {
        "ever": savings.ever,
        "model_filter_applied": False,  # a hit calls no model, so no request filter by model can keep it
        "stats": _cache_figures_json(savings.totals), "previous": _cache_figures_json(cache["previous"].totals),
        "kpis": [_kpi_json(k, bar) for k in cache["kpis"]],
        "series": {"step_seconds": savings.step_seconds, "times": [t.isoformat() for t in savings.times],
                   "buckets": [None if b is None else _cache_figures_json(b) for b in savings.buckets]},
        "endpoints": [{"service": e.service, "root_name": e.root_name, "consulted": e.consulted, "hits": e.hits,
                       "misses": e.misses, "hit_rate": e.hit_rate, "hit_p50_ms": e.hit_p50_ms,
                       "miss_p50_ms": e.miss_p50_ms, "latency_saved_ms": e.latency_saved_ms,
                       "miss_cost_mean_usd": e.miss_cost_mean_usd, "cost_saved_usd": e.cost_saved_usd,
                       "miss_tokens_mean": e.miss_tokens_mean, "tokens_saved": e.tokens_saved}
                      for e in savings.endpoints],
    }


def _series_json(series) -> dict:
    return {"step_seconds": series.step_seconds, "times": [t.isoformat() for t in series.times],
            "buckets": [None if b is None else _stats_json(b) for b in series.buckets]}


def _grouped_json(data: dict) -> dict:
    """``{"grouped": …}`` of a page's JSON with ``group_by`` (analytics.grouping: each group with its
    colour and P95 target), ``group_figures`` (the grouped charts), else ``{}``."""
    if data["grouped"] is None:
        return {}
    body = grouping.grouped_json(data["grouped"])
    colors = panels.group_colors(data["grouped"])
    for g in body["groups"]:
        g["color"] = colors[g["value"]]
        target = data["group_target_ms"].get(g["value"]) if g["kind"] == "value" else None
        g["targets"] = {"e2e_p95_ms": target} if target is not None else {}
    return {"grouped": body, "group_figures": data["group_figures"]}


def _group_or_error(request):
    """(group, None) of ``group_by``/``group_top``, or (None, the 400 answer naming the parameter)."""
    try:
        return group_params(request.GET), None
    except ApiError as exc:
        return None, exc.response()


@json_login_required
def overview_json(request):
    """GET /overview.json?range=…|from=…&to=…&service=…&model=…[&group_by=…&group_top=…] — the
    overview's numbers and figures; with ``group_by``, ``grouped``: the series per attribute value."""
    group, error = _group_or_error(request)
    if error is not None:
        return error

    def build(project_id, window, filters, bar):
        data = _overview(project_id, window, filters, group)
        grouped = _grouped_json(data)
        current = data["current"]
        return {"stats": _stats_json(data["stats"]), "previous": _stats_json(data["previous"]),
                "current": {"label": panels.current_label(current.seconds), "seconds": current.seconds,
                            "requests": current.requests, "rps": current.rps},
                "kpis": [_kpi_json(k, bar) for k in data["kpis"]],
                "series": _series_json(data["series"]), "figures": {**data["figures"], **data["cache"]["figures"]},
                "cache": _cache_json(data["cache"], bar), **grouped}

    return _panel_json(request, build)


def _kpi_json(k, bar: FilterBar) -> dict:
    """A tile, and ``traces_url``: its link to the explorer, the very link the page renders
    (``kpi_traces_link``), so a live redraw can update it with the value."""
    return {"key": k.key, "label": k.label, "value": k.value, "previous": k.previous, "unit": k.unit,
            "digits": k.digits, "change_percent": k.change_percent, "verdict": k.verdict,
            "traces_url": kpi_traces_link(k.key, k.value, bar.params)}


def _costs(project_id: int, window: TimeWindow, filters: dict[str, str], group=None, *, suggest: bool = False) -> dict:
    args = {"project_id": project_id, "start": window.start, "end": window.end, **filters}
    previous = window.previous()
    r = panel_selectors.reads_concurrently(
        **_cache_reads(project_id, window, filters),
        now=lambda: rollups.window_stats(**args),
        before=lambda: rollups.window_stats(**{**args, "start": previous.start, "end": previous.end}),
        series=lambda: rollups.window_series(**args),
        spend=lambda: rollups.spend_by_model(**args),
        totals=lambda: rollups.model_totals(**args),
        # cost over the time the last 7 days actually cover × 30 days / that time
        projection=lambda: rollups.spend_projection(project_id=project_id, **filters),
        facets=lambda: panel_selectors.panel_facets(project_id=project_id, start=window.start, end=window.end),
        **_group_reads(group, project_id, window, filters, suggest=suggest))
    projection = r["projection"]
    return {"stats": r["now"], "previous": r["before"], "series": r["series"],
            "kpis": panels.costs_kpis(r["now"], r["before"]), "projection": projection, "model_totals": r["totals"],
            "projected_monthly_usd": projection.projected_monthly, "projection_basis_usd": projection.cost_covered,
            "figures": panels.costs_figures(r["series"], r["spend"], filters=filters, totals=r["totals"]),
            "facets": r["facets"], "cache": _cache_panel(r, filters, panels.cache_costs_kpis, panels.cache_costs_figures),
            **_group_panel(r, group, project_id, window, cost=True)}


@login_required
def costs(request):
    """Tokens, cost per request and per 1k tokens, spend per model, the projection, and the
    project's price table (which estimates the cost of spans that carry tokens but no cost)."""
    from analytics.prices import model_price_delete, model_price_set, model_prices_list

    bar, filters = _panel_filters(request)
    group, group_error = _page_group(request)
    project = current_project(request)
    price_errors: dict[str, list[str]] = {}
    price_form = {"model": "", "input_usd_per_million": "", "output_usd_per_million": ""}
    if request.method == "POST" and project is not None:
        if request.POST.get("action") == "delete":
            model_price_delete(project_id=project.pk, model=request.POST.get("model", ""))
            return redirect(f"{request.path}?{request.GET.urlencode()}#prices")
        price_form = {k: request.POST.get(k, "") for k in price_form}
        try:
            model_price_set(project_id=project.pk, **price_form)
        except ValidationError as exc:
            price_errors = exc.message_dict
        else:
            return redirect(f"{request.path}?{request.GET.urlencode()}#prices")
    prices = model_prices_list(project_id=project.pk) if project is not None else []
    response = _project_page(request, "dashboard/costs.html", "panel",
                             lambda project_id: _costs(project_id, bar.window, filters, group, suggest=True),
                             filters=bar, prices=prices, group_error=group_error,
                             group_extra_fields="dashboard/_group_fields.html",
                             price_form=price_form, price_errors=price_errors, projection_days=PROJECTION_DAYS)
    if price_errors and response.status_code == 200:
        response.status_code = 400
    return response


@json_login_required
def costs_json(request):
    """GET /costs.json?range=…&service=…&model=…[&group_by=…&group_top=…] — the costs page's numbers
    and figures; with ``group_by``, ``grouped`` (cost per attribute value over time among them)."""
    group, error = _group_or_error(request)
    if error is not None:
        return error

    def build(project_id, window, filters, bar):
        data = _costs(project_id, window, filters, group)
        grouped = _grouped_json(data)
        return {"stats": _stats_json(data["stats"]), "previous": _stats_json(data["previous"]),
                "projected_monthly_usd": data["projected_monthly_usd"],
                "projection": projection_label(data["projection"]),  # the series API's wording
                "projection_covered_seconds": data["projection"].covered_seconds,
                "by_model": [{"model": t.model, "input_tokens": t.input_tokens, "output_tokens": t.output_tokens,
                              "cost_usd": t.cost_usd} for t in data["model_totals"]],
                "series": _series_json(data["series"]), "figures": {**data["figures"], **data["cache"]["figures"]},
                "cache": _cache_json(data["cache"], bar), **grouped}

    return _panel_json(request, build)


def _compare(project_id: int, query) -> dict:
    window = query.window
    reads = {
        "a": lambda: compare_side_stats(project_id=project_id, side=query.a, service=query.service),
        "b": lambda: compare_side_stats(project_id=project_id, side=query.b, service=query.service),
        "facets": lambda: panel_selectors.panel_facets(project_id=project_id, start=window.start, end=window.end),
    }
    if query.mode == "attribute":
        reads["attribute_values"] = lambda: panel_selectors.attribute_values(
            project_id=project_id, start=window.start, end=window.end, key=query.attribute_key)
    r = panel_selectors.reads_concurrently(**reads)
    a, b = r["a"], r["b"]
    return {"a": a, "b": b, "rows": compare_rows(a, b),
            "figures": panels.compare_figures(a, b, label_a=query.a.label, label_b=query.b.label),
            "facets": r["facets"], "attribute_values": r.get("attribute_values", [])}


@login_required
def compare(request):
    """Two time windows, two models or two values of an attribute (a release) side by side:
    per-phase percentiles, TTFT, throughput and cost, with B's difference from A in %."""
    query = compare_query_from(request.GET)
    return _project_page(request, "dashboard/compare.html", "panel", lambda project_id: _compare(project_id, query),
                         query=query, presets=PRESETS, modes=COMPARE_MODES)


@json_login_required
def compare_json(request):
    """GET /compare.json?mode=windows&a_from=…&a_to=…&b_from=…&b_to=… (or mode=models&a_model=…&b_model=…,
    or mode=attribute&attr=release&a_value=…&b_value=…, with range/from/to) — both sides' numbers."""
    project = current_project(request)
    if project is None:
        return _json_error(404, "no_project", "you are not a member of any project")
    query = compare_query_from(request.GET)
    if query.errors:
        return _json_error(400, "invalid_compare", "; ".join(query.errors))
    try:
        data = _compare(project.pk, query)
    except StoreError as exc:
        log.error("compare failed: %s", exc)
        return _json_error(503, "store_unavailable", STORE_DOWN)
    return JsonResponse({
        "project_id": project.pk, "mode": query.mode, "service": query.service,
        "a": {"label": query.a.label, "start": query.a.start.isoformat(), "end": query.a.end.isoformat(),
              "stats": _stats_json(data["a"])},
        "b": {"label": query.b.label, "start": query.b.start.isoformat(), "end": query.b.end.isoformat(),
              "stats": _stats_json(data["b"])},
        "rows": [{"group": r.group, "metric": r.label, "a": r.a, "b": r.b, "unit": r.unit,
                  "change_percent": r.change_percent, "verdict": r.verdict} for r in data["rows"]],
        "figures": data["figures"],
    })


@login_required
def project_settings(request):
    """The settings page: the current project's retention, ingest keys and members, and the user's
    projects (members of the project only; projects/views.py)."""
    from projects.views import settings_page

    return settings_page(request)
