"""tracedash's Python SDK: instruments apps without importing Django.

Only the package exists so far; the tracer, exporter and streaming helpers arrive with the
Instrumentation issue. Until then, send spans to ``POST /api/v1/traces`` (README) or use any
OpenTelemetry exporter once the OTLP endpoint lands.
"""
