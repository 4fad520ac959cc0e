"""Plotly figures of the panel pages (overview, costs, resources, compare), built from selector
results. Pure functions of their input: the JSON endpoints and the pages serve the same figures.

The figures are built as plain dicts (``Fig``) with the base layout and phase colours of
``charts``, not through ``plotly.graph_objects``: its validation took 200-300 ms for the
overview's six figures of 120 points, more than the page's whole query budget (150 ms), and
plotly.js draws the same JSON. Times are written as UTC wall-clock strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from datetime import datetime, timedelta, timezone
from urllib.parse import urlencode

from analytics.cache_selectors import CacheSavings
from analytics.engines import EngineSeries, Instance
from analytics.panel_selectors import LatencyHeatmap, ModelSpend, WindowSeries, WindowStats
from analytics.rollup_services import HIST_GAMMA
from analytics.selectors import DeviceSeries, LoadSeries, ResourceSeries
from analytics.trace_math import PHASES
from charts import BASE_LAYOUT, HEATMAP_COLORSCALE, PHASE_COLORS, mark_alerts, plotly_text, style_figure

GPU_MEMORY_THRESHOLD = 85.0  # DOMAIN.md: GPU memory % (used / total from NVML) >= 85 — scale out
CPU_THRESHOLD = 70.0  # DOMAIN.md: host CPU % > 70 — pre/post-processing needs optimising
GPU_UTILIZATION_LOW = 50.0  # DOMAIN.md: GPU utilisation < 50 % for 30 min while serving — inefficient
P95_THRESHOLD_MS = 1500.0  # DOMAIN.md: P95 E2E (chat) > 1500 ms — users feel the wait
INFERENCE_SHARE_THRESHOLD = 60.0  # DOMAIN.md: inference share > 60 %
NETWORK_THRESHOLD_MS = 200.0  # DOMAIN.md: network P95 > 200 ms
KV_CACHE_THRESHOLD = 90.0  # KV-cache usage >= 90 %: new requests wait for room, running ones get preempted


def _json_ready(value):
    """JSON-ready: datetimes as UTC wall-clock strings (what plotly.js reads), lists walked."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    return value


@lru_cache(maxsize=16)
def _wall_clock(times: tuple[datetime, ...]) -> list[str]:
    """A chart's time axis as UTC wall-clock strings; the traces of a page share one axis."""
    return [_json_ready(t) for t in times]


@lru_cache(maxsize=16)
def _bucket_stamps(times: tuple[datetime, ...], step: int) -> list[tuple[str, str]]:
    """(from, to) of each bucket, URL-encoded, for the explorer links."""
    def stamp(t: datetime) -> str:
        return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%%3A%M%%3A%SZ")

    return [(stamp(t), stamp(t + timedelta(seconds=step))) for t in times]


class Fig:
    """The few figure operations the panels use, on a plain plotly JSON figure."""

    def __init__(self, **layout):
        self.data: list[dict] = []
        self.layout: dict = {**BASE_LAYOUT, **layout}

    def _add(self, kind: str, **trace) -> None:
        x = trace.get("x")
        if x and isinstance(x[0], datetime):
            trace["x"] = _wall_clock(tuple(x))
        color = trace.pop("marker_color", None)
        if color is not None:
            trace["marker"] = {**trace.get("marker", {}), "color": color}
        self.data.append({"type": kind, **trace})

    def add_bar(self, **trace) -> None:
        self._add("bar", **trace)

    def add_scatter(self, **trace) -> None:
        self._add("scatter", **trace)

    def add_heatmap(self, **trace) -> None:
        self._add("heatmap", **trace)

    def add_shape(self, **shape) -> None:
        self.layout.setdefault("shapes", []).append(shape)

    def add_annotation(self, **note) -> None:
        self.layout.setdefault("annotations", []).append(note)

    def update_yaxes(self, **axis) -> None:
        self.layout["yaxis"] = {**self.layout.get("yaxis", {}), **{k: v for k, v in axis.items() if v is not None}}
        if axis.get("rangemode", "") is None:
            self.layout["yaxis"].pop("rangemode", None)

    def to_dict(self) -> dict:
        layout = dict(self.layout)
        # plotly.py's default template would set these: axes make room for their tick labels and
        # titles, so long category names and right-hand axes are not cut or overlapped.
        for axis in {"xaxis", "yaxis", *(k for k in layout if k.startswith(("xaxis", "yaxis")))}:
            layout[axis] = {"automargin": True, "gridcolor": "#eef0f3", **layout.get(axis, {})}
        return {"data": self.data, "layout": _json_ready(layout)}  # traces' times converted when added


def figure(**layout) -> Fig:
    return Fig(**layout)


def figure_dict(fig: Fig) -> dict:
    return style_figure(fig.to_dict())  # units in hovers and axes, money, heatmap colours (charts)


def threshold_line(fig: Fig, *, y: float, label: str, color: str = "#b00020") -> None:
    """A dashed horizontal reference line with its label (as ``charts.threshold_line``)."""
    fig.add_shape(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=y, y1=y,
                  line={"dash": "dash", "color": color, "width": 1})
    fig.add_annotation(xref="x domain", x=0, yref="y", y=y, text=label, showarrow=False,
                       xanchor="left", yanchor="bottom")


def _time_layout(title: str, start: datetime, end: datetime, ytitle: str, **extra) -> dict:
    """Every time chart of a page spans the same [start, end], so charts line up one under another."""
    return {"title": {"text": title, "x": 0, "font": {"size": 13}}, "height": 260,
            "xaxis": {"type": "date", "range": [start.isoformat(), end.isoformat()]},
            "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero"}, **extra}


