"""Sends resource samples to ``POST {endpoint}/api/v1/resources`` (and, a second sender, engine
samples to ``POST {endpoint}/api/v1/engine_samples``), surviving server outages.

Django-free and standard library only (urllib). Samples wait in a bounded in-memory buffer until
the server takes them:

- each ``flush()`` posts the buffer oldest first, up to ``batch_size`` samples a request (gzip,
  ``Authorization: Bearer KEY``), and stops at the first request that fails;
- a network error, a timeout, 408, 429 or 5xx keeps the samples for the next ``flush()``; a
  ``Retry-After`` answer (seconds or an HTTP date, at most ``MAX_RETRY_AFTER``) is honoured: no
  request is made before it has passed;
- 401/403/404/405 (wrong key or endpoint: a configuration error, not bad data) also keep the
  samples, and say so in an error line;
- 400/415/422 with the API's JSON error (the server refuses the data itself) drop that batch, count
  it as ``failed`` and log the server's message; without it (a proxy's page, Django refusing an
  unknown Host) the samples are kept, as for a configuration error; a 413 halves the batch size and
  tries again, down to one sample;
- a 200 whose ``rejected`` list is not empty counts those samples as ``failed`` and logs the
  first message;
- when the buffer holds ``max_buffer_samples``, adding more drops the OLDEST ones, counted as
  ``dropped``.

``stats``: sent, dropped, failed, retries (requests that failed and were kept for later),
buffered, plus requests and last_error.
"""

from __future__ import annotations

import collections
import email.utils
import gzip
import itertools
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from datetime import timezone

from .sampler import sample_payload

log = logging.getLogger("tracedash.agent")

PATH = "/api/v1/resources"
MAX_RETRY_AFTER = 600.0  # seconds: a larger (or broken) Retry-After is capped
USER_AGENT = "tracedash-agent/1"
_KEEP_CONFIG = (401, 403, 404, 405)  # the request, not the data, is wrong: keep the samples
_DROP_DATA = (400, 415, 422)  # the server refuses these samples: sending them again cannot help


ENGINES_PATH = "/api/v1/engine_samples"


def resources_url(endpoint: str, path: str = PATH) -> str:
    """``http://host:8000`` (or ``…/api/v1/resources`` already) -> the resources URL (or ``path``'s)."""
    base = endpoint.strip().rstrip("/")
    for known in (PATH, ENGINES_PATH):
        if base.endswith(known):
            base = base[: -len(known)]
    return base + path


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date), capped; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(MAX_RETRY_AFTER, seconds))


def _server_error(body: bytes) -> tuple[bool, str]:
    """(True, one line) for the server's ``{"error": {"code", "message", "details"}}``;
    (False, the start of the raw text) for anything else (a proxy's page, Django's DisallowedHost)."""
    try:
        error = json.loads(body.decode("utf-8", errors="replace"))["error"]
        text = f"{error.get('code', 'error')}: {error.get('message', '')}"
        details = error.get("details") or []
        if details:
            shown = "; ".join(f"[{d.get('index', '?')}] {d.get('field', '')}: {d.get('message', '')}" for d in details[:3])
            text += f" ({shown}{'; …' if len(details) > 3 else ''})"
        return True, text
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, " ".join(body[:200].decode("utf-8", errors="replace").split()) or "(no body)"


