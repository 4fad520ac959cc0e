"""Ingestion endpoints: native JSON (``/api/v1/traces``, ``/api/v1/resources``,
``/api/v1/engine_samples``) and OTLP/HTTP
(``/v1/traces``, ``/v1/metrics``, ``/v1/logs``; ``/api/public/otel/v1/traces`` too, where the Langfuse SDK sends).

Views are async so that requests waiting for the group commit do not hold a thread: parsing runs
on the event loop, the write is awaited (``ingest.writer``), and the key is answered from the
process's memory of checked keys (``projects.keycache``); only a key not checked recently goes to
a thread for the database (Django's ORM is synchronous).
"""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from . import otlp
from config.fast_path import fast_path
from store import Columns, column_values
from .auth import authenticate_request_async
from .http import ApiError, read_body
from .parse_pool import parse_pool
from .ratelimit import limiter, retry_after_header
from .schemas import (EnvelopeError, FieldError, Limits, SamplesIn, TooManyItems, decode_envelope, parse_each,
                      parse_span_columns)
from .scores import ScoresIn, has_score_keys, span_score_rows
from .services import (ENGINE_SAMPLES, RESOURCE_SAMPLES, SampleKind, samples_store_async, samples_validate,
                       scores_store_async, scores_validate, traces_notify_async)
from .spool import SpoolFull
from .writer import Overloaded, get_writer

log = logging.getLogger("tracedash.ingest")

JSON = "application/json"
PROTOBUF = "application/x-protobuf"


def _limits() -> Limits:
    return Limits.from_settings(settings)


async def _begin(request, content_types: tuple[str, ...]):
    """Method, key and body checks shared by every endpoint: (key, content type, body)."""
    if request.method != "POST":
        raise ApiError(405, "method_not_allowed", "use POST", headers={"Allow": "POST"})
    key = await authenticate_request_async(request)
    content_type = request.content_type or ""
    if content_type not in content_types:
        raise ApiError(415, "unsupported_media_type",
                       f"expected Content-Type {' or '.join(content_types)}, got {content_type or 'none'!r}")
    body = read_body(request, max_bytes=settings.TRACEDASH_INGEST_MAX_BODY_BYTES)
    if content_type == JSON:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(400, "invalid_utf8", f"body is not valid UTF-8 (byte {exc.start})") from None
    return key, content_type, body


def _too_many(count: int, noun: str) -> ApiError:
    return ApiError(413, "too_many_items", f"at most {settings.TRACEDASH_INGEST_MAX_SPANS} {noun} per request, got {count}")


def _admit(key, count: int, noun: str) -> None:
    """Count and rate limits for a batch of ``count`` items."""
    if count > settings.TRACEDASH_INGEST_MAX_SPANS:
        raise _too_many(count, noun)
    bucket = limiter()
    if bucket is not None:
        wait = bucket.take(key.pk, max(count, 1))
        if wait:
            raise ApiError(429, "rate_limited",
                           f"this key may send {settings.TRACEDASH_INGEST_RATE_LIMIT} {noun}/s; retry later",
                           headers={"Retry-After": retry_after_header(wait)})


async def _write(table: str, rows: list) -> None:
    """Rows are acknowledged once in ClickHouse or in the fsync'd spool; else a 503."""
    if rows:
        await _stored(get_writer().submit_async(table, rows))


async def _stored(write) -> None:
    """Await ``write`` (rows handed to the writer); the writer's refusals become a 503."""
    try:
        await write
    except Overloaded as exc:
        raise ApiError(503, "overloaded", f"the server is busy ({exc}); retry later", headers={"Retry-After": "1"}) from exc
    except SpoolFull as exc:
        log.error("ingest refused: %s", exc)
        where = "the disk under the local spool is full" if get_writer().spool.disk_full else "the local spool is full"
        raise ApiError(503, "spool_full", f"the trace store is unavailable and {where}; retry later",
                       headers={"Retry-After": "30"}) from exc
    except Exception as exc:  # noqa: BLE001 - StoreError, a full disk, anything: never a 500
        log.exception("ingest write failed")
        raise ApiError(503, "store_unavailable", "the trace store could not accept the data; retry later",
                       headers={"Retry-After": "5"}) from exc