def _line(fig: Fig, *, x, y, name: str, **kwargs) -> None:
    # connectgaps False: a missing sample is a gap, never a line drawn through it (DOMAIN.md).
    # Markers, so a lone sample between gaps is still visible; a legend even for one device, so
    # the chart always says whose line it is.
    fig.add_scatter(x=x, y=y, name=name, mode="lines+markers", marker={"size": 5}, connectgaps=False,
                    showlegend=True, **kwargs)


def _device_figure(series: ResourceSeries, devices: list[DeviceSeries], metric: str, *, title: str,
                   ytitle: str, threshold: tuple[float, str] | None = None, percent: bool = False) -> dict:
    layout = _time_layout(title, series.start, series.end, ytitle)
    if percent:
        layout["yaxis"]["range"] = [0, 105]
    fig = figure(**layout)
    # A point opens the traces of its time bucket, slowest first: what ran while the device was busy.
    links = _links(series.times, series.step_seconds, {"sort": "duration", "dir": "desc"})
    for device in devices:
        _line(fig, x=series.times, y=device.values[metric], name=device.label, customdata=links)
    if threshold:
        threshold_line(fig, y=threshold[0], label=threshold[1])
    return figure_dict(fig)


def resources_figures(series: ResourceSeries, load: LoadSeries, *, alerts: list[dict] = ()) -> dict[str, dict]:
    """The figures of /resources/, keyed by the element id the page gives each chart."""
    figs = {
        "fig-rps": _load_figure(series, load.times, load.rps, "Request rate", "requests/s", None,
                                _links(load.times, load.step_seconds, {})),
        "fig-p95": _load_figure(series, load.times, load.p95_e2e_ms, "P95 end-to-end latency", "ms",
                                (P95_THRESHOLD_MS, "P95 1500 ms"),
                                _threshold_links(load.times, load.step_seconds, {}, load.p95_e2e_ms, "min_ms", "duration")),
        "fig-gpu-util": _device_figure(series, series.gpus, "gpu_utilization", title="GPU utilisation",
                                       ytitle="%", percent=True,
                                       threshold=(GPU_UTILIZATION_LOW, "50 % (below: batching or allocation is inefficient)")),
        "fig-gpu-mem": _device_figure(series, series.gpus, "gpu_memory_percent", title="GPU memory (used / total)",
                                      ytitle="%", percent=True, threshold=(GPU_MEMORY_THRESHOLD, "85 %")),
        "fig-gpu-temp": _device_figure(series, series.gpus, "gpu_temperature", title="GPU temperature", ytitle="°C"),
        "fig-gpu-power": _device_figure(series, series.gpus, "gpu_power_watts", title="GPU power", ytitle="W"),
        "fig-host-cpu": _device_figure(series, series.hosts, "cpu_percent", title="Host CPU", ytitle="%",
                                       percent=True, threshold=(CPU_THRESHOLD, "70 %")),
        "fig-host-mem": _device_figure(series, series.hosts, "memory_percent", title="Host memory", ytitle="%",
                                       percent=True),
    }
    proc = figure(**_time_layout("GPU memory per process", series.start, series.end, "MiB"))
    for p in series.processes:
        _line(proc, x=series.times, y=[None if v is None else round(v / 2**20, 1) for v in p.memory_bytes],
              name=p.label)
    figs["fig-gpu-proc"] = figure_dict(proc)
    if alerts:
        for fig in figs.values():
            mark_alerts(fig, alerts)  # folded markers, details in the hover (charts)
    return figs


def _load_figure(series: ResourceSeries, times, values, title: str, ytitle: str, threshold, links) -> dict:
    fig = figure(**_time_layout(title, series.start, series.end, ytitle))
    _line(fig, x=times, y=values, name=title, customdata=links)
    if threshold:
        threshold_line(fig, y=threshold[0], label=threshold[1])
    return figure_dict(fig)


# --- engines -------------------------------------------------------------------------------------
# One colour per engine instance, the same on every chart of the page (its line, its band).
ENGINE_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f")
APP_COLOR = "#3b3b3b"
# What the shaded band between the app-side and the engine-side line is, one line under each chart.
GAP_CAPTIONS = {
    "fig-engine-ttft": "Shaded: time outside the engine before the first token (app-side P95 from traces minus "
                       "engine-side P95): network and client-side queueing.",
    "fig-engine-e2e": "Shaded: time outside the engine (app-side P95 from traces minus engine-side P95): network, "
                      "client-side queueing and the app's own pre- and post-processing.",
}


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def app_side_key(instance: Instance, app: dict[str, WindowSeries]) -> str:
    """Which app-side series an engine instance is compared with: its model's traces when the
    traces name that model (``app`` holds it), else every trace of the project (``''``)."""
    return instance.model if instance.model and instance.model in app else ""


def app_side_values(series: EngineSeries, app: WindowSeries | None, pick) -> list[float | None]:
    """``pick(bucket)`` of an app-side series on the engine series' time axis (None: no request)."""
    if app is None:
        return [None] * len(series.times)
    by_time = {t: (None if b is None else pick(b)) for t, b in zip(app.times, app.buckets)}
    return [by_time.get(t) for t in series.times]


def _engine_layout(series: EngineSeries, title: str, ytitle: str, **extra) -> dict:
    return _time_layout(title, series.start, series.end, ytitle, **extra)


