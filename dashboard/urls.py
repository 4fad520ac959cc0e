from django.urls import path, re_path

from . import explorer_views, score_views, series_api, trace_views, variants_views, views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="home"),
    path("overview.json", views.overview_json, name="overview-json"),
    path("costs/", views.costs, name="costs"),
    path("costs.json", views.costs_json, name="costs-json"),
    path("compare/", views.compare, name="compare"),
    path("compare.json", views.compare_json, name="compare-json"),
    path("variants/", variants_views.variants_page, name="variants"),
    path("variants.json", variants_views.variants_json, name="variants-json"),
    path("traces/", explorer_views.traces_explorer, name="traces"),
    path("traces/rows.json", explorer_views.traces_explorer_json, name="traces-rows"),
    path("traces/compare/", trace_views.trace_compare, name="trace-compare"),
    # Any one path segment: a malformed id gets the trace page's in-app "not found", not a bare 404.
    re_path(r"^traces/(?P<trace_id>[^/]+)/$", trace_views.trace_page, name="trace"),
    path("traces/<str:trace_id>/scores/", score_views.trace_review, name="trace-review"),
    path("api/v1/traces/<str:trace_id>", trace_views.trace_api, name="trace-api"),
    path("api/v1/series/overview", series_api.overview, name="series-overview"),
    path("api/v1/series/latency", series_api.latency, name="series-latency"),
    path("api/v1/series/costs", series_api.costs, name="series-costs"),
    path("api/v1/series/compare", series_api.compare, name="series-compare"),
    path("resources/", views.resources_latest, name="resources"),
    path("settings/", views.project_settings, name="settings"),
    path("resources/series.json", views.resources_series_json, name="resources-series"),
    path("engines/", views.engines_page, name="engines"),
    path("engines/series.json", views.engines_series_json, name="engines-series"),
]
