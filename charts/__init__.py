"""The one plotly look shared by every page — dashboard, alerts (the rule preview) and load tests:
figures built in Python, embedded as JSON, drawn by static/tracedash/charts.js. A package of its
own so that alerts and load tests draw charts without importing the dashboard.

A page passes ``figure_dict(fig)`` to the template and writes
``{{ fig|json_script:"fig-latency" }}<div class="chart" data-figure="fig-latency"></div>`` after
``{% include "charts/plotly_js.html" %}``. ``json_script`` escapes ``<``, ``>`` and ``&``, so
user-supplied names in traces or labels cannot break out of the script element.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import plotly.graph_objects as go

from .money import money_signed_text, money_text  # noqa: F401 - money_signed_text: for importers of charts

# Phase colours, shared by every chart and the waterfall so a phase looks the same everywhere.
PHASE_COLORS = {
    "network": "#4e79a7",
    "preprocess": "#f28e2b",
    "inference": "#e15759",
    "postprocess": "#76b7b2",
    "other": "#bab0ac",
}

BASE_LAYOUT = {
    "margin": {"l": 56, "r": 16, "t": 36, "b": 40},
    "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
    "paper_bgcolor": "rgba(0,0,0,0)",
    "plot_bgcolor": "rgba(0,0,0,0)",
    "hovermode": "x unified",
    "legend": {"orientation": "h", "y": -0.2},
}


def figure(**layout) -> go.Figure:
    """A figure with the product's base layout; ``layout`` overrides or extends it."""
    fig = go.Figure()
    fig.update_layout(**{**BASE_LAYOUT, **layout})
    return fig


def figure_dict(fig: go.Figure) -> dict:
    """Plain JSON-ready dict (plotly's own encoder handles numpy arrays and datetimes)."""
    return json.loads(fig.to_json())


def threshold_line(fig: go.Figure, *, y: float, label: str, color: str = "#b00020") -> None:
    """A dashed horizontal reference line (85 % GPU memory, P95 1500 ms, …) with its label."""
    fig.add_hline(y=y, line={"dash": "dash", "color": color, "width": 1},
                  annotation_text=label, annotation_position="top left")


# --- one look for every panel figure: units in tooltips and axes, money, heatmap, alert markers ---
# The panel figures (dashboard.panels) are plain dicts; ``style_figure`` finishes each one, reading
# the unit from its axis title, so a figure says its unit the same way on the page and in the JSON
# the live pages redraw from.

# Light to dark: the most requests are the darkest, most saturated cell; one request is still a
# visible pale blue (plotly's named "Blues" runs the other way, dark to light).
HEATMAP_COLORSCALE = [[0.0, "#dbe9f6"], [0.25, "#9ecae1"], [0.5, "#4292c6"], [0.75, "#2171b5"], [1.0, "#08306b"]]
MONEY = "$"

# unit → (d3 number format for hovers, suffix after the number)
UNIT_FORMATS = {
    "ms": (",.1f", " ms"),
    "%": (".1f", " %"),
    "req/s": (",.3~f", " req/s"),
    "tokens/s": (",.2f", " tokens/s"),
    "tokens": (",.0f", " tokens"),
    "requests": (",.0f", " requests"),
    "in flight": (",.2f", " in flight"),
    "°C": (".0f", " °C"),
    "W": (",.0f", " W"),
    "MiB": (",.1f", " MiB"),
    "per minute": (",.2f", " per minute"),
}


def unit_of(title: str) -> str | None:
    """The unit an axis title names ("ms", "error rate %", "USD per request" → "$", "requests/s" → "req/s")."""
    text = (title or "").strip()
    lowered = text.lower()
    if lowered.startswith(("usd", "$")):
        return MONEY
    if text.endswith("%"):
        return "%"
    if lowered == "ms" or lowered.endswith((" ms", "(ms)")):
        return "ms"
    if lowered in ("requests/s", "req/s", "rps"):
        return "req/s"
    if lowered == "mean in flight":
        return "in flight"
    return text if text in UNIT_FORMATS else None


