"""The server-error handler (``handler500``): a metadata database that cannot be reached (a lost
or refused connection, a locked embedded database) is an outage, not a bug, so it answers a clear
503 (an HTML page, or JSON for API/JSON URLs) with ``Retry-After`` instead of Django's bare
"Server Error (500)". A database that is up and refused what the request asked for is no outage:
an ``IntegrityError``/``DataError`` (a duplicate, a missing required value, a value too long)
answers 400, and a ``ProgrammingError``/``NotSupportedError`` (a bug) a plain 500. Anything else
stays a 500.

It renders without the database (no context processors, no ``request.user``): the failure may
be exactly that the database is gone."""

from __future__ import annotations

import sys

from django.db import DatabaseError, DataError, IntegrityError, InterfaceError, NotSupportedError, ProgrammingError
from django.http import HttpResponse, JsonResponse
from django.utils.html import escape

DATABASE_DOWN = "The metadata database is unavailable. The page will work again when it returns; try again shortly."
RETRY_AFTER_SECONDS = 10
REFUSED = ("The request was refused: it conflicts with data already stored (for example a name that must be "
           "unique) or leaves out a required value. Go back, correct it and try again.")

# Errors from a database that answered: the request (or the code) is at fault, not the connection.
NOT_AN_OUTAGE = (IntegrityError, DataError, ProgrammingError, NotSupportedError)


def _wants_json(request) -> bool:
    path = request.path
    if path.endswith(".json") or path.startswith(("/api/", "/v1/")):
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def is_database_outage(exc: BaseException | None) -> bool:
    """True for a database that cannot be reached or used right now (a 503), False for errors the
    database raised about the request itself (integrity, data, SQL) and for everything else."""
    return isinstance(exc, (DatabaseError, InterfaceError)) and not isinstance(exc, NOT_AN_OUTAGE)


def server_error(request, *args, **kwargs):
    exc = sys.exc_info()[1]
    if isinstance(exc, (IntegrityError, DataError)):
        if _wants_json(request):
            return JsonResponse({"error": {"code": "conflict", "message": REFUSED, "details": []}}, status=400)
        return HttpResponse(
            "<!doctype html><html lang=\"en\"><head><title>Bad request (400)</title></head><body>"
            f"<h1>Bad request</h1><p>{escape(REFUSED)}</p></body></html>",
            status=400, content_type="text/html; charset=utf-8")
    if is_database_outage(exc):
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
        if request.path.startswith("/traces/"):  # e.g. /traces/a/b/: the trace page's own in-app 404
            from django.shortcuts import render

            asked = request.path[len("/traces/"):].strip("/")
            request.GET = request.GET.copy()  # the layout's project: the user's own, whatever ?project= says
            request.GET.pop("project", None)
            return render(request, "dashboard/trace_not_found.html",
                          {"trace_id": asked[:200], "truncated": len(asked) > 200, "malformed": True}, status=404)
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