def _no_line_note(fig: Fig, what: str) -> None:
    fig.add_annotation(xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       text=f"no engine in view reports {what} in this window", font={"color": "#6b7280"})


def _instance_lines(series: EngineSeries, fig: Fig, values, *, suffix: str = "", **style) -> int:
    """One line per instance with any value; returns how many were drawn."""
    drawn = 0
    for i, inst in enumerate(series.instances):
        ys = values(inst)
        if all(v is None for v in ys):
            continue
        color = ENGINE_COLORS[i % len(ENGINE_COLORS)]
        _line(fig, x=series.times, y=ys, name=plotly_text(inst.instance.label) + suffix,
              line={"color": color, **style.get("line", {})})
        drawn += 1
    return drawn


def _runs(flags: list[bool]) -> list[list[int]]:
    """The index runs where ``flags`` holds: [F, T, T, F, T] -> [[1, 2], [4]]."""
    runs: list[list[int]] = []
    for j, flag in enumerate(flags):
        if flag:
            if runs and runs[-1][-1] == j - 1:
                runs[-1].append(j)
            else:
                runs.append([j])
    return runs


def _latency_gap_figure(series: EngineSeries, app: dict[str, WindowSeries], *, histogram: str, pick, title: str,
                        what: str, bound: str, sort: str) -> dict:
    """Engine-side P95 of ``histogram`` per instance, the app-side P95 (``pick`` of the traces'
    buckets) it is compared with, and between the two a shaded band: the time outside the engine.
    The band is drawn over the buckets where both lines have a value, from a hidden copy of the
    engine line (``fill='tonexty'`` fills to the trace just before it)."""
    fig = figure(**_engine_layout(series, title, "ms"))
    x, step = series.times, series.step_seconds
    drawn_app: set[str] = set()
    for i, inst in enumerate(series.instances):
        engine = series.percentile_ms(inst, histogram)
        if all(v is None for v in engine):
            continue
        color = ENGINE_COLORS[i % len(ENGINE_COLORS)]
        label = plotly_text(inst.instance.label)
        key = app_side_key(inst.instance, app)
        app_values = app_side_values(series, app.get(key), pick)
        _line(fig, x=x, y=engine, name=f"engine {what} P95 · {label}", line={"color": color})
        # One band per run of buckets where both lines have a value: plotly joins a filled trace's
        # pieces across its gaps, and a gap is a missing sample, never something to shade.
        for n, run in enumerate(_runs([e is not None and a is not None for e, a in zip(engine, app_values)])):
            times = [x[j] for j in run]
            fig.add_scatter(x=times, y=[engine[j] for j in run], name=f"band edge · {label}", mode="lines",
                            line={"width": 0, "color": color}, showlegend=False, hoverinfo="skip",
                            legendgroup=f"gap-{what}-{i}")
            fig.add_scatter(x=times, y=[app_values[j] for j in run], name=f"outside the engine · {label}",
                            mode="lines", fill="tonexty", fillcolor=_rgba(color, 0.22), line={"width": 0, "color": color},
                            text=[round(app_values[j] - engine[j], 3) for j in run], showlegend=n == 0,
                            legendgroup=f"gap-{what}-{i}", hovertemplate="%{fullData.name}: %{text:,.1f} ms<extra></extra>")
        if key not in drawn_app and any(v is not None for v in app_values):
            drawn_app.add(key)
            scope = f"traces of {plotly_text(key)}" if key else "all traces"
            filters = {"model": key} if key else {}
            _line(fig, x=x, y=app_values, name=f"app {what} P95 ({scope})", line={"color": APP_COLOR, "dash": "dash"},
                  customdata=_threshold_links(x, step, filters, app_values, bound, sort))
    if not fig.data:
        _no_line_note(fig, f"engine-side {what}")
    return figure_dict(fig)


def engines_figures(series: EngineSeries, app: dict[str, WindowSeries], *, alerts: list[dict] = ()) -> dict[str, dict]:
    """The figures of /engines/, keyed by the element id the page gives each chart. ``app``: the
    app-side latency series from the traces in the same buckets, ``''`` every trace, a model's
    name that model's traces (``app_side_key``)."""
    figs = {}
    requests = figure(**_engine_layout(series, "Running and waiting requests (peak per point)", "requests"))
    running = _instance_lines(series, requests, lambda i: series.gauge(i, "requests_running"), suffix=" · running")
    waiting = _instance_lines(series, requests, lambda i: series.gauge(i, "requests_waiting"), suffix=" · waiting",
                              line={"dash": "dot"})
    if not running + waiting:
        _no_line_note(requests, "running or waiting requests")
    figs["fig-engine-requests"] = figure_dict(requests)

    kv = figure(**_engine_layout(series, "KV-cache usage (peak per point)", "%"))
    kv.layout["yaxis"]["range"] = [0, 100]
    if not _instance_lines(series, kv, lambda i: series.gauge(i, "kv_cache_usage")):
        _no_line_note(kv, "KV-cache usage")
    threshold_line(kv, y=KV_CACHE_THRESHOLD, label="90 % (above: requests wait for room, running ones are preempted)")
    figs["fig-engine-kv"] = figure_dict(kv)

    preempt = figure(**_engine_layout(series, "Preemptions per minute", "per minute"))
    if not _instance_lines(series, preempt, lambda i: series.rate(i, "preemptions", per_seconds=60)):
        _no_line_note(preempt, "preemptions")
    figs["fig-engine-preemptions"] = figure_dict(preempt)

    figs["fig-engine-ttft"] = _latency_gap_figure(
        series, app, histogram="ttft_seconds", pick=lambda b: b.ttft_ms[0.95], what="TTFT", bound="ttft_ms",
        sort="ttft", title="Time to first token P95: app-side (traces) and engine-side")
    figs["fig-engine-e2e"] = _latency_gap_figure(
        series, app, histogram="e2e_seconds", pick=lambda b: b.e2e_ms[0.95], what="E2E", bound="min_ms",
        sort="duration", title="End-to-end latency P95: app-side (traces) and engine-side")

    queue = figure(**_engine_layout(series, "Engine queue time P95", "ms"))
    if not _instance_lines(series, queue, lambda i: series.percentile_ms(i, "queue_seconds")):
        _no_line_note(queue, "queue time")
    figs["fig-engine-queue"] = figure_dict(queue)

    tps = figure(**_engine_layout(series, "Generation throughput", "tokens/s"))
    if not _instance_lines(series, tps, lambda i: series.rate(i, "generation_tokens")):
        _no_line_note(tps, "generated tokens")
    figs["fig-engine-throughput"] = figure_dict(tps)
    if alerts:
        for fig in figs.values():
            mark_alerts(fig, alerts)
    return figs