def _title(axis: dict) -> str:
    title = (axis or {}).get("title")
    return title.get("text", "") if isinstance(title, dict) else str(title or "")


def _axis_key(trace: dict) -> str:
    ref = trace.get("yaxis") or "y"
    return "yaxis" + ref[1:]


def style_figure(fig: dict) -> dict:
    """Units in every hover and axis, money as money, the heatmap's densest cells darkest. In place; returns ``fig``."""
    layout = fig.setdefault("layout", {})
    for trace in fig.get("data", []):
        if trace.get("type") == "heatmap":
            trace["colorscale"] = HEATMAP_COLORSCALE
            # From 0 (plotly wants zmin and zmax together): one request is pale, never the scale's floor colour
            # for the smallest count on the chart, and the densest cell is the darkest.
            counts = [v for row in trace.get("z") or [] for v in (row or []) if v is not None]
            trace.setdefault("zmin", 0)
            trace.setdefault("zmax", max(counts) if counts else 1)
            trace["hovertemplate"] = "%{x}<br>%{y}: %{z:,} requests<extra></extra>"
            continue
        unit = unit_of(_title(layout.get(_axis_key(trace), {})))
        if unit is None or "hovertemplate" in trace:
            continue
        category = (layout.get("xaxis") or {}).get("type") == "category"
        label = "%{x}" if category else "%{fullData.name}"
        if unit == MONEY:
            trace["hovertext"] = [None if v is None else money_text(v) for v in trace.get("y") or []]
            trace["hovertemplate"] = label + ": %{hovertext}<extra></extra>"
        else:
            number, suffix = UNIT_FORMATS[unit]
            trace["hovertemplate"] = label + ": %{y:" + number + "}" + suffix + "<extra></extra>"
    for key, axis in list(layout.items()):
        if key.startswith("yaxis") and isinstance(axis, dict) and unit_of(_title(axis)) == MONEY:
            # "$0.0004", never plotly's SI "400µ"; thousands separated
            layout[key] = {**axis, "tickprefix": "$", "exponentformat": "none", "separatethousands": True}
    return fig


def plotly_text(text) -> str:
    """Plotly renders a little HTML in trace names, annotations and hover text (``<b>``, ``<a href>``,
    entities); a rule name, a model name or a scraped URL is the user's: escape it, so it shows as written."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


ALERT_COLOR = "#b00020"


def mark_alerts(fig: dict, alerts) -> None:
    """A dotted vertical line where firing alerts started, and at its top one small marker (⚑, with
    a count when several started together) linking to /alerts/: no text that could run into the
    next marker; which rules fired, and since when, is in the marker's hover."""
    layout = fig.setdefault("layout", {})
    groups: dict[str, list[str]] = {}
    for alert in alerts:
        since = alert.get("since")
        if not since:
            continue
        x = datetime.fromisoformat(since).astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # the charts' UTC form
        groups.setdefault(x, []).append(plotly_text(alert.get("rule") or "alert"))
    if not groups:
        return
    shapes, notes = layout.setdefault("shapes", []), layout.setdefault("annotations", [])
    for x, rules in groups.items():
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": ALERT_COLOR, "width": 1, "dash": "dot"}})
        glyph = "⚑" if len(rules) == 1 else f"⚑{len(rules)}"
        notes.append({"xref": "x", "yref": "paper", "x": x, "y": 1, "showarrow": False, "xanchor": "center",
                      "yanchor": "top", "font": {"color": ALERT_COLOR, "size": 11}, "name": "alert-marker",
                      "text": f'<a href="/alerts/">{glyph}</a>',
                      "hovertext": f"firing since {x} UTC:<br>" + "<br>".join(rules),
                      "hoverlabel": {"bgcolor": "#fff", "bordercolor": ALERT_COLOR}})

