"""``{% kpi_traces_url k filters %}``: the explorer URL of the traces behind an overview tile —
the page's own range and filters, plus what the figure is about (error rate: the error traces;
a latency percentile: the traces at or above it, slowest first; a TTFT percentile: TTFT at or
above it; cost: the dearest first). ``kpi_traces_link`` builds it, for the page and for
/overview.json alike."""

from __future__ import annotations

from urllib.parse import urlencode

from django import template

from dashboard.explorer import STATUSES
from dashboard.panels import _at_least

register = template.Library()

KEPT = ("range", "from", "to", "service", "model", "project")  # the page's scope, as the explorer reads it


def kpi_query(key: str, value) -> dict[str, str]:
    """The explorer parameters a tile adds to the page's scope."""
    if key in ("error_rate", "availability"):
        return {"status": "error"}
    if key == "recovered" and "recovered" in STATUSES:
        return {"status": "recovered"}
    if key.startswith("e2e_p"):
        return {"sort": "duration", "dir": "desc", **({"min_ms": _at_least(value)} if value is not None else {})}
    if key.startswith("ttft_p"):
        return {"sort": "ttft", "dir": "desc", **({"ttft_ms": _at_least(value)} if value is not None else {})}
    if key.startswith("cost"):
        return {"sort": "cost", "dir": "desc"}
    return {}


def kpi_traces_link(key: str, value, page_params: dict) -> str:
    """The explorer URL of a tile: the page's scope (``page_params``, the filter bar's parameters)
    and the tile's own filter. The one builder of these links: the page's tag below and the
    overview JSON's ``traces_url`` of each tile (which the live page puts in the tile's link)."""
    params = {k: v for k, v in page_params.items() if k in KEPT and v}
    params.update(kpi_query(key, value))
    return "/traces/?" + urlencode(params, doseq=True)


@register.simple_tag
def kpi_traces_url(kpi, filters) -> str:
    return kpi_traces_link(kpi.key, kpi.value, filters.params)