def engine_instance_values(series: EngineSeries, app: dict[str, WindowSeries]) -> list[dict]:
    """Per instance, the very values the engine charts draw (one per bucket of ``series.times``),
    and the app-side P95s it is compared with (``app_side_model``: '' = every trace)."""
    out = []
    for inst in series.instances:
        key = app_side_key(inst.instance, app)
        i = inst.instance
        out.append({
            "engine": i.engine, "target": i.target, "model": i.model, "label": i.label, "host": inst.host,
            "app_side_model": key,
            "values": {
                "requests_running": series.gauge(inst, "requests_running"),
                "requests_waiting": series.gauge(inst, "requests_waiting"),
                "kv_cache_usage": series.gauge(inst, "kv_cache_usage"),
                "preemptions_per_minute": series.rate(inst, "preemptions", per_seconds=60),
                "generation_tokens_per_second": series.rate(inst, "generation_tokens"),
                "ttft_p95_ms": series.percentile_ms(inst, "ttft_seconds"),
                "e2e_p95_ms": series.percentile_ms(inst, "e2e_seconds"),
                "queue_p95_ms": series.percentile_ms(inst, "queue_seconds"),
                "app_ttft_p95_ms": app_side_values(series, app.get(key), lambda b: b.ttft_ms[0.95]),
                "app_e2e_p95_ms": app_side_values(series, app.get(key), lambda b: b.e2e_ms[0.95]),
            },
        })
    return out


# --- overview ------------------------------------------------------------------------------------
def traces_link(*, start: datetime, end: datetime, filters: dict[str, str]) -> str:
    """The explorer URL of the traces behind a chart point: that point's time bucket, same filters."""
    query = {"from": start.isoformat().replace("+00:00", "Z"), "to": end.isoformat().replace("+00:00", "Z")}
    query.update({k: v for k, v in filters.items() if v})
    return "/traces/?" + urlencode(query)


def _links(times: list[datetime], step: int, filters: dict[str, str]) -> list[str]:
    """``traces_link`` of every bucket (the filters encoded once: a page makes thousands)."""
    rest = urlencode({k: v for k, v in filters.items() if v})
    rest = "&" + rest if rest else ""
    return [f"/traces/?from={start}&to={end}{rest}" for start, end in _bucket_stamps(tuple(times), step)]


# A percentile read from the rollups' histograms is its bucket's representative, up to 0.5 % above
# the request it stands for: the explorer's lower bound is the bottom of that bucket.
_BUCKET_FLOOR = (HIST_GAMMA + 1) / (2 * HIST_GAMMA)


def _at_least(value_ms: float) -> str:
    """A percentile (ms) as the explorer's lower bound (``min_ms``, ``ttft_ms``): the bottom of
    the histogram bucket it was read from (0.5 % below), less a rounding microsecond, so the
    request at that percentile is always among the traces listed, with those above it."""
    return f"{max(0.0, value_ms * _BUCKET_FLOOR - 0.001):.3f}".rstrip("0").rstrip(".")


def _threshold_links(times: list[datetime], step: int, filters: dict[str, str], values: list,
                     bound: str, sort: str) -> list[str | None]:
    """Per bucket: its traces at or above that bucket's value (``bound``: ``min_ms`` for a
    duration percentile, ``ttft_ms`` for a TTFT one), the slowest first; None where no value."""
    base = _links(times, step, {**filters, "sort": sort, "dir": "desc"})
    return [None if v is None else f"{link}&{bound}={_at_least(v)}" for link, v in zip(base, values)]


def _bands(edges_ms) -> list[dict[str, str]]:
    """The explorer's duration bounds (``min_ms``, ``max_ms``) of each latency band."""
    out, low = [], 0
    for edge in edges_ms:
        out.append({"min_ms": str(low), "max_ms": str(edge)} if low else {"max_ms": str(edge)})
        low = edge
    out.append({"min_ms": str(low)})
    return out


def _series_layout(series: WindowSeries, title: str, ytitle: str, **extra) -> dict:
    return _time_layout(title, series.start, series.end, ytitle, **extra)


def _r(value, digits=3):
    return None if value is None else round(value, digits)


