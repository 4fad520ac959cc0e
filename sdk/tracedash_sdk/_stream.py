"""Streaming helpers: TTFT and output tokens of a streamed model response."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterable, AsyncIterator, Callable, Generic, Iterable, Iterator, Optional, TypeVar

from ._span import current_span

T = TypeVar("T")
log = logging.getLogger("tracedash_sdk")
_logged_count_error = False


def _count(count_tokens: Optional[Callable[[Any], int]], chunk: Any) -> int:
    if count_tokens is None:
        return 1
    try:
        return int(count_tokens(chunk))
    except Exception:  # noqa: BLE001 - a counting bug must not break the stream
        global _logged_count_error
        if not _logged_count_error:
            _logged_count_error = True
            log.warning("tracedash: count_tokens raised; counting 0 for that chunk", exc_info=True)
        return 0


class TracedStream(Generic[T]):
    """An iterator over ``source``'s chunks that records, on ``span``, the time to first token
    (``ttft_ms`` and a ``first_token`` event, at the first chunk) and the output tokens
    (``count_tokens(chunk)``, 1 per chunk by default). Other attributes and ``close()``, ``with``
    reach the wrapped object."""

    def __init__(self, source: Iterable[T], span: Any = None, count_tokens: Optional[Callable[[T], int]] = None):
        self._source = source
        self._iterator: Optional[Iterator[T]] = None
        self._span = span if span is not None else current_span()
        self._count_tokens = count_tokens
        self._first = True

    def __iter__(self) -> "TracedStream[T]":
        return self

    def __next__(self) -> T:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = iter(self._source)
        chunk = next(iterator)
        span = self._span
        if span is not None:
            if self._first:
                self._first = False
                span.mark_first_token()
            span._add_output_tokens(_count(self._count_tokens, chunk))
        return chunk

    def close(self) -> None:
        close = getattr(self._iterator if self._iterator is not None else self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "TracedStream[T]":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._source, name)


class AsyncTracedStream(Generic[T]):
    """The async counterpart of :class:`TracedStream` (``async for``)."""

    def __init__(self, source: AsyncIterable[T], span: Any = None, count_tokens: Optional[Callable[[T], int]] = None):
        self._source = source
        self._iterator: Optional[AsyncIterator[T]] = None
        self._span = span if span is not None else current_span()
        self._count_tokens = count_tokens
        self._first = True

    def __aiter__(self) -> "AsyncTracedStream[T]":
        return self

    async def __anext__(self) -> T:
        iterator = self._iterator
        if iterator is None:
            iterator = self._iterator = self._source.__aiter__()
        chunk = await iterator.__anext__()
        span = self._span
        if span is not None:
            if self._first:
                self._first = False
                span.mark_first_token()
            span._add_output_tokens(_count(self._count_tokens, chunk))
        return chunk

    async def aclose(self) -> None:
        target = self._iterator if self._iterator is not None else self._source
        close = getattr(target, "aclose", None) or getattr(target, "close", None)
        if close is not None:
            result = close()
            if hasattr(result, "__await__"):
                await result

    async def __aenter__(self) -> "AsyncTracedStream[T]":
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        await self.aclose()
        return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._source, name)


def stream(iterable: Iterable[T], span: Any = None, count_tokens: Optional[Callable[[T], int]] = None) -> TracedStream[T]:
    """Wrap a sync iterator of model output chunks: at the first chunk, record the time to first
    token on ``span`` (default: the span current when ``stream`` is called) as ``ttft_ms`` — from
    the span's start — and a ``first_token`` event; add ``count_tokens(chunk)`` (default 1) to its
    output tokens for every chunk. The span is not ended: it is the caller's."""
    return TracedStream(iterable, span, count_tokens)


def astream(async_iterable: AsyncIterable[T], span: Any = None,
            count_tokens: Optional[Callable[[T], int]] = None) -> AsyncTracedStream[T]:
    """:func:`stream` for async iterators (``async for chunk in td.astream(...)``)."""
    return AsyncTracedStream(async_iterable, span, count_tokens)
