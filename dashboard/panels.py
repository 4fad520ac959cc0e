"""Plotly figures of the panel pages (overview, costs, resources, compare), built from selector
results. Pure functions of their input: the JSON endpoints and the pages serve the same figures."""

from __future__ import annotations

from datetime import datetime

import plotly.graph_objects as go

from .charts import figure, figure_dict, threshold_line
from .selectors import DeviceSeries, LoadSeries, ResourceSeries

GPU_MEMORY_THRESHOLD = 85.0  # DOMAIN.md: GPU memory % (used / total from NVML) >= 85 — scale out
CPU_THRESHOLD = 70.0  # DOMAIN.md: host CPU % > 70 — pre/post-processing needs optimising
P95_THRESHOLD_MS = 1500.0  # DOMAIN.md: P95 E2E (chat) > 1500 ms — users feel the wait
INFERENCE_SHARE_THRESHOLD = 60.0  # DOMAIN.md: inference share > 60 %
NETWORK_THRESHOLD_MS = 200.0  # DOMAIN.md: network P95 > 200 ms


def _time_layout(title: str, start: datetime, end: datetime, ytitle: str, **extra) -> dict:
    """Every time chart of a page spans the same [start, end], so charts line up one under another."""
    return {"title": {"text": title, "x": 0, "font": {"size": 13}}, "height": 260,
            "xaxis": {"type": "date", "range": [start.isoformat(), end.isoformat()]},
            "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero"}, **extra}


def _line(fig: go.Figure, *, x, y, name: str, **kwargs) -> None:
    # connectgaps False: a missing sample is a gap, never a line drawn through it (DOMAIN.md).
    fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers", marker={"size": 3},
                             connectgaps=False, **kwargs))


def _device_figure(series: ResourceSeries, devices: list[DeviceSeries], metric: str, *, title: str,
                   ytitle: str, threshold: tuple[float, str] | None = None, percent: bool = False) -> dict:
    layout = _time_layout(title, series.start, series.end, ytitle)
    if percent:
        layout["yaxis"]["range"] = [0, 105]
    fig = figure(**layout)
    for device in devices:
        _line(fig, x=series.times, y=device.values[metric], name=device.label)
    if threshold:
        threshold_line(fig, y=threshold[0], label=threshold[1])
    return figure_dict(fig)


def resources_figures(series: ResourceSeries, load: LoadSeries, *, alerts: list[dict] = ()) -> dict[str, dict]:
    """The figures of /resources/, keyed by the element id the page gives each chart."""
    figs = {
        "fig-rps": _load_figure(series, load.times, load.rps, "Request rate", "requests/s", None),
        "fig-p95": _load_figure(series, load.times, load.p95_e2e_ms, "P95 end-to-end latency", "ms",
                                (P95_THRESHOLD_MS, "P95 1500 ms")),
        "fig-gpu-util": _device_figure(series, series.gpus, "gpu_utilization", title="GPU utilisation",
                                       ytitle="%", percent=True),
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
            _mark_alerts(fig, alerts)
    return figs


def _load_figure(series: ResourceSeries, times, values, title: str, ytitle: str, threshold) -> dict:
    fig = figure(**_time_layout(title, series.start, series.end, ytitle))
    _line(fig, x=times, y=values, name=title)
    if threshold:
        threshold_line(fig, y=threshold[0], label=threshold[1])
    return figure_dict(fig)


def _mark_alerts(fig: dict, alerts: list[dict]) -> None:
    """A vertical line where each firing alert started, labelled with a link to /alerts/."""
    layout = fig.setdefault("layout", {})
    shapes, notes = layout.setdefault("shapes", []), layout.setdefault("annotations", [])
    for alert in alerts:
        if not alert.get("since"):
            continue
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": alert["since"], "x1": alert["since"],
                       "y0": 0, "y1": 1, "line": {"color": "#b00020", "width": 1, "dash": "dot"}})
        notes.append({"xref": "x", "yref": "paper", "x": alert["since"], "y": 1, "showarrow": False,
                      "xanchor": "left", "yanchor": "top", "font": {"color": "#b00020", "size": 10},
                      "text": f'<a href="/alerts/">firing: {_plain(alert.get("rule", "alert"))}</a>'})


def _plain(text: str) -> str:
    """Plotly renders a little HTML in annotation text; a rule name is the user's, so escape it."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
