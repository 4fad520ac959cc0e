"""Per-key rate limit: a token bucket of spans per second, with bursts of a few seconds.

The bucket lives in the web process, so with N web processes a key may send up to N times the
limit in total; set ``TRACEDASH_INGEST_RATE_LIMIT`` per process accordingly.
"""

from __future__ import annotations

import math
import threading
import time


class TokenBucket:
    def __init__(self, rate: float, burst_seconds: float, clock=time.monotonic):
        self.rate = rate
        self.capacity = max(rate * burst_seconds, 1.0)
        self.clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: int, amount: int) -> float:
        """Take ``amount`` tokens for ``key``: 0 when allowed, else seconds to wait before retrying.

        A request larger than the whole bucket is let through when the bucket is full (it would
        otherwise never pass) and leaves it empty."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            needed = min(float(amount), self.capacity)
            if tokens >= needed:
                self._buckets[key] = (tokens - amount, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (needed - tokens) / self.rate


_limiter: TokenBucket | None = None


def retry_after_header(wait: float) -> str:
    return str(max(1, math.ceil(wait)))


def limiter() -> TokenBucket | None:
    global _limiter
    from django.conf import settings

    rate = settings.TRACEDASH_INGEST_RATE_LIMIT
    if not rate:
        return None
    if _limiter is None or _limiter.rate != rate:
        _limiter = TokenBucket(rate, settings.TRACEDASH_INGEST_RATE_BURST_SECONDS)
    return _limiter