def _envelope_error(exc: EnvelopeError, name: str) -> ApiError:
    return ApiError(400, exc.code, exc.message,
                    details=[{"field": name, "message": "missing or not a list"}] if exc.code == "invalid_payload" else [])


def _all_rejected(rows: list, rejected: list, name: str) -> None:
    if rejected and not rows:
        raise ApiError(400, f"invalid_{name}", f"all {len(rejected)} {name} were rejected", details=rejected)


@fast_path
@csrf_exempt
async def traces_ingest(request):
    try:
        key, _, body = await _begin(request, (JSON,))
        try:
            pool = parse_pool(settings.TRACEDASH_INGEST_PARSE_PROCESSES)
            if pool is not None:
                rows, rejected = await pool.parse(body, project_id=key.project_id, limits=_limits(),
                                                  max_items=settings.TRACEDASH_INGEST_MAX_SPANS)
            else:
                rows, rejected = parse_span_columns(body, project_id=key.project_id, limits=_limits(),
                                                    max_items=settings.TRACEDASH_INGEST_MAX_SPANS)
        except EnvelopeError as exc:
            raise _envelope_error(exc, "spans") from None
        except TooManyItems as exc:
            raise _too_many(exc.count, "spans") from None
        # The rate limit counts every span sent, valid or not, as the per-item path always did.
        _admit(key, len(rows) + len(rejected), "spans")
        rows, scores, rejected = _with_scores(rows, rejected)
        _all_rejected(rows, rejected, "spans")
        await _write_spans_and_scores(rows, scores)
        await traces_notify_async(project_id=key.project_id, rows=rows)
        return JsonResponse({"accepted": len(rows), "rejected": rejected})
    except ApiError as exc:
        return exc.response()


async def _batch_endpoint(request, envelope, noun: str, validate, store_async):
    """A native batch (``{noun: [...]}``) of samples or scores: key, body, count and rate limits, the
    items validated one by one (``validate(items, project_id)`` -> rows, rejected), the rows stored
    (``store_async(project_id, rows)``), answered with what was accepted and what was rejected."""
    try:
        key, _, body = await _begin(request, (JSON,))
        try:
            items = decode_envelope(body, envelope, name=noun)
        except EnvelopeError as exc:
            raise _envelope_error(exc, noun) from None
        _admit(key, len(items), noun)
        rows, rejected = validate(items, key.project_id)
        _all_rejected(rows, rejected, noun)
        await _stored(store_async(key.project_id, rows))
        return JsonResponse({"accepted": len(rows), "rejected": rejected})
    except ApiError as exc:
        return exc.response()


async def _samples_endpoint(request, kind: SampleKind):
    return await _batch_endpoint(
        request, SamplesIn, "samples",
        lambda items, project_id: samples_validate(kind, items, project_id=project_id),
        lambda project_id, rows: samples_store_async(kind, project_id=project_id, rows=rows))


@fast_path
@csrf_exempt
async def scores_ingest(request):
    """``POST /api/v1/scores``: ``{"scores": [...]}``, each a score of a trace or of one of its spans
    (docs/scores.md); the same key, body, count and rate limits and the same answer as samples."""
    return await _batch_endpoint(
        request, ScoresIn, "scores",
        lambda items, project_id: scores_validate(items, project_id=project_id),
        lambda project_id, rows: scores_store_async(project_id=project_id, rows=rows))


