"""Plotly figures of a load test report (built in Python, drawn by static/tracedash/charts.js)."""

from __future__ import annotations

import plotly.graph_objects as go

from charts import figure, figure_dict

OFFERED, ACHIEVED, KNEE = "#4e79a7", "#59a14f", "#b00020"
LATENCY = {"p50": "#76b7b2", "p95": "#e15759", "p99": "#9c755f"}
TTFT = "#f28e2b"


def _ms(step: dict, key: str, p: str):
    d = step.get(key)
    return d.get(p) if d else None


def _knee_marker(fig: go.Figure, knee: dict | None, y: float | None, *, name: str = "knee") -> None:
    if knee and y is not None:
        fig.add_trace(go.Scatter(x=[knee["label"]], y=[y], mode="markers+text", name=name, text=["knee"],
                                 textposition="top center",
                                 marker={"color": KNEE, "size": 14, "symbol": "x"}, hoverinfo="name+y"))


def throughput_figure(report: dict) -> dict:
    steps = report["steps"]
    labels = [s["label"] for s in steps]
    knee = report.get("knee")
    fig = figure(title="Offered vs achieved load per step", yaxis_title="requests / s", hovermode="x unified")
    fig.add_trace(go.Scatter(x=labels, y=[s["offered_qps"] for s in steps], name="offered QPS", mode="lines+markers",
                             line={"color": OFFERED, "dash": "dash"}))
    fig.add_trace(go.Scatter(x=labels, y=[s["achieved_rps"] for s in steps], name="achieved RPS",
                             mode="lines+markers", line={"color": ACHIEVED}))
    if knee:
        _knee_marker(fig, knee, knee["achieved_rps"])
        fig.add_hline(y=knee["capacity_rps"], line={"dash": "dot", "color": KNEE, "width": 1},
                      annotation_text=f"capacity ≈ {knee['capacity_rps']:.1f} rps", annotation_position="top left")
    return figure_dict(fig)


def latency_figure(report: dict) -> dict:
    steps = report["steps"]
    labels = [s["label"] for s in steps]
    knee = report.get("knee")
    fig = figure(title="Latency per step (E2E percentiles and TTFT)", yaxis_title="ms")
    for p, color in LATENCY.items():
        fig.add_trace(go.Scatter(x=labels, y=[_ms(s, "e2e_ms", p) for s in steps], name=f"E2E {p.upper()}",
                                 mode="lines+markers", line={"color": color}))
    fig.add_trace(go.Scatter(x=labels, y=[_ms(s, "ttft_ms", "p50") for s in steps], name="TTFT P50",
                             mode="lines+markers", line={"color": TTFT, "dash": "dot"}))
    fig.add_trace(go.Scatter(x=labels, y=[_ms(s, "ttft_ms", "p95") for s in steps], name="TTFT P95",
                             mode="lines+markers", line={"color": TTFT}))
    if knee:
        knee_step = next((s for s in steps if s["index"] == knee["step"]), None)
        _knee_marker(fig, knee, _ms(knee_step, "e2e_ms", "p95") if knee_step else None)
        if knee.get("p95_limit_ms"):
            fig.add_hline(y=knee["p95_limit_ms"], line={"dash": "dash", "color": KNEE, "width": 1},
                          annotation_text="P95 limit", annotation_position="top left")
    return figure_dict(fig)


def errors_figure(report: dict) -> dict:
    steps = report["steps"]
    fig = figure(title="Error rate per step", yaxis_title="% of answered requests", yaxis_rangemode="tozero")
    fig.add_trace(go.Bar(x=[s["label"] for s in steps], y=[round(s["error_rate"] * 100, 3) for s in steps],
                         name="error rate %", marker={"color": KNEE},
                         customdata=[s["errors"] for s in steps], hovertemplate="%{y:.2f} %% (%{customdata} errors)"))
    return figure_dict(fig)


