"""The Content-Security-Policy header on every response.

Scripts only from this server (no inline ``<script>`` bodies, no ``on*=`` attributes, no eval):
page behaviour lives in ``static/tracedash/*.js`` and takes its values from ``data-*`` attributes;
chart data travels in ``<script type="application/json">`` blocks, which are data, not script.
Styles allow ``'unsafe-inline'`` because plotly.js writes its styles into the page at run time.
Websockets (``connect-src 'self'``) are the same origin. Nothing loads from another host.

Both sync- and async-capable, so ASGI requests (ingest included) take no thread hop here.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])
HEADER = "Content-Security-Policy"


class ContentSecurityPolicyMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return self._add(self.get_response(request))

    async def __acall__(self, request):
        return self._add(await self.get_response(request))

    @staticmethod
    def _add(response):
        if HEADER not in response:
            response[HEADER] = POLICY
        return response