def overview_figures(series: WindowSeries, heatmap: LatencyHeatmap, *, filters: dict[str, str]) -> dict[str, dict]:
    """The overview's figures; every point links to the traces of its bucket."""
    links = _links(series.times, series.step_seconds, filters)
    x = series.times
    figs = {}

    traffic = figure(**_series_layout(series, "Requests per second and errors", "requests/s",
                                      yaxis2={"title": {"text": "error rate %"}, "overlaying": "y", "side": "right",
                                              "rangemode": "tozero", "showgrid": False}))
    traffic.add_bar(x=x, y=series.values(lambda b: _r(b.rps, 4)), name="RPS", customdata=links, marker_color="#4e79a7")
    traffic.add_scatter(x=x, y=series.values(lambda b: _r(100 * b.error_rate, 2)), name="error rate %", yaxis="y2",
                        mode="lines+markers", customdata=_links(x, series.step_seconds, {**filters, "status": "error"}), line={"color": "#c4320a"}, connectgaps=False)
    figs["fig-traffic"] = figure_dict(traffic)

    latency = figure(**_series_layout(series, "End-to-end latency percentiles", "ms"))
    # A point opens the traces of its bucket at or above its own value, slowest first: from a bad
    # P99 to the guilty trace in two clicks.
    for q, name, dash in ((0.5, "P50", "dot"), (0.95, "P95", "solid"), (0.99, "P99", "dash")):
        values = series.values(lambda b, q=q: b.e2e_ms[q])
        latency.add_scatter(x=x, y=values, name=f"E2E {name}", mode="lines+markers", line={"dash": dash},
                            customdata=_threshold_links(x, series.step_seconds, filters, values, "min_ms", "duration"),
                            connectgaps=False)
    ttft = series.values(lambda b: b.ttft_ms[0.95])
    latency.add_scatter(x=x, y=ttft, name="TTFT P95", mode="lines+markers",
                        customdata=_threshold_links(x, series.step_seconds, filters, ttft, "ttft_ms", "ttft"),
                        connectgaps=False, line={"color": "#59a14f"})
    threshold_line(latency, y=P95_THRESHOLD_MS, label="P95 1500 ms (chat)")
    figs["fig-latency"] = figure_dict(latency)

    # Mean exclusive time per phase, stacked: the stack's height is the mean E2E of the bucket.
    breakdown = figure(barmode="stack", **_series_layout(
        series, "Latency breakdown by phase (mean exclusive time per request)", "ms",
        yaxis2={"title": {"text": "inference share %"}, "overlaying": "y", "side": "right", "range": [0, 100],
                "showgrid": False}))
    # A phase's bar opens the bucket's traces whose slowest phase it is, slowest first.
    by_phase = {p: _links(x, series.step_seconds, {**filters, "phase": p, "sort": "duration", "dir": "desc"})
                for p in PHASES}
    for phase in PHASES:
        breakdown.add_bar(x=x, y=series.values(lambda b, p=phase: _r(b.phase_mean_ms[p])), name=phase,
                          marker_color=PHASE_COLORS[phase], customdata=by_phase[phase])
    breakdown.add_scatter(x=x, y=series.values(lambda b: _r(None if b.inference_share is None else 100 * b.inference_share, 2)),
                          name="inference share %", yaxis="y2", mode="lines+markers", customdata=by_phase["inference"],
                          line={"color": "#111", "dash": "dot"}, connectgaps=False)
    breakdown.add_scatter(x=x, y=series.values(lambda b: b.phase_ms["network"][0.95]), name="network P95",
                          mode="lines", line={"color": PHASE_COLORS["network"], "dash": "dash"}, connectgaps=False,
                          customdata=by_phase["network"])
    threshold_line(breakdown, y=P95_THRESHOLD_MS, label="P95 1500 ms")
    threshold_line(breakdown, y=NETWORK_THRESHOLD_MS, label="network 200 ms", color="#4e79a7")
    breakdown.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y2", y0=INFERENCE_SHARE_THRESHOLD,
                        y1=INFERENCE_SHARE_THRESHOLD, line={"dash": "dot", "color": "#e15759", "width": 1})
    breakdown.add_annotation(xref="paper", x=1, yref="y2", y=INFERENCE_SHARE_THRESHOLD, text="inference 60 %",
                             showarrow=False, xanchor="right", yanchor="bottom", font={"color": "#e15759", "size": 10})
    figs["fig-breakdown"] = figure_dict(breakdown)

    throughput = figure(**_series_layout(series, "Output tokens per second and concurrency", "tokens/s",
                                         yaxis2={"title": {"text": "mean in flight"}, "overlaying": "y",
                                                 "side": "right", "rangemode": "tozero", "showgrid": False}))
    throughput.add_scatter(x=x, y=series.values(lambda b: _r(b.output_tps, 3)), name="output tokens/s",
                           mode="lines+markers", customdata=links, connectgaps=False)
    throughput.add_scatter(x=x, y=series.values(lambda b: _r(b.concurrency, 3)), name="concurrency", yaxis="y2",
                           mode="lines+markers", customdata=links, connectgaps=False)
    figs["fig-throughput"] = figure_dict(throughput)

    labels = heatmap.labels
    # A cell opens the traces of its time bucket and latency band (the explorer's duration bounds).
    bands = _bands(heatmap.edges_ms)
    heat_links = [_links(heatmap.times, heatmap.step_seconds, {**filters, **band}) for band in bands]
    heat = figure(**_series_layout(series, "End-to-end latency heatmap (requests per bucket)", "E2E",
                                   hovermode="closest"))
    heat.add_heatmap(x=heatmap.times, y=labels, z=[[c or None for c in row] for row in heatmap.counts],
                     customdata=heat_links, colorscale=HEATMAP_COLORSCALE, hoverongaps=False, colorbar={"title": {"text": "requests"}})
    heat.update_yaxes(type="category", rangemode=None)
    figs["fig-heatmap"] = figure_dict(heat)

    hist = figure(title={"text": "End-to-end latency histogram", "x": 0, "font": {"size": 13}}, height=260,
                  hovermode="closest", xaxis={"type": "category", "title": {"text": "E2E"}},
                  yaxis={"title": {"text": "requests"}})
    hist.add_bar(x=labels, y=heatmap.totals, name="requests", marker_color="#4e79a7",
                 customdata=[traces_link(start=series.start, end=series.end, filters={**filters, **band})
                             for band in bands])
    figs["fig-histogram"] = figure_dict(hist)
    return figs


