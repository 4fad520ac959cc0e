"""The server-error handler (``handler500``): a metadata database that cannot be reached is an
outage, not a bug, so it answers a clear 503 (an HTML page, or JSON for API/JSON URLs) with
``Retry-After`` instead of Django's bare "Server Error (500)". Anything else stays a 500.

It renders without the database (no context processors, no ``request.user``): the failure may
be exactly that the database is gone."""

from __future__ import annotations

import sys

from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse
from django.utils.html import escape

DATABASE_DOWN = "The metadata database is unavailable. The page will work again when it returns; try again shortly."
RETRY_AFTER_SECONDS = 10


def _wants_json(request) -> bool:
    path = request.path
    if path.endswith(".json") or path.startswith(("/api/", "/v1/")):
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def server_error(request, *args, **kwargs):
    exc = sys.exc_info()[1]
    if isinstance(exc, DatabaseError):
        if _wants_json(request):
            response = JsonResponse({"error": {"code": "database_unavailable", "message": DATABASE_DOWN,
                                               "details": []}}, status=503)
        else:
            response = HttpResponse(
                "<!doctype html><html lang=\"en\"><head><title>Service unavailable (503)</title></head><body>"
                f"<h1>Service unavailable</h1><p>{escape(DATABASE_DOWN)}</p></body></html>",
                status=503, content_type="text/html; charset=utf-8")
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    if _wants_json(request):
        return JsonResponse({"error": {"code": "server_error", "message": "internal server error", "details": []}},
                            status=500)
    return HttpResponse("<!doctype html><html lang=\"en\"><head><title>Server Error (500)</title></head><body>"
                        "<h1>Server Error (500)</h1></body></html>", status=500, content_type="text/html; charset=utf-8")


def page_not_found(request, exception=None, *args, **kwargs):
    """``handler404``: API and JSON URLs get the API's JSON error (with a hint when the same path
    without its trailing slash exists), pages Django's own 404 page."""
    if not _wants_json(request):
        from django.views.defaults import page_not_found as django_page_not_found

        return django_page_not_found(request, exception)
    from django.urls import Resolver404, resolve

    path = request.path
    try:
        resolve(path)
        message = f"not found: {path[:200]}"  # the endpoint exists; what it names does not (or is not yours)
    except Resolver404:
        message = f"no such endpoint: {path[:200]}"
        if path.endswith("/") and len(path) > 1:
            try:
                resolve(path[:-1])
                message += f" (without the trailing slash: {path[:-1][:200]})"
            except Resolver404:
                pass
    return JsonResponse({"error": {"code": "not_found", "message": message, "details": []}}, status=404)