class ResourceSender:
    def __init__(self, endpoint: str, api_key: str, max_buffer_samples: int = 10_000, timeout: float = 5,
                 *, batch_size: int = 1_000, clock=time.monotonic, path: str = PATH):
        if max_buffer_samples < 1:
            raise ValueError("max_buffer_samples must be at least 1")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.url = resources_url(endpoint, path)
        self.api_key = api_key
        self.max_buffer_samples = int(max_buffer_samples)
        self.timeout = timeout
        self.batch_size = int(batch_size)
        self.clock = clock
        self._buffer: collections.deque[tuple[int, dict]] = collections.deque()  # (sequence, sample)
        self._next_seq = 0
        self._lock = threading.Lock()  # the buffer and counters
        self._flush_lock = threading.Lock()  # one flush at a time
        self._not_before = 0.0  # clock() before which no request is made (Retry-After)
        self._failing_since: str | None = None  # the error last logged, so an outage logs once
        self.counts = {"sent": 0, "dropped": 0, "failed": 0, "retries": 0, "requests": 0}
        self.last_error: str | None = None

    # --- buffer ---------------------------------------------------------------------------------
    def add(self, rows: list[dict]) -> int:
        """Buffer sampler rows (or ready API samples); returns how many of the oldest were dropped."""
        samples = [row if "processes" in row or "process_pids" not in row else sample_payload(row) for row in rows]
        with self._lock:
            for sample in samples:
                self._buffer.append((self._next_seq, sample))
                self._next_seq += 1
            overflow = len(self._buffer) - self.max_buffer_samples
            for _ in range(max(0, overflow)):
                self._buffer.popleft()
            if overflow > 0:
                self.counts["dropped"] += overflow
        if overflow > 0:
            log.warning("buffer full (%d samples): dropped the %d oldest (%d dropped in all)",
                        self.max_buffer_samples, overflow, self.counts["dropped"])
        return max(0, overflow)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def stats(self) -> dict:
        with self._lock:
            return {**self.counts, "buffered": len(self._buffer), "last_error": self.last_error}

    def retry_in(self) -> float:
        """Seconds until the next request may be made (Retry-After), 0 if now."""
        return max(0.0, self._not_before - self.clock())

    # --- sending --------------------------------------------------------------------------------
    def flush(self) -> bool:
        """Post the buffer, oldest first; True when it is empty afterwards. Never raises for
        network or server errors: the samples stay buffered and ``stats`` says what happened."""
        with self._flush_lock:
            while True:
                if self.clock() < self._not_before:
                    return False
                with self._lock:
                    batch = list(itertools.islice(self._buffer, self.batch_size))
                if not batch:
                    return True
                if not self._send(batch):
                    return False

    def _take(self, batch: list[tuple[int, dict]]) -> int:
        """Remove the batch's samples from the buffer (those not already dropped for room)."""
        last = batch[-1][0]
        removed = 0
        with self._lock:
            while self._buffer and self._buffer[0][0] <= last:
                self._buffer.popleft()
                removed += 1
        return removed

    def _send(self, batch: list[tuple[int, dict]]) -> bool:
        """One request; True to go on with the next batch, False to stop this flush."""
        body = gzip.compress(json.dumps({"samples": [sample for _, sample in batch]},
                                        separators=(",", ":"), allow_nan=False).encode("utf-8"), 6)
        request = urllib.request.Request(self.url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip", "Accept": "application/json",
            "Authorization": f"Bearer {self.api_key}", "User-Agent": USER_AGENT,
        })
        with self._lock:
            self.counts["requests"] += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, headers, answer = response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            status, headers = exc.code, exc.headers
            try:
                answer = exc.read()
            except Exception:  # noqa: BLE001 - the body of an error answer is optional
                answer = b""
        except Exception as exc:  # noqa: BLE001 - URLError, timeout, connection reset, DNS: keep the samples
            reason = getattr(exc, "reason", None) or exc
            return self._keep(f"cannot reach {self.url}: {type(reason).__name__}: {reason}", None)

        if 200 <= status < 300:
            self._accepted(batch, answer)
            return True
        from_api, message = _server_error(answer)
        if status in _DROP_DATA and not from_api:  # not the API refusing the data: a proxy, a wrong Host
            return self._keep(f"HTTP {status} from {self.url} without the API's JSON error: {message!r} (check --endpoint, "
                              "and that the server's TRACEDASH_ALLOWED_HOSTS names the host in it)",
                              None, level=logging.ERROR)
        if status == 413 and len(batch) > 1:
            self.batch_size = max(1, len(batch) // 2)
            log.warning("server refused %d samples as too large (%s): sending at most %d a request from now",
                        len(batch), message, self.batch_size)
            return True
        if status in _DROP_DATA or status == 413:
            removed = self._take(batch)
            with self._lock:
                self.counts["failed"] += removed
                self.last_error = f"HTTP {status}: {message}"
            log.error("server rejected %d samples (HTTP %d): %s; they are dropped", removed, status, message)
            return True
        retry_after = parse_retry_after(headers.get("Retry-After") if headers is not None else None)
        if status in _KEEP_CONFIG:
            return self._keep(f"HTTP {status} from {self.url}: {message} (check --endpoint and --api-key)",
                              retry_after, level=logging.ERROR)
        return self._keep(f"HTTP {status}: {message}", retry_after)

    def _accepted(self, batch: list[tuple[int, dict]], answer: bytes) -> None:
        removed = self._take(batch)
        rejected: list = []
        try:
            parsed = json.loads(answer.decode("utf-8")) if answer else {}
            rejected = (parsed.get("rejected") or []) if isinstance(parsed, dict) else []
        except ValueError:
            pass
        failed = min(len(rejected), removed)
        with self._lock:
            self.counts["sent"] += removed - failed
            self.counts["failed"] += failed
            self.last_error = None
        if rejected:
            first = rejected[0] if isinstance(rejected[0], dict) else {}
            log.warning("server rejected %d of %d samples: [%s] %s: %s", len(rejected), removed,
                        first.get("index", "?"), first.get("field", ""), first.get("message", ""))
        if self._failing_since is not None:
            log.info("server reachable again: %d samples sent, %d still buffered", removed - failed, self.buffered)
            self._failing_since = None

    def _keep(self, error: str, retry_after: float | None, level: int = logging.WARNING) -> bool:
        with self._lock:
            self.counts["retries"] += 1
            self.last_error = error
        if retry_after:
            self._not_before = self.clock() + retry_after
        if error != self._failing_since:  # an outage logs when it starts or changes, not every try
            log.log(level, "%s; %d samples kept for the next try%s", error, self.buffered,
                    f" (in {retry_after:g} s, as Retry-After asks)" if retry_after else "")
            self._failing_since = error
        return False


__all__ = ["ResourceSender", "parse_retry_after", "resources_url", "PATH", "ENGINES_PATH"]