@dataclass(frozen=True)
class Kpi:
    key: str
    label: str
    value: float | None
    previous: float | None
    unit: str
    higher_is_better: bool | None  # None: neither (volume)
    digits: int = 1

    @property
    def change_percent(self) -> float | None:
        if self.value is None or self.previous is None or self.previous == 0:
            return None
        return 100.0 * (self.value - self.previous) / abs(self.previous)

    @property
    def verdict(self) -> str:
        change = self.change_percent
        if change is None or abs(change) < 0.5 or self.higher_is_better is None:
            return "flat"
        return "better" if (change > 0) == self.higher_is_better else "worse"


def current_label(seconds: float) -> str:
    """"last 5 min": the span the current rate is measured over."""
    minutes = max(1, round(seconds / 60))
    return f"last {minutes} min"


def overview_kpis(now: WindowStats, before: WindowStats, current=None, current_before=None) -> list[Kpi]:
    """The overview's tiles. RPS twice, each labelled: averaged over the whole window, and
    ``current`` (the window's last minutes, against the minutes before them: anything with
    ``rps`` and ``seconds``, e.g. ``rollups.Rate``)."""
    def pct(v):
        return None if v is None else 100 * v

    rps = [Kpi("rps", "RPS (window average)", now.rps, before.rps, "/s", None, 3)]
    if current is not None:
        rps.append(Kpi("rps_current", f"RPS ({current_label(current.seconds)})", current.rps,
                       None if current_before is None else current_before.rps, "/s", None, 3))
    return [
        Kpi("requests", "Requests", now.requests, before.requests, "", None, 0),
        *rps,
        Kpi("output_tps", "Output tokens/s", now.output_tps, before.output_tps, "/s", None, 2),
        # DOMAIN.md "Status": error requests are those whose root failed; recovered ones (a failed,
        # retried call under a root that succeeded) are not errors, and are counted on their own.
        Kpi("error_rate", "Error rate", pct(now.error_rate), pct(before.error_rate), "%", False, 2),
        Kpi("availability", "Availability", pct(now.availability), pct(before.availability), "%", True, 2),
        Kpi("recovered", "Recovered requests", now.recovered, before.recovered, "", None, 0),
        Kpi("error_spans", "Spans with errors", now.error_spans, before.error_spans, "", None, 0),
        Kpi("e2e_p50", "E2E P50", now.e2e_ms[0.5], before.e2e_ms[0.5], "ms", False, 1),
        Kpi("e2e_p95", "E2E P95", now.e2e_ms[0.95], before.e2e_ms[0.95], "ms", False, 1),
        Kpi("e2e_p99", "E2E P99", now.e2e_ms[0.99], before.e2e_ms[0.99], "ms", False, 1),
        Kpi("ttft_p50", "TTFT P50", now.ttft_ms[0.5], before.ttft_ms[0.5], "ms", False, 1),
        Kpi("ttft_p95", "TTFT P95", now.ttft_ms[0.95], before.ttft_ms[0.95], "ms", False, 1),
        Kpi("ttft_p99", "TTFT P99", now.ttft_ms[0.99], before.ttft_ms[0.99], "ms", False, 1),
        Kpi("cost", "Cost", now.cost_usd, before.cost_usd, "USD", None, 4),
    ]


# --- costs ---------------------------------------------------------------------------------------
def costs_figures(series: WindowSeries, spend: ModelSpend, *, filters: dict[str, str],
                  totals: list | None = None) -> dict[str, dict]:
    """``totals``: tokens and spend per model over the window (``rollups.ModelTotals``), each
    model call under its own model."""
    links = _links(series.times, series.step_seconds, filters)
    x = series.times
    tokens = figure(barmode="stack", **_series_layout(series, "Tokens per bucket", "tokens"))
    tokens.add_bar(x=x, y=series.values(lambda b: b.input_tokens), name="input tokens", customdata=links,
                   marker_color="#4e79a7")
    tokens.add_bar(x=x, y=series.values(lambda b: b.output_tokens), name="output tokens", customdata=links,
                   marker_color="#f28e2b")

    unit = figure(**_series_layout(series, "Cost per request and per 1k tokens", "USD per request",
                                   yaxis2={"title": {"text": "USD per 1k tokens"}, "overlaying": "y", "side": "right",
                                           "rangemode": "tozero", "showgrid": False}))
    costliest = _links(x, series.step_seconds, {**filters, "sort": "cost", "dir": "desc"})  # the dearest first
    unit.add_scatter(x=x, y=series.values(lambda b: _r(b.cost_per_request, 8)), name="cost per request",
                     mode="lines+markers", customdata=costliest, connectgaps=False)
    unit.add_scatter(x=x, y=series.values(lambda b: _r(b.cost_per_1k_tokens, 8)), name="cost per 1k tokens",
                     yaxis="y2", mode="lines+markers", customdata=costliest, connectgaps=False)

    by_model = figure(barmode="stack", **_series_layout(series, "Spend per model", "USD"))
    for model, values in sorted(spend.cost_by_model.items()):
        model_links = _links(spend.times, spend.step_seconds, {**filters, "model": "" if model == "(no model)" else model,
                                                               "sort": "cost", "dir": "desc"})
        by_model.add_bar(x=spend.times, y=[_r(v, 8) for v in values], name=model, customdata=model_links,
                         showlegend=True)
    figs = {"fig-tokens": figure_dict(tokens), "fig-unit-cost": figure_dict(unit), "fig-spend": figure_dict(by_model)}
    if totals is not None:
        names = [t.model for t in totals]
        per_model = figure(barmode="group", height=260, hovermode="closest",
                           title={"text": "Tokens per model (each call under its own model)", "x": 0, "font": {"size": 13}},
                           xaxis={"type": "category"}, yaxis={"title": {"text": "tokens"}, "rangemode": "tozero"})
        per_model.add_bar(x=names, y=[t.input_tokens for t in totals], name="input tokens", marker_color="#4e79a7")
        per_model.add_bar(x=names, y=[t.output_tokens for t in totals], name="output tokens", marker_color="#f28e2b")
        figs["fig-model-tokens"] = figure_dict(per_model)
    return figs


