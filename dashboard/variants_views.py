"""/variants/ and /variants.json: values of one attribute side by side (analytics.variants,
docs/variants.md). Parameters: ``key`` (default ``llm.quantization``), ``value`` (repeated, two or
more; default the top values by requests in the window), and the filter bar's range/from/to,
service and model. Bad parameters: the page says what is wrong and shows the defaults; the JSON
answers 400 naming the parameter."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse

from analytics import panel_selectors, variants
from projects.scope import current_project
from store import StoreError

from .panels import _label_text, figure, figure_dict
from .views import STORE_DOWN, _json_error, _panel_filters, _project_page, json_login_required, log

MAX_NAME = 256


@dataclass(frozen=True)
class VariantsQuery:
    key: str
    values: list[str]  # as asked ([] = the top values)
    errors: tuple[str, ...]


def variants_query_from(query) -> VariantsQuery:
    errors: list[str] = []
    key = (query.get("key") or "").strip() or variants.DEFAULT_KEY
    if len(key) > MAX_NAME:
        errors.append(f"key is longer than {MAX_NAME} characters")
        key = variants.DEFAULT_KEY
    values: list[str] = []
    for raw in query.getlist("value"):
        v = raw.strip()
        if len(v) > MAX_NAME:
            errors.append(f"value is longer than {MAX_NAME} characters")
            continue
        if v and v not in values:
            values.append(v)
    if len(values) > variants.MAX_VALUES:
        errors.append(f"value: at most {variants.MAX_VALUES} values")
        values = []
    return VariantsQuery(key=key, values=values, errors=tuple(errors))


COLORS = ("#9aa5b1", "#3559e0", "#e07b35", "#2e9e5b", "#a235e0", "#c9a227", "#e0356e", "#35b8e0")


def variants_figures(result: variants.VariantsResult) -> dict[str, dict]:
    figs = {}
    dist = figure(height=360, hovermode="closest", showlegend=False, margin={"l": 56, "r": 16, "t": 48, "b": 40},
                  title={"text": "End-to-end latency per variant (a sample of its requests)", "x": 0, "font": {"size": 13}},
                  yaxis={"title": {"text": "ms"}, "rangemode": "tozero"})
    for i, v in enumerate(result.values):
        dist._add("box", y=result.e2e_samples_ms.get(v, []), name=_label_text(v), boxpoints=False,
                  marker={"color": COLORS[i % len(COLORS)]})
    figs["fig-variants-e2e"] = figure_dict(dist)
    means = [s for s in result.scores if s["data_type"] in ("numeric", "boolean")]
    if means:
        fig = figure(barmode="group", height=340, hovermode="closest", legend={"orientation": "h", "y": 1.12},
                     margin={"l": 56, "r": 16, "t": 64, "b": 40},
                     title={"text": "Score means (numeric) and share true (boolean, %) with 95 % intervals", "x": 0,
                            "font": {"size": 13}}, xaxis={"type": "category"})
        for i, v in enumerate(result.values):
            fig.add_bar(x=[_label_text(s["name"]) for s in means], y=[s["means"][i] for s in means],
                        error_y={"type": "data", "array": [s["half_widths"][i] for s in means], "visible": True},
                        name=_label_text(v), marker_color=COLORS[i % len(COLORS)])
        figs["fig-variants-scores"] = figure_dict(fig)
    return figs


def _build(project_id: int, bar, query: VariantsQuery, *, charts: bool = True) -> dict:
    window = bar.window
    args = {"project_id": project_id, "start": window.start, "end": window.end}
    reads = {"facets": lambda: panel_selectors.panel_facets(**args),
             "keys": lambda: variants.key_suggestions(**args)}
    if len(query.values) < 2:  # none: the top values; one: it is the baseline, against the top others
        reads["top"] = lambda: variants.top_values(**args, key=query.key, service=bar.service, model=bar.model)
    r = panel_selectors.reads_concurrently(**reads)
    values = list(query.values)
    if len(values) < 2:
        values += [v for v in r["top"] if v not in values][:variants.DEFAULT_TOP - len(values)]
    result = variants.variants_compare(**args, key=query.key, values=values if len(values) >= 2 else [],
                                       service=bar.service, model=bar.model)
    return {"result": result, "facets": r["facets"], "keys": r["keys"], "found": values,
            "figures": variants_figures(result) if charts and not result.empty else {}}


def _errors(bar, query) -> list[str]:
    return [*bar.errors, *query.errors]


@login_required
def variants_page(request):
    bar, _ = _panel_filters(request)
    query = variants_query_from(request.GET)
    return _project_page(request, "dashboard/variants.html", "panel", lambda pid: _build(pid, bar, query),
                         filters=bar, query=query, errors=_errors(bar, query))


@json_login_required
def variants_json(request):
    """GET /variants.json?key=llm.quantization&value=fp16&value=int8&range=24h — each figure per
    value with its difference from the first value, 95 % interval, p-value and verdict."""
    project = current_project(request)
    if project is None:
        return _json_error(404, "no_project", "you are not a member of any project")
    bar, _ = _panel_filters(request)
    query = variants_query_from(request.GET)
    errors = _errors(bar, query)
    if errors:
        return _json_error(400, "invalid_variants", "; ".join(errors))
    try:
        data = _build(project.pk, bar, query, charts=False)
    except StoreError as exc:
        log.error("variants failed: %s", exc)
        return _json_error(503, "store_unavailable", STORE_DOWN)
    result = data["result"]
    return JsonResponse({
        "project_id": project.pk, "key": result.key, "values": result.values, "baseline": result.values[0] if result.values else None,
        "start": bar.window.start.isoformat(), "end": bar.window.end.isoformat(), "service": bar.service,
        "multiple_comparisons": "holm" if result.corrected else None,
        "verdict": ("no values" if result.empty else
                    "significant differences" if result.any_significant else "no significant difference"),
        "figures": [f.as_dict() for f in result.figures],
        "scores": [{"name": s["name"], "data_type": s["data_type"], "counts": s["counts"],
                    "distributions": s["distributions"], "figures": [f.as_dict() for f in s["figures"]]}
                   for s in result.scores],
        "hosts": result.hosts, "sample_cap": variants.SAMPLE_CAP,
    })
