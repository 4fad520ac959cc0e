"""API requests that carry a key, served straight from ASGI, past Django's page middleware.

Django's ASGI handler runs every request's middleware that is not async-native (sessions, CSRF,
authentication, messages, common, clickjacking: the page stack) through ``sync_to_async``, in a
thread it starts for that request and stops afterwards: about a dozen thread hand-offs and one
new thread per request. A request authenticated by its ingest key needs none of that middleware
(no session, no cookie, no CSRF, no HTML); for a 100-span batch the hand-offs cost more than
validating and storing the spans, and they are a fifth of a trace read by id.

``ApiFastPath`` therefore answers itself:

- ``POST`` to the (async) views marked ``@fast_path``: the ingestion endpoints;
- ``GET``/``HEAD`` *with an Authorization header* to the (sync) views marked
  ``@key_read_fast_path``: the JSON reads a key may make (a trace by id, the series). Without the
  header those requests use the browser session, so they go to Django.

It reads the body (``config.body_limit`` has already refused an oversized one), builds Django's own
``ASGIRequest``, applies what the middleware would have applied to such a request (the host check
of ``ALLOWED_HOSTS``, ``SecurityMiddleware``'s HTTPS redirect and headers), runs the view (a sync
one in Django's thread for sync code, with the connection checks of the request signals) and sends
its response. An exception in the view gets the project's ``handler500`` answer (a JSON 503 for a
lost metadata database), exactly as through Django. Everything else goes to Django unchanged.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import logging

from asgiref.sync import sync_to_async
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import JsonResponse
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, get_resolver, resolve
from django.utils.log import log_response

log = logging.getLogger("tracedash.ingest")

_RESOLVED_MAX = 256  # paths remembered (resolved once each); any path may arrive, so bounded
# Set while ApiFastPath serves a request: no request_started/finished signal runs for it, so
# database work checks the connection itself (db_call).
FAST_PATH = contextvars.ContextVar("tracedash_api_fast_path", default=False)


def fast_path(view):
    """Mark an async ingest view to be served by ``ApiFastPath`` (for POST)."""
    view.fast_path_methods = ("POST",)
    return view


def key_read_fast_path(view):
    """Mark a sync JSON view that reads with ``Authorization: Bearer <key>`` (and otherwise with
    the session) to be served by ``ApiFastPath`` for GET/HEAD requests that carry the header."""
    view.fast_path_methods = ("GET", "HEAD")
    return view


async def db_call(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` (ORM or other blocking work) in Django's thread for synchronous
    code. On the fast path it also does what Django's request signals do around a request: drop a
    connection that is broken or past ``CONN_MAX_AGE`` before, and after."""
    if not FAST_PATH.get():
        return await sync_to_async(fn)(*args, **kwargs)

    def run():
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return await sync_to_async(run)()


class ApiFastPath:
    def __init__(self, app):
        self.app = app
        self._resolved: dict[str, tuple] = {}
        # Its process_request/process_response only, as Django would apply them (it reads the
        # SECURE_* settings once, here, as Django's middleware chain does at start-up).
        self._security = SecurityMiddleware(lambda request: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            method = scope.get("method")
            if method == "POST" or (method in ("GET", "HEAD") and _has_authorization(scope)):
                view, kwargs = self._view(scope.get("path", ""))
                if view is not None and method in view.fast_path_methods:
                    return await self._serve(view, kwargs, scope, receive, send)
        return await self.app(scope, receive, send)

    def _view(self, path: str) -> tuple:
        """(view, URL kwargs) of a marked view, or (None, None)."""
        try:
            return self._resolved[path]
        except KeyError:
            pass
        try:
            match = resolve(path)
        except Resolver404:
            found = (None, None)
        else:
            found = (match.func, match.kwargs) if hasattr(match.func, "fast_path_methods") else (None, None)
        if not found[1] and len(self._resolved) < _RESOLVED_MAX:  # paths with ids (traces) are not kept
            self._resolved[path] = found
        return found

    async def _serve(self, view, kwargs, scope, receive, send) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        request = ASGIRequest(scope, io.BytesIO(b"".join(chunks)))
        FAST_PATH.set(True)  # this request's task only
        try:
            request.get_host()  # ALLOWED_HOSTS, as CommonMiddleware checks it
            response = self._security.process_request(request)  # SECURE_SSL_REDIRECT
            if response is None:
                if asyncio.iscoroutinefunction(view):
                    response = await view(request, **kwargs)
                else:
                    response = await db_call(view, request, **kwargs)
        except DisallowedHost as exc:
            response = JsonResponse({"error": {"code": "bad_host", "message": str(exc), "details": []}}, status=400)
        except Exception:  # noqa: BLE001 - the handler500 answer, as Django gives it (503 for a lost database)
            response = _server_error(request)  # renders without the database (config.errors), in the except block
        response = self._security.process_response(request, response)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path, response=response, request=request)
        await _send(response, send)


def _server_error(request):
    """``handler500``'s answer for the exception being handled (it reads ``sys.exc_info()``)."""
    log.error("API request failed: %s", request.path, exc_info=True)
    return get_resolver().resolve_error_handler(500)(request)


def _has_authorization(scope) -> bool:
    """A non-blank Authorization header: the views then authenticate by key and never read the
    session (which this path does not load)."""
    return any(name == b"authorization" and value.strip() for name, value in scope.get("headers") or ())


async def _send(response, send) -> None:
    """The response over ASGI. Not ``ASGIHandler.send_response``: that also closes the response in
    Django's sync thread (the request_finished signal, a thread hand-off per request); here the
    connection checks are ``db_call``'s. The body is whole, so it carries its Content-Length."""
    body = response.content
    headers = [(str(k).encode("ascii"), str(v).encode("latin1")) for k, v in response.items()]
    if not response.has_header("Content-Length"):
        headers.append((b"Content-Length", str(len(body)).encode("ascii")))
    for cookie in response.cookies.values():
        headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