def costs_kpis(now: WindowStats, before: WindowStats) -> list[Kpi]:
    return [
        Kpi("cost", "Spend", now.cost_usd, before.cost_usd, "USD", None, 4),
        Kpi("cost_per_request", "Cost per request", now.cost_per_request, before.cost_per_request, "USD", False, 6),
        Kpi("cost_per_1k_tokens", "Cost per 1k tokens", now.cost_per_1k_tokens, before.cost_per_1k_tokens, "USD", False, 6),
        Kpi("input_tokens", "Input tokens", now.input_tokens, before.input_tokens, "", None, 0),
        Kpi("output_tokens", "Output tokens", now.output_tokens, before.output_tokens, "", None, 0),
        Kpi("requests", "Requests", now.requests, before.requests, "", None, 0),
    ]


# --- compare -------------------------------------------------------------------------------------
def compare_figures(a: WindowStats, b: WindowStats, *, label_a: str, label_b: str) -> dict[str, dict]:
    """Per-phase P50/P95/P99 (and E2E, TTFT) of the two sides as grouped bars."""
    names = [f"{metric} {q}" for metric in ("E2E", "TTFT", *PHASES) for q in ("P50", "P95", "P99")]

    def values(s: WindowStats) -> list[float | None]:
        out = []
        for metric in ("E2E", "TTFT", *PHASES):
            source = s.e2e_ms if metric == "E2E" else s.ttft_ms if metric == "TTFT" else s.phase_ms[metric]
            out += [source[0.5], source[0.95], source[0.99]]
        return out

    fig = figure(barmode="group", height=390, hovermode="closest", legend={"orientation": "h", "y": 1.1},
                 margin={"l": 56, "r": 16, "t": 64, "b": 40},
                 title={"text": "Percentiles per phase, A against B", "x": 0, "font": {"size": 13}},
                 xaxis={"type": "category", "tickangle": -45}, yaxis={"title": {"text": "ms"}, "rangemode": "tozero"})
    fig.add_bar(x=names, y=values(a), name=label_a, marker_color="#9aa5b1")
    fig.add_bar(x=names, y=values(b), name=label_b, marker_color="#3559e0")
    return {"fig-compare": figure_dict(fig)}


# --- cache ---------------------------------------------------------------------------------------
# What a cache in front of the model saved (DOMAIN.md "Cache"; analytics.cache_selectors): the
# overview shows the hit rate and the latency a hit saved, the costs page the cost and tokens saved.
CACHE_TOP_ENDPOINTS = 10  # endpoints in the costs page's bar chart (the JSON has them all)


