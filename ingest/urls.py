from django.urls import path

from . import openapi, views

app_name = "ingest"
urlpatterns = [
    path("api/v1/traces", views.traces_ingest, name="traces"),
    path("api/v1/resources", views.resources_ingest, name="resources"),
    path("api/v1/engine_samples", views.engine_samples_ingest, name="engine-samples"),
    path("api/v1/scores", views.scores_ingest, name="scores"),
    path("v1/traces", views.otlp_traces, name="otlp-traces"),
    # Where the Langfuse SDK (v3+) exports its OTLP spans under its host: the same endpoint.
    path("api/public/otel/v1/traces", views.otlp_traces, name="langfuse-otlp-traces"),
    path("v1/metrics", views.otlp_metrics, name="otlp-metrics"),
    path("v1/logs", views.otlp_logs, name="otlp-logs"),
    path("api/openapi.json", openapi.openapi_json, name="openapi"),
]
