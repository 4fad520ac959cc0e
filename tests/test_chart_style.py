"""Honest units on every panel figure (charts.style_figure): each hover and axis says its
unit, money is money, the latency heatmap's densest cells are its darkest, and firing-alert
markers on the resource charts are folded (a small marker, the rule names in its hover)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from charts import HEATMAP_COLORSCALE, mark_alerts, style_figure, unit_of
from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

S = 10**9


def _luminance(hex_color: str) -> float:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _saturation(hex_color: str) -> float:
    rgb = [int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return (max(rgb) - min(rgb)) / max(rgb)


def test_heatmap_colourscale_makes_the_highest_counts_the_darkest_and_most_saturated():
    stops = [color for _, color in HEATMAP_COLORSCALE]
    assert [pos for pos, _ in HEATMAP_COLORSCALE] == sorted(pos for pos, _ in HEATMAP_COLORSCALE)
    lum = [_luminance(c) for c in stops]
    assert lum == sorted(lum, reverse=True) and lum[-1] == min(lum)  # darker at every step up
    assert _saturation(stops[-1]) == max(_saturation(c) for c in stops)
    assert lum[0] < 0.95  # a cell with one request is still visible on the white page
    fig = style_figure({"data": [{"type": "heatmap", "z": [[1, 9]], "colorscale": "Blues"}], "layout": {}})
    assert fig["data"][0]["colorscale"] == HEATMAP_COLORSCALE and fig["data"][0]["zmin"] == 0
    assert fig["data"][0]["zmax"] == 9  # the densest cell sits at the scale's dark end
    assert "requests" in fig["data"][0]["hovertemplate"]


@pytest.mark.parametrize("title, unit", [("ms", "ms"), ("error rate %", "%"), ("requests/s", "req/s"),
                                         ("tokens/s", "tokens/s"), ("tokens", "tokens"), ("USD", "$"),
                                         ("USD per 1k tokens", "$"), ("°C", "°C"), ("MiB", "MiB"),
                                         ("mean in flight", "in flight"), ("per minute", "per minute"),
                                         ("E2E", None)])
def test_axis_titles_name_their_unit(title, unit):
    assert unit_of(title) == unit


def test_hovers_carry_the_unit_and_money_axes_read_dollars():
    fig = style_figure({
        "data": [{"type": "scatter", "name": "P95", "y": [1.5, None]},
                 {"type": "scatter", "name": "cost", "yaxis": "y2", "y": [0.0042, 1234.5]}],
        "layout": {"yaxis": {"title": {"text": "ms"}}, "yaxis2": {"title": {"text": "USD per request"}}}})
    latency, cost = fig["data"]
    assert latency["hovertemplate"].endswith(" ms<extra></extra>")
    assert cost["hovertext"] == ["$0.0042", "$1,234.50"] and "%{hovertext}" in cost["hovertemplate"]
    assert fig["layout"]["yaxis2"]["tickprefix"] == "$" and fig["layout"]["yaxis2"]["exponentformat"] == "none"
    assert "tickprefix" not in fig["layout"]["yaxis"]


def test_alert_markers_are_folded_with_the_details_in_the_hover():
    since = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    alerts = [{"rule": "GPU memory ≥ 85 %", "since": since.isoformat()},
              {"rule": "<b>hot</b>", "since": since.isoformat()},
              {"rule": "Host CPU > 70 %", "since": (since + timedelta(seconds=20)).isoformat()},
              {"rule": "never fired"}]
    fig = {"data": [], "layout": {}}
    mark_alerts(fig, alerts)
    notes = fig["layout"]["annotations"]
    assert len(notes) == 2 and len(fig["layout"]["shapes"]) == 2  # one marker per start time
    for note in notes:
        assert "firing" not in note["text"] and len(note["text"].replace('<a href="/alerts/">', "").replace("</a>", "")) <= 2
    first = next(n for n in notes if n["x"] == "2026-12-01 09:00:00")
    assert first["text"] == '<a href="/alerts/">⚑2</a>'
    assert "GPU memory ≥ 85 %" in first["hovertext"] and "&lt;b&gt;hot&lt;/b&gt;" in first["hovertext"]
    assert "<b>hot" not in first["hovertext"]


@pytest.mark.clickhouse
@pytest.mark.django_db
def test_overview_and_costs_json_figures_say_their_units(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    now = time.time_ns()
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=now - (20 - i) * 60 * S) for i in range(5)])
    client.force_login(user)
    for path in ("/overview.json?range=1h", "/costs.json?range=1h"):
        figures = client.get(path).json()["figures"]
        for fid, fig in figures.items():
            for trace in fig["data"]:
                template = trace.get("hovertemplate", "")
                assert template, (path, fid, trace.get("name"))
                assert any(u in template for u in (" ms", " %", " req/s", " tokens", " requests", " in flight", "%{hovertext}")), \
                    (path, fid, trace.get("name"), template)
    heat = client.get("/overview.json?range=1h").json()["figures"]["fig-heatmap"]["data"][0]
    assert heat["colorscale"] == HEATMAP_COLORSCALE
    spend = client.get("/costs.json?range=1h").json()["figures"]["fig-spend"]
    assert spend["layout"]["yaxis"]["tickprefix"] == "$"
    assert all(text.startswith("$") for t in spend["data"] for text in t["hovertext"] if text)