def _label_text(text: str) -> str:
    """A user-sent name as plotly category text: plotly renders a little HTML there, so escape it."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cache_overview_kpis(now: CacheSavings, before: CacheSavings) -> list[Kpi]:
    def pct(v):
        return None if v is None else 100 * v

    return [
        Kpi("cache_hit_rate", "Cache hit rate", pct(now.totals.hit_rate), pct(before.totals.hit_rate), "%", True, 1),
        Kpi("cache_latency_saved", "Latency a hit saved (P50)", now.totals.latency_saved_ms,
            before.totals.latency_saved_ms, "ms", True, 1),
    ]


def cache_costs_kpis(now: CacheSavings, before: CacheSavings) -> list[Kpi]:
    return [
        Kpi("cache_cost_saved", "Saved by the cache", now.totals.cost_saved_usd, before.totals.cost_saved_usd, "USD",
            True, 4),
        Kpi("cache_tokens_saved", "Tokens saved", now.totals.tokens_saved, before.totals.tokens_saved, "", True, 0),
        Kpi("cache_hit_rate", "Cache hit rate", None if now.totals.hit_rate is None else 100 * now.totals.hit_rate,
            None if before.totals.hit_rate is None else 100 * before.totals.hit_rate, "%", True, 1),
    ]


def cache_overview_figures(savings: CacheSavings, *, filters: dict[str, str]) -> dict[str, dict]:
    """The hit rate per bucket (bars) and the latency a hit saved (P50 of misses − P50 of hits)."""
    links = _links(savings.times, savings.step_seconds, {"service": filters.get("service", "")})
    layout = _time_layout("Cache hit rate and latency a hit saved", savings.start, savings.end, "hit rate %",
                          yaxis2={"title": {"text": "latency saved ms"}, "overlaying": "y", "side": "right",
                                  "rangemode": "tozero", "showgrid": False})
    layout["yaxis"]["range"] = [0, 100]
    fig = figure(**layout)
    fig.add_bar(x=savings.times, y=savings.values(lambda b: _r(None if b.hit_rate is None else 100 * b.hit_rate, 2)),
                name="hit rate %", customdata=links, marker_color="#59a14f")
    fig.add_scatter(x=savings.times, y=savings.values(lambda b: _r(b.latency_saved_ms, 3)), name="latency saved (P50)",
                    yaxis="y2", mode="lines+markers", customdata=links, connectgaps=False, line={"color": "#4e79a7"})
    return {"fig-cache": figure_dict(fig)}


def cache_costs_figures(savings: CacheSavings, *, filters: dict[str, str]) -> dict[str, dict]:
    """Cost and tokens saved per bucket, and the cost saved by the endpoints that saved the most."""
    links = _links(savings.times, savings.step_seconds, {"service": filters.get("service", "")})
    over_time = figure(**_time_layout("Saved by the cache (hits × mean cost and tokens of a miss)", savings.start,
                                      savings.end, "USD",
                                      yaxis2={"title": {"text": "tokens"}, "overlaying": "y", "side": "right",
                                              "rangemode": "tozero", "showgrid": False}))
    over_time.add_bar(x=savings.times, y=savings.values(lambda b: _r(b.cost_saved_usd, 8)), name="cost saved",
                      customdata=links, marker_color="#59a14f")
    over_time.add_scatter(x=savings.times, y=savings.values(lambda b: _r(b.tokens_saved, 1)), name="tokens saved",
                          yaxis="y2", mode="lines+markers", customdata=links, connectgaps=False,
                          line={"color": "#f28e2b"})
    top = savings.endpoints[:CACHE_TOP_ENDPOINTS]
    by_endpoint = figure(height=260, hovermode="closest",
                         title={"text": "Cost saved by endpoint (service · root span)", "x": 0, "font": {"size": 13}},
                         xaxis={"type": "category"}, yaxis={"title": {"text": "USD"}, "rangemode": "tozero"})
    by_endpoint.add_bar(x=[_label_text(e.label) for e in top], y=[_r(e.cost_saved_usd, 8) for e in top],
                        name="cost saved", marker_color="#59a14f")
    return {"fig-cache-saved": figure_dict(over_time), "fig-cache-endpoints": figure_dict(by_endpoint)}


# Grouped charts (``group_by``): one line per group value, the same colour for a value on every
# chart of the page and for its target line; "other" and "(none)" in greys.
GROUP_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
                "#af7aa1")
GROUP_KIND_COLORS = {"other": "#8c8c8c", "none": "#c7c7c7"}


def group_colors(grouped) -> dict[str, str]:
    """``{group value: colour}`` for a grouped series (analytics.grouping.GroupedSeries)."""
    out, i = {}, 0
    for g in grouped.groups:
        if g.kind in GROUP_KIND_COLORS:
            out[g.value] = GROUP_KIND_COLORS[g.kind]
        else:
            out[g.value] = GROUP_COLORS[i % len(GROUP_COLORS)]
            i += 1
    return out


def grouped_figures(grouped, *, start: datetime, end: datetime, targets: dict[str, float] | None = None,
                    cost: bool = False) -> dict[str, dict]:
    """The grouped charts: E2E P95, requests/s and error rate per group value (``cost``: cost per
    bucket instead of the traffic charts); ``targets`` ``{value: P95 target ms}`` are dashed lines in
    the value's colour on the P95 chart."""
    targets = targets or {}
    colors = group_colors(grouped)
    x = grouped.times
    key = plotly_text(grouped.key)
    step = grouped.step_seconds or 1
    figs = {}

    def chart(title: str, ytitle: str, values) -> Fig:
        fig = figure(**_time_layout(title, start, end, ytitle))
        for g in grouped.groups:
            _line(fig, x=x, y=values(g), name=plotly_text(g.value), line={"color": colors[g.value]},
                  legendgroup=plotly_text(g.value))
        return fig

    p95 = chart(f"E2E P95 by {key}", "ms", lambda g: g.bucket_p95_ms)
    for g in grouped.groups:
        if g.kind == "value" and g.value in targets:
            p95.add_scatter(x=[start, end], y=[targets[g.value], targets[g.value]], mode="lines",
                            name=plotly_text(f"{g.value} target {targets[g.value]:g} ms"),
                            line={"color": colors[g.value], "dash": "dash", "width": 1},
                            legendgroup=plotly_text(g.value), hoverinfo="name")
    figs["fig-group-p95"] = figure_dict(p95)
    if cost:
        figs["fig-group-cost"] = figure_dict(chart(f"Cost per bucket by {key}", "USD", lambda g: g.bucket_cost_usd))
        return figs
    figs["fig-group-rps"] = figure_dict(chart(f"Requests per second by {key}", "requests/s",
                                              lambda g: [_r(n / step, 4) if n else None for n in g.bucket_requests]))
    figs["fig-group-errors"] = figure_dict(chart(f"Error rate by {key}", "error rate %",
                                                 lambda g: [_r(None if r is None else 100 * r, 2)
                                                            for r in g.bucket_error_rate()]))
    return figs
