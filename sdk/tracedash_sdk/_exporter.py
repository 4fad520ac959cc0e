"""Exporters: where ended spans go.

:class:`BatchExporter` is the default. ``on_end`` (called by ``Span.end`` on the host app's thread)
only appends the span to a bounded deque — no lock, no I/O, no encoding — and a daemon thread does
the rest: encodes spans to JSON, groups them into gzip-compressed batches and posts them to
``/api/v1/traces`` over a keep-alive connection, retrying what the server asks to be retried.
"""

from __future__ import annotations

import atexit
import collections
import email.utils
import http.client
import json
import logging
import os
import random
import sys
import threading
import time
import urllib.parse
import weakref
import zlib
from typing import Any, Dict, List, Optional, Tuple

from ._encode import encode_batch, encode_span, span_to_dict

log = logging.getLogger("tracedash_sdk")

__version__ = "0.1.0"
USER_AGENT = f"tracedash-sdk/{__version__} python/{sys.version_info[0]}.{sys.version_info[1]}"
TRACES_PATH = "/api/v1/traces"
SCORES_PATH = "/api/v1/scores"
# The server takes 10 MiB per request (after gunzip) by default; stay well under it.
DEFAULT_MAX_BATCH_BYTES = 4 * 1024 * 1024
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER = 60.0

_exporters: "weakref.WeakSet[BatchExporter]" = weakref.WeakSet()


class SpanExporter:
    """The interface a :class:`~tracedash_sdk.Tracer` needs from its exporter.

    ``on_end(span)`` is called on the host app's thread when a sampled span ends: it must not block
    and must not raise. ``stats`` is a dict of counters."""

    def on_end(self, span: Any) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def on_score(self, score: Dict[str, Any]) -> None:
        """A score (the JSON object of ``POST /api/v1/scores``) to send; must not block or raise.
        Exporters that do not send scores drop them."""

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def shutdown(self, timeout: float = 5.0) -> bool:
        return True

    @property
    def stats(self) -> Dict[str, int]:
        return {}


class InMemoryExporter(SpanExporter):
    """Keeps ended spans in a list (``.spans``); for tests and for looking at what would be sent
    (``.records()`` gives the exact JSON objects)."""

    def __init__(self) -> None:
        self.spans: List[Any] = []
        self.scores: List[Dict[str, Any]] = []
        self._lock = threading.Lock()

    def on_end(self, span: Any) -> None:
        with self._lock:
            self.spans.append(span)

    def on_score(self, score: Dict[str, Any]) -> None:
        with self._lock:
            self.scores.append(score)

    def records(self) -> List[Dict[str, Any]]:
        """The spans as the native JSON objects ``BatchExporter`` would send."""
        with self._lock:
            spans = list(self.spans)
        return [span_to_dict(s) for s in spans]

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()
            self.scores.clear()

    @property
    def stats(self) -> Dict[str, int]:
        return {"spans_queued": len(self.spans), "spans_sent": 0, "spans_dropped": 0, "spans_rejected": 0,
                "batches_sent": 0, "batches_failed": 0, "retries": 0, "queue_length": 0}


class _FlushMarker:
    """Put in the queue by ``flush``: set once every span queued before it has been handled."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


class _Score:
    """A score waiting in the exporter's queue beside the spans (its JSON object)."""

    __slots__ = ("record",)

    def __init__(self, record: Dict[str, Any]) -> None:
        self.record = record


class _Outcome:
    OK, RETRY, FAIL = "ok", "retry", "fail"


