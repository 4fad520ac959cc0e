"""Refuse oversized ingest bodies before Django reads them.

Django's ASGI handler reads a whole body (to memory, then a temporary file) before any view runs,
so a view cannot stop a multi-gigabyte upload. This wrapper answers 413 at once when
``Content-Length`` is over the limit, and for bodies without one it reads at most the limit
(plus one byte) before deciding.
"""

from __future__ import annotations

import json

INGEST_PREFIXES = ("/api/", "/v1/")


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes):
        self.app = app
        self.max_bytes = max_bytes  # int, or a callable returning it (settings may change in tests)

    def _limit(self) -> int:
        return self.max_bytes() if callable(self.max_bytes) else self.max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(INGEST_PREFIXES) or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        limit = self._limit()
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_large = int(length) > limit
            except ValueError:
                return await _error(send, 400, "bad_content_length", "Content-Length is not a number")
            if too_large:
                return await _too_large(send, limit)
            return await self.app(scope, receive, send)
        # No Content-Length (chunked): buffer up to the limit, then hand Django a replay.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return await _too_large(send, limit)
            chunks.append(body)
            if not message.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay_receive():
            return replay.pop() if replay else await receive()

        return await self.app(scope, replay_receive, send)


async def _too_large(send, limit):
    await _error(send, 413, "body_too_large", f"request body is larger than {limit} bytes")


async def _error(send, status, code, message):
    body = json.dumps({"error": {"code": code, "message": message, "details": []}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
