"""The panel figures' pure parts: the figure script element, explorer links, latency bands."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlparse

from django.utils.html import json_script

from dashboard.panels import _bands, _links, traces_link
from dashboard.templatetags.panel_tags import figure_script

HOSTILE = '</script><script>alert(1)</script> & <!-- "q" \u2028'


def test_figure_script_escapes_like_json_script_and_round_trips():
    figure = {"data": [{"name": HOSTILE, "customdata": ["/traces/?service=" + HOSTILE]}], "layout": {}}
    html = str(figure_script(figure, "fig-x"))
    assert html.startswith('<script id="fig-x" type="application/json">') and html.endswith("</script>")
    body = html[len('<script id="fig-x" type="application/json">'):-len("</script>")]
    assert "<" not in body and ">" not in body and "&" not in body
    assert json.loads(body) == figure
    reference = str(json_script(figure, "fig-x"))
    reference_body = re.search(r">(.*)</script>$", reference, re.S).group(1)
    assert json.loads(reference_body) == json.loads(body)


def test_bucket_links_keep_filters_and_the_bucket():
    t = datetime(2026, 11, 30, 6, 0, tzinfo=timezone.utc)
    filters = {"service": "a b&c", "model": ""}
    links = _links([t, t + timedelta(seconds=30)], 30, filters)
    assert links[0] == traces_link(start=t, end=t + timedelta(seconds=30), filters=filters)
    query = parse_qs(urlparse(links[1]).query)
    assert query == {"from": ["2026-11-30T06:00:30Z"], "to": ["2026-11-30T06:01:00Z"], "service": ["a b&c"]}


def test_latency_bands_match_the_histogram_edges():
    assert _bands((10, 20, 50)) == [{"max_ms": "10"}, {"min_ms": "10", "max_ms": "20"},
                                    {"min_ms": "20", "max_ms": "50"}, {"min_ms": "50"}]