def timeline_figure(report: dict) -> dict:
    rows = report["timeline"]
    t = [r["t"] for r in rows]
    fig = figure(title="Over time: offered and achieved load, P95 of requests sent in each window",
                 xaxis_title="seconds from the start", yaxis_title="requests / s",
                 yaxis2={"title": "P95 ms", "overlaying": "y", "side": "right", "rangemode": "tozero"})
    fig.add_trace(go.Scatter(x=t, y=[r["offered_qps"] for r in rows], name="offered QPS",
                             line={"color": OFFERED, "dash": "dash", "shape": "hv"}))
    fig.add_trace(go.Scatter(x=t, y=[r["achieved_rps"] for r in rows], name="achieved RPS",
                             line={"color": ACHIEVED, "shape": "hv"}))
    fig.add_trace(go.Scatter(x=t, y=[r["p95_ms"] for r in rows], name="E2E P95 (ms)", yaxis="y2",
                             line={"color": LATENCY["p95"]}))
    burst = report.get("burst")
    if burst:
        fig.add_vrect(x0=burst["burst_start_s"], x1=burst["burst_end_s"], fillcolor="#f28e2b", opacity=0.12,
                      line_width=0, annotation_text="burst", annotation_position="top left")
        if burst.get("limit_ms"):
            fig.add_hline(y=burst["limit_ms"], yref="y2", line={"dash": "dot", "color": KNEE, "width": 1},
                          annotation_text="baseline P95 + 10 %", annotation_position="bottom right")
        if burst.get("recovered"):
            at = burst["burst_end_s"] + burst["recovery_s"]
            fig.add_vline(x=at, line={"color": KNEE, "width": 2},
                          annotation_text=f"recovered after {burst['recovery_s']:.2f} s", annotation_position="top right")
    return figure_dict(fig)


KV_LIMIT = 90.0  # the engine alert rule's line (docs/engines.md)


def engine_figure(report: dict) -> dict | None:
    """The engine seen from inside during the test (the built-in simulator's ``/metrics``, scraped
    every second): clients' TTFT P95, the engine's waiting and running requests and its KV-cache
    usage on ONE time axis (three rows sharing it), so the knee shows as the cache filling and the
    queue growing at the moment TTFT rises. None when the run has no engine timeline."""
    engine = report.get("engine") or {}
    rows = engine.get("timeline") or []
    if not rows:
        return None
    t = [r["t"] for r in rows]
    timeline = report.get("timeline") or []
    fig = figure(
        title="Inside the engine: TTFT, queue and KV cache on one time axis", height=560, hovermode="x unified",
        xaxis={"anchor": "y3", "title": {"text": "seconds from the start"}},
        yaxis={"domain": [0.70, 1.0], "title": {"text": "TTFT P95 ms"}, "rangemode": "tozero"},
        yaxis2={"domain": [0.37, 0.65], "title": {"text": "requests"}, "rangemode": "tozero"},
        yaxis3={"domain": [0.0, 0.32], "title": {"text": "KV cache %"}, "range": [0, 105]},
    )
    fig.add_trace(go.Scatter(x=[r["t"] for r in timeline], y=[r.get("ttft_p95_ms") for r in timeline],
                             name="client TTFT P95 (ms)", line={"color": TTFT}, yaxis="y", connectgaps=False))
    fig.add_trace(go.Scatter(x=t, y=[r["waiting"] for r in rows], name="waiting requests", yaxis="y2",
                             line={"color": KNEE}))
    fig.add_trace(go.Scatter(x=t, y=[r["running"] for r in rows], name="running requests", yaxis="y2",
                             line={"color": OFFERED}))
    fig.add_trace(go.Scatter(x=t, y=[r["kv_cache_percent"] for r in rows], name="KV cache %", yaxis="y3",
                             line={"color": ACHIEVED}, fill="tozeroy",
                             customdata=[r["preemptions"] for r in rows],
                             hovertemplate="%{y:.0f} %% (%{customdata:.0f} preemptions so far)"))
    fig.add_hline(y=KV_LIMIT, yref="y3", line={"dash": "dash", "color": KNEE, "width": 1},
                  annotation_text=f"{KV_LIMIT:.0f} %", annotation_position="top left")
    return figure_dict(fig)


def report_figures(report: dict) -> dict:
    """Every chart of a run's page, keyed by the element id it is drawn into."""
    figures = {
        "fig-throughput": throughput_figure(report),
        "fig-latency": latency_figure(report),
        "fig-errors": errors_figure(report),
        "fig-timeline": timeline_figure(report),
    }
    engine = engine_figure(report)
    if engine is not None:
        figures["fig-engine"] = engine
    return figures