def _with_scores(rows, rejected: list) -> tuple:
    """Span rows (a list of mappings, or ``store.Columns``) and the batch's rejections -> (span rows,
    score rows, rejected): the scores a span carries by the OTel convention
    (``ingest.scores.span_score_rows``); a span whose score is bad is rejected whole, naming the
    attribute, so neither its span nor its scores are written."""
    if isinstance(rows, Columns) and rows.arrow:
        return rows, [], rejected  # parsed by a worker, which found no score (ingest.parse_pool)
    if not any(map(has_score_keys, column_values(rows, "attributes"), column_values(rows, "event_names"))):
        return rows, [], rejected  # the common case: one cheap pass, nothing copied
    if isinstance(rows, Columns):
        rows = rows.rows()
    refused = {r["index"] for r in rejected}
    indices = [i for i in range(len(rows) + len(rejected)) if i not in refused]
    rejected = list(rejected)
    kept, scores = [], []
    for index, row in zip(indices, rows):
        try:
            scores.extend(span_score_rows(row))
        except FieldError as exc:
            rejected.append({"index": index, "field": exc.field, "message": exc.message})
            continue
        kept.append(row)
    rejected.sort(key=lambda r: r["index"])
    return kept, scores, rejected


async def _write_spans_and_scores(spans: list, scores: list) -> None:
    """Spans and the scores they carry handed to the writer together, acknowledged when both are
    in ClickHouse or the spool."""
    writer = get_writer()
    writes = []
    if spans:
        writes.append(writer.submit_async("spans", spans))
    if scores:
        writes.append(writer.submit_async("scores", scores))
    if len(writes) == 1:
        await _stored(writes[0])  # the common case: no gather (a task per request) around one write
    elif writes:
        await _stored(asyncio.gather(*writes))


@fast_path
@csrf_exempt
async def resources_ingest(request):
    return await _samples_endpoint(request, RESOURCE_SAMPLES)


@fast_path
@csrf_exempt
async def engine_samples_ingest(request):
    return await _samples_endpoint(request, ENGINE_SAMPLES)


# --- OTLP/HTTP --------------------------------------------------------------------------------
def _otlp_response(content_type: str, message) -> HttpResponse:
    return HttpResponse(otlp.encode_response(message, content_type), content_type=content_type)


async def _otlp_begin(request, decode, noun: str):
    """Key, encoding and decoded items of an OTLP request (count and rate limits applied)."""
    key, content_type, body = await _begin(request, (PROTOBUF, JSON))
    try:
        items = decode(body, content_type)
    except otlp.OtlpDecodeError as exc:
        raise ApiError(400, "invalid_otlp", str(exc)) from None
    _admit(key, len(items), noun)
    return key, content_type, items


@fast_path
@csrf_exempt
async def otlp_traces(request):
    try:
        key, content_type, spans = await _otlp_begin(request, otlp.decode_traces, "spans")
        limits = _limits()
        rows, rejected = parse_each(spans, lambda span: otlp.span_row(span, project_id=key.project_id, limits=limits))
        rows, scores, rejected = _with_scores(rows, rejected)
        await _write_spans_and_scores(rows, scores)
        await traces_notify_async(project_id=key.project_id, rows=rows)
        return _otlp_response(content_type, otlp.trace_response(rejected))
    except ApiError as exc:
        return exc.response()


@fast_path
@csrf_exempt
async def otlp_metrics(request):
    try:
        key, content_type, points = await _otlp_begin(request, otlp.decode_metrics, "data points")
        rows, rejected = otlp.resource_rows(points, project_id=key.project_id)
        engine_rows, engine_rejected = otlp.engine_rows(points, project_id=key.project_id)
        await _stored(samples_store_async(RESOURCE_SAMPLES, project_id=key.project_id, rows=rows))
        await _stored(samples_store_async(ENGINE_SAMPLES, project_id=key.project_id, rows=engine_rows))
        rejected = sorted(rejected + engine_rejected, key=lambda r: r["index"])
        return _otlp_response(content_type, otlp.metrics_response(rejected))
    except ApiError as exc:
        return exc.response()


@fast_path
@csrf_exempt
async def otlp_logs(request):
    try:
        key, content_type, records = await _otlp_begin(request, otlp.decode_logs, "log records")
        limits = _limits()
        rows, rejected = parse_each(records, lambda record: otlp.span_log_row(record, project_id=key.project_id,
                                                                              limits=limits))
        # None: a record tracedash does not keep (not a GenAI event of a trace): accepted, not stored.
        await _write("span_logs", [row for row in rows if row is not None])
        return _otlp_response(content_type, otlp.logs_response(rejected))
    except ApiError as exc:
        return exc.response()
