"""Native ingestion API: ``POST /api/v1/traces``."""

from __future__ import annotations

import json

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from store import StoreError, StoreUnavailable

from .auth import authenticate_request
from .http import ApiError, read_body
from .schemas import FieldError, Limits, parse_span
from .services import spans_ingest


def _limits() -> Limits:
    return Limits(
        max_attributes=settings.TRACEDASH_INGEST_MAX_ATTRIBUTES,
        max_key_bytes=settings.TRACEDASH_INGEST_MAX_KEY_BYTES,
        max_value_bytes=settings.TRACEDASH_INGEST_MAX_VALUE_BYTES,
    )


def _json_payload(request) -> dict:
    content_type = request.content_type or ""
    if content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", f"expected Content-Type application/json, got {content_type or 'none'!r}")
    body = read_body(request, max_bytes=settings.TRACEDASH_INGEST_MAX_BODY_BYTES)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_utf8", f"body is not valid UTF-8 (byte {exc.start})") from None
    try:
        payload = json.loads(text)
    except RecursionError:
        raise ApiError(400, "invalid_json", "JSON is nested too deeply") from None
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "invalid_payload", 'expected a JSON object like {"spans": [...]}')
    return payload


@csrf_exempt
def traces_ingest(request):
    try:
        if request.method != "POST":
            raise ApiError(405, "method_not_allowed", "use POST", headers={"Allow": "POST"})
        key = authenticate_request(request)
        payload = _json_payload(request)
        spans = payload.get("spans")
        if not isinstance(spans, list):
            raise ApiError(400, "invalid_payload", '"spans" must be a list of span objects',
                           details=[{"field": "spans", "message": "missing or not a list"}])
        if len(spans) > settings.TRACEDASH_INGEST_MAX_SPANS:
            raise ApiError(413, "too_many_spans", f"at most {settings.TRACEDASH_INGEST_MAX_SPANS} spans per request, got {len(spans)}")
        limits = _limits()
        rows, rejected = [], []
        for index, span in enumerate(spans):
            try:
                rows.append(parse_span(span, project_id=key.project_id, limits=limits))
            except FieldError as exc:
                rejected.append({"index": index, "field": exc.field, "message": exc.message})
        if rejected and not rows:
            raise ApiError(400, "invalid_spans", f"all {len(rejected)} span(s) were rejected", details=rejected)
        try:
            accepted = spans_ingest(project_id=key.project_id, rows=rows)
        except StoreUnavailable as exc:
            raise ApiError(503, "store_unavailable", "the trace store is unavailable; retry later",
                           headers={"Retry-After": "5"}) from exc
        except StoreError as exc:
            raise ApiError(503, "store_error", "the trace store could not accept the spans; retry later",
                           headers={"Retry-After": "5"}) from exc
        return JsonResponse({"accepted": accepted, "rejected": rejected})
    except ApiError as exc:
        return exc.response()
