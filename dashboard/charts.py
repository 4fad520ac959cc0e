"""Plotly figures for the pages: built in Python, embedded as JSON, drawn by static/tracedash/charts.js.

A page passes ``figure_dict(fig)`` to the template and writes
``{{ fig|json_script:"fig-latency" }}<div class="chart" data-figure="fig-latency"></div>`` after
``{% include "charts/plotly_js.html" %}``. ``json_script`` escapes ``<``, ``>`` and ``&``, so
user-supplied names in traces or labels cannot break out of the script element.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go

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
