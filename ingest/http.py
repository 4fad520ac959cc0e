"""JSON error responses shared by every API view: ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import zlib

from django.http import JsonResponse


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, details: list | None = None, headers: dict | None = None):
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        self.headers = headers or {}
        super().__init__(message)

    def response(self) -> JsonResponse:
        body = {"error": {"code": self.code, "message": self.message, "details": self.details}}
        response = JsonResponse(body, status=self.status)
        for key, value in self.headers.items():
            response[key] = value
        return response


def read_body(request, *, max_bytes: int) -> bytes:
    """The request body, gunzipped when ``Content-Encoding: gzip``, refusing anything larger than
    ``max_bytes`` before or after inflating (a gzip bomb is stopped without inflating it whole)."""
    length = request.META.get("CONTENT_LENGTH")
    if length:
        try:
            if int(length) > max_bytes:
                raise ApiError(413, "body_too_large", f"request body is larger than {max_bytes} bytes")
        except ValueError:
            raise ApiError(400, "bad_content_length", "Content-Length is not a number") from None
    body = request.body
    if len(body) > max_bytes:
        raise ApiError(413, "body_too_large", f"request body is larger than {max_bytes} bytes")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise ApiError(415, "unsupported_encoding", f"Content-Encoding {encoding!r} is not supported; use gzip or none")
    return _gunzip(body, max_bytes)


def _gunzip(body: bytes, max_bytes: int) -> bytes:
    """Inflate every member of a gzip stream (RFC 1952 allows several), never more than
    ``max_bytes`` in all; trailing bytes that are not a gzip member are an error."""
    out, size, rest = [], 0, body
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            data = inflater.decompress(rest, max_bytes - size + 1)
        except zlib.error as exc:
            raise ApiError(400, "bad_gzip", f"body is not valid gzip: {exc}") from None
        size += len(data)
        if size > max_bytes or inflater.unconsumed_tail:
            raise ApiError(413, "body_too_large", f"decompressed body is larger than {max_bytes} bytes")
        if not inflater.eof:
            raise ApiError(400, "bad_gzip", "gzip body is truncated")
        out.append(data)
        rest = inflater.unused_data
        if not rest:
            return b"".join(out)


__all__ = ["ApiError", "read_body"]