class BatchExporter(SpanExporter):
    """Sends spans to a tracedash server in batches, from a background daemon thread.

    - **Queue**: at most ``max_queue_spans`` ended spans wait; when it is full new spans are dropped
      and counted (``spans_dropped``) — ``on_end`` never blocks and never raises.
    - **Batches**: up to ``max_batch_spans`` spans (and ``max_batch_bytes`` of JSON) per request,
      sent when that many are waiting or every ``flush_interval`` seconds; gzip-compressed JSON,
      ``Authorization: Bearer <api_key>``.
    - **Retries**: 429, 502, 503, 504, network errors and timeouts are retried with exponential
      backoff and jitter (never sooner than the server's ``Retry-After``) for at most
      ``max_retry_time`` seconds, then the batch is dropped (``batches_failed``,
      ``spans_dropped``). Other 4xx/5xx answers drop the batch at once and log once per status.
      A 200 that rejects some spans logs the first reason (``spans_rejected``).
    - **Scores** (``on_score``: ``Span.score``, ``Tracer.score``) share the queue, the thread and the
      retries, and go in batches to ``POST /api/v1/scores``; ``flush`` and ``shutdown`` include
      them (counters ``scores_sent``, ``scores_dropped``, ``scores_rejected``).
    - **Exit**: ``shutdown`` (also run by ``atexit`` with ``exit_timeout``) sends what is queued.
    - Without an endpoint it is a no-op: spans are dropped (counted) and one line is logged.
    """

    def __init__(self, endpoint: Optional[str] = None, api_key: Optional[str] = None, *,
                 max_queue_spans: int = 10_000, max_batch_spans: int = 1_000, flush_interval: float = 1.0,
                 timeout: float = 10.0, max_retry_time: float = 60.0, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                 backoff_initial: float = 0.25, backoff_max: float = 8.0, compress_level: int = 1,
                 exit_timeout: float = 2.0):
        if max_queue_spans < 1 or max_batch_spans < 1:
            raise ValueError("max_queue_spans and max_batch_spans must be at least 1")
        if flush_interval <= 0 or timeout <= 0:
            raise ValueError("flush_interval and timeout must be positive")
        self.endpoint = endpoint or None
        self.api_key = api_key or None
        self.max_queue_spans = int(max_queue_spans)
        self.max_batch_spans = int(max_batch_spans)
        self.flush_interval = float(flush_interval)
        self.timeout = float(timeout)
        self.max_retry_time = float(max_retry_time)
        self.max_batch_bytes = int(max_batch_bytes)
        self.backoff_initial = float(backoff_initial)
        self.backoff_max = float(backoff_max)
        self.compress_level = int(compress_level)
        self.exit_timeout = float(exit_timeout)
        self._target: Optional[Tuple[str, str, int, str]] = None
        if self.endpoint:
            self._target = _parse_endpoint(self.endpoint)
        self._headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "User-Agent": USER_AGENT}
        if self.api_key:
            self._headers["Authorization"] = f"Bearer {self.api_key}"
        self._logged: set = set()
        self._reset()
        _exporters.add(self)

    def _reset(self) -> None:
        """Fresh queue, thread state and counters (also in a forked child)."""
        self._queue: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._stop_deadline: Optional[float] = None
        self._conn: Optional[http.client.HTTPConnection] = None
        self._conn_timeout: Optional[float] = None
        self._taken = 0  # spans taken off the queue by the worker (only the worker writes it)
        self._counters = {"spans_sent": 0, "spans_dropped": 0, "spans_rejected": 0, "batches_sent": 0,
                          "batches_failed": 0, "retries": 0, "scores_sent": 0, "scores_dropped": 0,
                          "scores_rejected": 0}
        self._last_rejection_log = 0.0

    # -- host side (any thread) --------------------------------------------------------------
    def on_end(self, span: Any) -> None:
        """Queue an ended span. Never blocks, never raises: when the queue is full (or there is no
        endpoint, or the exporter is shut down) the span is dropped and counted."""
        queue = self._queue
        if len(queue) >= self.max_queue_spans or self._closed or self._target is None:
            self._drop_new()
            return
        queue.append(span)
        if self._thread is None:
            self._start()
        elif len(queue) >= self.max_batch_spans and not self._wake.is_set():
            self._wake.set()

    def on_score(self, score: Dict[str, Any]) -> None:
        """Queue a score (same queue, limits and thread as spans). Never blocks, never raises."""
        queue = self._queue
        if len(queue) >= self.max_queue_spans or self._closed or self._target is None:
            self._drop_new("scores_dropped")
            return
        queue.append(_Score(score))
        if self._thread is None:
            self._start()
        elif len(queue) >= self.max_batch_spans and not self._wake.is_set():
            self._wake.set()

    def _drop_new(self, counter: str = "spans_dropped") -> None:
        with self._lock:
            self._counters[counter] += 1
        if self._target is None:
            self._log_once("no-endpoint", logging.WARNING,
                           "tracedash: no endpoint configured (set TRACEDASH_ENDPOINT or Tracer(endpoint=...)); "
                           "spans are dropped")
        elif not self._closed:
            self._log_once("queue-full", logging.WARNING,
                           "tracedash: span queue full (%d spans); dropping new spans until the exporter catches up",
                           self.max_queue_spans)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            thread = threading.Thread(target=self._run, name="tracedash-exporter", daemon=True)
            self._thread = thread
        thread.start()

    @property
    def stats(self) -> Dict[str, int]:
        """Counters: ``spans_queued`` (accepted into the queue), ``spans_sent`` (acknowledged by
        the server), ``spans_dropped`` (queue full, no endpoint, or in a batch given up),
        ``spans_rejected`` (refused by the server's validation), ``batches_sent``,
        ``batches_failed``, ``retries``, and ``queue_length`` (waiting now)."""
        with self._lock:
            out = dict(self._counters)
        waiting = sum(1 for item in list(self._queue) if type(item) is not _FlushMarker and type(item) is not _Score)
        out["spans_queued"] = self._taken + waiting
        out["queue_length"] = waiting
        return out

    def flush(self, timeout: float = 5.0) -> bool:
        """Send every span queued so far. True when all of them were handled (sent, or given up
        and counted) within ``timeout`` seconds."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return not any(type(item) is not _FlushMarker for item in list(self._queue))
        marker = _FlushMarker()
        self._queue.append(marker)  # behind every span queued so far; never refused
        self._wake.set()
        return marker.event.wait(timeout)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Send what is queued (for at most ``timeout`` seconds), stop the thread and refuse new
        spans. True when everything was handled in time. Idempotent."""
        with self._lock:
            already = self._closed
            self._closed = True
            thread = self._thread
        if already:
            if thread is not None:
                thread.join(timeout)
            return thread is None or not thread.is_alive()
        self._stop_deadline = time.monotonic() + max(0.0, timeout)
        self._stop.set()
        self._wake.set()
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _log_once(self, key: Any, level: int, message: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message, *args)

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
                self._drain()
                if self._stop.is_set():
                    self._drain()
                    break
        except Exception:  # noqa: BLE001 - a bug here must not kill spans silently forever
            log.exception("tracedash: exporter thread failed")
        finally:
            self._close_connection()

    def _past_stop_deadline(self) -> bool:
        deadline = self._stop_deadline
        return deadline is not None and time.monotonic() >= deadline

    def _drain(self) -> None:
        queue = self._queue
        while queue:
            batch: List[Any] = []
            scores: List[Dict[str, Any]] = []
            markers: List[_FlushMarker] = []
            limit = self.max_batch_spans
            while queue and len(batch) + len(scores) < limit:
                item = queue.popleft()
                if type(item) is _FlushMarker:
                    markers.append(item)
                    break
                if type(item) is _Score:
                    scores.append(item.record)
                else:
                    batch.append(item)
            self._taken += len(batch)
            if batch:
                if self._past_stop_deadline():
                    self._count(spans_dropped=len(batch))
                else:
                    self._export(batch)
            if scores:  # after the spans they belong to
                if self._past_stop_deadline():
                    self._count(scores_dropped=len(scores))
                else:
                    self._export_scores(scores)
            for marker in markers:
                marker.event.set()

    def _count(self, **deltas: int) -> None:
        with self._lock:
            counters = self._counters
            for name, delta in deltas.items():
                counters[name] += delta

    def _export(self, spans: List[Any]) -> None:
        """Encode, split by size, send."""
        parts: List[bytes] = []
        size = 0
        bad = 0
        for index, span in enumerate(spans):
            if index & 127 == 127:
                time.sleep(0)  # every ~0.5 ms of encoding, let the app's threads have the GIL
            try:
                part = encode_span(span)
            except Exception:  # noqa: BLE001 - e.g. attributes changed by another thread while encoding
                bad += 1
                self._log_once("encode", logging.WARNING, "tracedash: a span could not be encoded and was dropped",
                               exc_info=True)
                continue
            if parts and size + len(part) + 1 > self.max_batch_bytes:
                self._send(parts)
                parts, size = [], 0
            parts.append(part)
            size += len(part) + 1
        if bad:
            self._count(spans_dropped=bad)
        if parts:
            self._send(parts)

    def _export_scores(self, scores: List[Dict[str, Any]]) -> None:
        parts: List[bytes] = []
        for score in scores:
            try:
                parts.append(json.dumps(score, separators=(",", ":"), allow_nan=False).encode())
            except (TypeError, ValueError):
                self._count(scores_dropped=1)
                self._log_once("encode-score", logging.WARNING,
                               "tracedash: a score could not be encoded (NaN, infinity or an odd value) and was dropped")
        if parts:
            self._send(parts, noun="scores")

    def _send(self, parts: List[bytes], noun: str = "spans") -> None:
        if noun == "scores":
            body = b'{"scores":[' + b",".join(parts) + b"]}"
        else:
            body = encode_batch(parts)
        sent, dropped, refused = f"{noun}_sent", f"{noun}_dropped", f"{noun}_rejected"
        compressor = zlib.compressobj(self.compress_level, zlib.DEFLATED, 31)  # 31: gzip container
        payload = compressor.compress(body) + compressor.flush()
        count = len(parts)
        deadline = time.monotonic() + self.max_retry_time
        attempt = 0
        while True:
            outcome, status, retry_after, detail = self._post(payload, noun)
            if outcome == _Outcome.OK:
                rejected = _rejected(detail)
                self._count(batches_sent=1, **{sent: count - len(rejected), refused: len(rejected)})
                if rejected:
                    self._log_rejected(rejected, count, noun)
                return
            if outcome == _Outcome.FAIL:
                if status == 413 and count > 1:  # the server takes less than we thought: halve
                    half = count // 2
                    self._send(parts[:half], noun)
                    self._send(parts[half:], noun)
                    return
                if noun == "scores" and status == 400 and isinstance(detail, dict):
                    self._count(**{refused: count})  # every score of the batch refused by validation
                    self._log_rejected((detail.get("error") or {}).get("details") or [{}], count, noun)
                    return
                self._count(batches_failed=1, **{dropped: count})
                self._log_once(("status", noun, status), logging.ERROR,
                               "tracedash: the server refused a batch of %d %s with HTTP %s: %s "
                               "(dropped; logged once per status)", count, noun, status, _error_text(detail))
                return
            # retryable: 429/502/503/504 or a network error
            delay = self._backoff(attempt, retry_after)
            attempt += 1
            limit = deadline
            if self._stop_deadline is not None:
                limit = min(limit, self._stop_deadline)
            if time.monotonic() + delay > limit or not self._sleep(delay, deadline):
                self._count(batches_failed=1, **{dropped: count})
                self._log_once(("gave-up", noun, status), logging.WARNING,
                               "tracedash: gave up sending a batch of %d %s after %d attempts (%s); dropped",
                               count, noun, attempt, f"HTTP {status}" if status else detail)
                return
            self._count(retries=1)

    def _backoff(self, attempt: int, retry_after: Optional[float]) -> float:
        if retry_after is not None and retry_after > 0:
            return min(retry_after, MAX_RETRY_AFTER) * random.uniform(1.0, 1.1)
        base = min(self.backoff_max, self.backoff_initial * (2 ** attempt))
        return base * random.uniform(0.5, 1.0)

    def _sleep(self, delay: float, deadline: float) -> bool:
        """Wait ``delay`` seconds; False when shutdown's deadline will not allow the retry."""
        wake_at = time.monotonic() + delay
        while True:
            remaining = wake_at - time.monotonic()
            if remaining <= 0:
                return True
            if self._stop.wait(remaining):
                stop_deadline = self._stop_deadline
                if stop_deadline is not None and wake_at > stop_deadline:
                    return False
                time.sleep(max(0.0, wake_at - time.monotonic()))
                return True

    def _log_rejected(self, rejected: List[Any], count: int, noun: str = "spans") -> None:
        now = time.monotonic()
        if now - self._last_rejection_log < 60.0 and self._last_rejection_log:
            return
        self._last_rejection_log = now
        first = rejected[0] if rejected and isinstance(rejected[0], dict) else {}
        log.warning("tracedash: the server rejected %d of %d %s; first: %s %s, field %s: %s",
                    len(rejected), count, noun, noun[:-1], first.get("index"),
                    first.get("field"), first.get("message"))

    # -- HTTP --------------------------------------------------------------------------------------
    def _request_timeout(self) -> float:
        timeout = self.timeout
        if self._stop_deadline is not None:
            timeout = max(0.05, min(timeout, self._stop_deadline - time.monotonic()))
        return timeout

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None:
            scheme, host, port, _ = self._target  # type: ignore[misc]
            cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = cls(host, port, timeout=timeout)
            self._conn = conn
            self._conn_timeout = timeout
        elif self._conn_timeout != timeout:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            self._conn_timeout = timeout
        return conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _post(self, payload: bytes, noun: str = "spans") -> Tuple[str, Optional[int], Optional[float], Any]:
        """(outcome, HTTP status, Retry-After seconds, decoded body or error text)."""
        path = self._target[3]  # type: ignore[index]
        if noun == "scores":
            path = path[: -len(TRACES_PATH)] + SCORES_PATH
        for fresh_retry in (False, True):
            reused = self._conn is not None and self._conn.sock is not None
            try:
                conn = self._connection(self._request_timeout())
                conn.request("POST", path, body=payload, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
                status = response.status
                retry_after = _parse_retry_after(response.getheader("Retry-After"))
                if response.will_close:
                    self._close_connection()
            except (OSError, http.client.HTTPException) as exc:
                self._close_connection()
                # A keep-alive connection the server closed while idle: retry at once, on a new one.
                if reused and not fresh_retry and isinstance(exc, (http.client.RemoteDisconnected,
                                                                   ConnectionResetError, BrokenPipeError)):
                    continue
                return _Outcome.RETRY, None, None, f"{type(exc).__name__}: {exc}"
            try:
                detail: Any = json.loads(data) if data else None
            except ValueError:
                detail = data[:200].decode("utf-8", "replace")
            if 200 <= status < 300:
                return _Outcome.OK, status, None, detail
            if status in RETRYABLE_STATUSES:
                return _Outcome.RETRY, status, retry_after, detail
            return _Outcome.FAIL, status, None, detail
        return _Outcome.RETRY, None, None, "connection failed"  # pragma: no cover


def _parse_endpoint(endpoint: str) -> Tuple[str, str, int, str]:
    """(scheme, host, port, path of the traces API) from the server's base URL."""
    endpoint = endpoint.strip()
    if "://" not in endpoint:  # "127.0.0.1:8000" or "tracedash.internal": plain HTTP
        endpoint = "http://" + endpoint
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"endpoint must be an http(s) URL such as http://127.0.0.1:8000, got {endpoint!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    base = parts.path.rstrip("/")
    path = base if base.endswith(TRACES_PATH) else base + TRACES_PATH
    return parts.scheme, parts.hostname, port, path


def _parse_retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _rejected(detail: Any) -> List[Any]:
    if isinstance(detail, dict):
        rejected = detail.get("rejected")
        if isinstance(rejected, list):
            return rejected
    return []


def _error_text(detail: Any) -> str:
    if isinstance(detail, dict) and isinstance(detail.get("error"), dict):
        error = detail["error"]
        text = f"{error.get('code')}: {error.get('message')}"
        details = error.get("details")
        if isinstance(details, list) and details and isinstance(details[0], dict):
            first = details[0]
            text += f" (first: span {first.get('index')}, field {first.get('field')}: {first.get('message')})"
        return text
    return str(detail)[:300]


def _shutdown_all() -> None:
    for exporter in list(_exporters):
        try:
            exporter.shutdown(exporter.exit_timeout)
        except Exception:  # noqa: BLE001
            pass


def _after_fork_in_child() -> None:
    # The worker thread does not exist in a forked child, and the parent sends its own queue.
    for exporter in list(_exporters):
        exporter._reset()


atexit.register(_shutdown_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
