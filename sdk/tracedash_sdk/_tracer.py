"""The tracer: creates spans, decides sampling, propagates context."""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import random
import re
import threading
from typing import Any, Callable, Iterable, Mapping, MutableMapping, Optional, TypeVar, Union

from ._exporter import BatchExporter, SpanExporter
from ._score import build_score
from ._span import (_CURRENT, CACHE_NAME_ATTRIBUTE, AnySpan, CacheLookup, NonRecordingSpan, Parent, Span, SpanContext,
                    check_phase, current_span, new_trace_id)

F = TypeVar("F", bound=Callable[..., Any])

# W3C Trace Context: version-traceid-parentid-flags; \Z, not $ (which also matches before "\n").
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_random = random.random


class Tracer:
    """Creates spans and hands the ended ones to its exporter.

    ``endpoint`` is the tracedash server's base URL (e.g. ``http://127.0.0.1:8000``) and
    ``api_key`` the project's ingest key; they default to ``TRACEDASH_ENDPOINT`` and
    ``TRACEDASH_API_KEY``. Without an endpoint, spans are dropped (one log line). ``service`` names
    this app in every span. ``sample_rate`` (0..1) is the share of traces recorded, decided once per
    trace at its root. ``exporter`` replaces the default :class:`BatchExporter` (built from the
    queue, batch, interval and timeout arguments).
    """

    def __init__(self, endpoint: Optional[str] = None, api_key: Optional[str] = None, service: str = "my-app",
                 sample_rate: float = 1.0, exporter: Optional[SpanExporter] = None, max_queue_spans: int = 10_000,
                 max_batch_spans: int = 1_000, flush_interval: float = 1.0, timeout: float = 10.0):
        if not 0.0 <= float(sample_rate) <= 1.0:
            raise ValueError(f"sample_rate must be between 0 and 1, got {sample_rate!r}")
        self.service = service
        self.sample_rate = float(sample_rate)
        if exporter is None:
            exporter = BatchExporter(endpoint or os.environ.get("TRACEDASH_ENDPOINT") or None,
                                     api_key or os.environ.get("TRACEDASH_API_KEY") or None,
                                     max_queue_spans=max_queue_spans, max_batch_spans=max_batch_spans,
                                     flush_interval=flush_interval, timeout=timeout)
        self.exporter: SpanExporter = exporter

    # -- spans -------------------------------------------------------------------------------------
    def span(self, name: str, phase: Optional[str] = None, model: Optional[str] = None,
             attributes: Optional[Mapping[str, Any]] = None, *, service: Optional[str] = None,
             parent: Parent = None) -> AnySpan:
        """A span, child of ``parent`` or else of the current span (a root when there is none).

        Use it in a ``with`` block, where it is the current span; or call ``.end()`` yourself (it
        starts now either way). ``phase`` is one of network, preprocess, inference, postprocess,
        other; without one the span states none (the server counts it as ``other``, or as part of
        the model call it lies beneath). ``service`` defaults to the parent's (when local) or the
        tracer's.
        """
        if parent is None:
            parent = _CURRENT.get()
        if parent is None:
            rate = self.sample_rate
            if rate < 1.0 and (rate <= 0.0 or _random() >= rate):
                return NonRecordingSpan(None, None, None)
            trace_id, parent_id = new_trace_id(), None
        else:
            if not parent.sampled:
                return NonRecordingSpan(None, None, parent)
            trace_id, parent_id = parent.trace_id, parent.span_id
        if phase is not None and (phase.__class__ is not str or phase not in _PHASES):
            check_phase(phase)
        if service is None:
            service = parent.service if (parent is not None and parent.__class__ is Span
                                         and parent._tracer is self) else self.service
        return Span(self, self.exporter, name, trace_id, parent_id, phase, service, model, attributes, parent)

    def trace(self, name: str, service: Optional[str] = None, model: Optional[str] = None,
              attributes: Optional[Mapping[str, Any]] = None, parent: Parent = None, *,
              phase: Optional[str] = None) -> AnySpan:
        """The span of a request: a root when no span is current (else a child of it). Open its
        phases with ``t.phase("network")`` etc."""
        return self.span(name, phase=phase, model=model, attributes=attributes, service=service, parent=parent)

    start_span = span

    def cache(self, name: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None, *,
              parent: Parent = None) -> CacheLookup:
        """A cache lookup in front of the model: a ``preprocess`` span named ``cache <name>``
        (child of ``parent`` or the current span) whose ``hit`` you set in the block::

            with tracer.cache("semantic") as c:
                answer = lookup(question)
                c.hit = answer is not None

        ``tracedash.cache.hit`` is sent only once ``hit`` is set; ``tracedash.cache.name`` is ``name``."""
        span_attributes = dict(attributes) if attributes else {}
        if name:
            span_attributes[CACHE_NAME_ATTRIBUTE] = name
        span = self.span(f"cache {name}" if name else "cache", phase="preprocess",
                         attributes=span_attributes or None, parent=parent)
        return CacheLookup(span)

    def current_span(self) -> Optional[AnySpan]:
        """The span current in this context, or ``None``."""
        return current_span()

    def traced(self, name: Union[str, Callable[..., Any], None] = None, phase: Optional[str] = None, *,
               model: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> Any:
        """Decorator: each call of the function runs in a span named ``name`` (default: the
        function's qualified name). Works on sync and ``async`` functions, and on (async)
        generator functions, whose span lasts until they are exhausted or closed. Exceptions are
        recorded and re-raised. ``@tracer.traced`` without parentheses works too."""
        if callable(name):
            return self.traced()(name)
        if phase is not None:
            check_phase(phase)

        def decorate(fn: F) -> F:
            span_name = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "function")
            # One span per call, opened the same way whatever kind of function is wrapped.
            new_span = functools.partial(self.span, span_name, phase=phase, model=model, attributes=attributes)

            if inspect.isasyncgenfunction(fn):
                @functools.wraps(fn)
                def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
                    return _traced_async_generator(new_span(), fn(*args, **kwargs))
                return agen_wrapper  # type: ignore[return-value]
            if inspect.isgeneratorfunction(fn):
                @functools.wraps(fn)
                def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
                    return _traced_generator(new_span(), fn(*args, **kwargs))
                return gen_wrapper  # type: ignore[return-value]
            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    with new_span():
                        return await fn(*args, **kwargs)
                return async_wrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with new_span():
                    return fn(*args, **kwargs)
            return wrapper  # type: ignore[return-value]

        return decorate

    # -- propagation -----------------------------------------------------------------------------
    def inject(self, headers: Optional[MutableMapping[str, str]] = None,
               span: Optional[Union[AnySpan, SpanContext]] = None) -> MutableMapping[str, str]:
        """Add the W3C ``traceparent`` header of ``span`` (default: the current span) to ``headers``
        and return them: ``00-<trace id>-<span id>-01`` (``-00`` for an unsampled trace). Without a
        span the headers are returned unchanged."""
        if headers is None:
            headers = {}
        if span is None:
            span = _CURRENT.get()
        if span is not None:
            headers["traceparent"] = f"00-{span.trace_id}-{span.span_id}-{'01' if span.sampled else '00'}"
        return headers

    def extract(self, headers: Any) -> Optional[SpanContext]:
        """The :class:`SpanContext` in the ``traceparent`` header of ``headers`` (a dict with any key
        case, a WSGI environ, or ASGI-style ``(name, value)`` pairs, str or bytes), to pass as
        ``parent=``. ``None`` when the header is missing or invalid."""
        return parse_traceparent(_find_traceparent(headers))

    # -- context across threads ---------------------------------------------------------------------
    def context(self) -> "CapturedContext":
        """Capture the current span, to continue the trace in another thread::

            ctx = tracer.context()
            def work():
                with ctx:                     # spans in here are children of the captured span
                    with tracer.span("step"): ...
            threading.Thread(target=work).start()
        """
        return CapturedContext(_CURRENT.get())

    # -- scores ----------------------------------------------------------------------------------
    def score(self, trace_id: str, name: str, value: Any, *, span_id: Optional[str] = None,
              comment: Optional[str] = None, source: str = "sdk", author: Optional[str] = None,
              score_id: Optional[str] = None, data_type: Optional[str] = None) -> None:
        """Score a trace (or, with ``span_id``, one of its spans), at any time after it ran, e.g.
        when the user clicks thumbs-up: ``tracer.score(trace_id, "user.feedback", True)``. ``bool``
        -> boolean, ``int``/``float`` -> numeric, ``str`` -> categorical. Queued and sent in the
        background to ``POST /api/v1/scores`` (batched, retried like spans; ``flush``/``shutdown``
        include it). A bad argument raises ValueError/TypeError; sending never raises. Without
        ``score_id`` the server derives one from (trace, span, name, source, author): scoring the
        same thing again replaces the earlier score."""
        score = build_score(trace_id, name, value, span_id=span_id, comment=comment, source=source, author=author,
                            score_id=score_id, data_type=data_type)
        try:
            self.exporter.on_score(score)
        except Exception:  # noqa: BLE001 - tracing must never break the host app
            pass

    # -- export ----------------------------------------------------------------------------------
    def flush(self, timeout: float = 5.0) -> bool:
        """Send every ended span now; True when all were handled within ``timeout`` seconds."""
        try:
            return self.exporter.flush(timeout)
        except Exception:  # noqa: BLE001
            return False

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Flush (for at most ``timeout`` seconds) and stop the exporter. Also run at exit."""
        try:
            return self.exporter.shutdown(timeout)
        except Exception:  # noqa: BLE001
            return False

    def __repr__(self) -> str:
        return f"Tracer(service={self.service!r}, sample_rate={self.sample_rate!r}, exporter={type(self.exporter).__name__})"


_PHASES = frozenset(("network", "preprocess", "inference", "postprocess", "other"))


class CapturedContext:
    """A span captured in one thread (:meth:`Tracer.context`), made current in another by ``with``,
    :meth:`run` or :meth:`wrap`."""

    __slots__ = ("span", "_tokens")

    def __init__(self, span: Any):
        self.span = span
        self._tokens: list = []

    def __enter__(self) -> Any:
        self._tokens.append(_CURRENT.set(self.span))
        return self.span

    def __exit__(self, *exc: Any) -> bool:
        _CURRENT.reset(self._tokens.pop())
        return False

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` with the captured span current."""
        token = _CURRENT.set(self.span)
        try:
            return fn(*args, **kwargs)
        finally:
            _CURRENT.reset(token)

    def wrap(self, fn: F) -> F:
        """``fn`` made to run with the captured span current, wherever it is called."""
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self.run(fn, *args, **kwargs)
        return wrapper  # type: ignore[return-value]


def wrap(fn: F) -> F:
    """``fn`` bound to a copy of the current ``contextvars`` context (so to the current span),
    for ``threading.Thread(target=td.wrap(work))`` or ``executor.submit(td.wrap(work), ...)``.
    Each call runs in its own copy, so the wrapped function may run in several threads at once."""
    captured = contextvars.copy_context()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return captured.copy().run(fn, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


def parse_traceparent(value: Optional[str]) -> Optional[SpanContext]:
    """A W3C ``traceparent`` value -> :class:`SpanContext` (``remote=True``), or ``None``."""
    if not value or not isinstance(value, str):
        return None
    match = _TRACEPARENT.match(value.strip())
    if not match:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return SpanContext(trace_id, span_id, sampled=bool(int(flags, 16) & 1), remote=True)


def _text(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else None


def _find_traceparent(headers: Any) -> Optional[str]:
    if not headers:
        return None
    if isinstance(headers, Mapping):
        for key in ("traceparent", "Traceparent", "HTTP_TRACEPARENT"):
            value = headers.get(key)
            if value is not None:
                return _text(value)
        items: Iterable[Any] = headers.items()
    else:
        items = headers
    try:
        for pair in items:
            key, value = pair[0], pair[1]
            key = _text(key)
            if key is not None and key.lower() in ("traceparent", "http_traceparent"):
                return _text(value)
    except (TypeError, IndexError, ValueError):
        return None
    return None


def _traced_generator(span: AnySpan, gen: Any) -> Any:
    """Drive ``gen`` with ``span`` current only while ``gen`` runs (never leaked to the consumer
    between items); end the span when ``gen`` finishes, fails or is closed."""
    try:
        to_send: Any = None
        to_throw: Optional[BaseException] = None
        while True:
            token = _CURRENT.set(span)
            try:
                item = gen.throw(to_throw) if to_throw is not None else gen.send(to_send)
            except StopIteration as stop:
                return stop.value
            finally:
                _CURRENT.reset(token)
            to_send, to_throw = None, None
            try:
                to_send = yield item
            except GeneratorExit:
                gen.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown in by the consumer: pass it on
                to_throw = exc
    except GeneratorExit:
        raise
    except BaseException as exc:
        span.record_exception(exc)
        raise
    finally:
        span.end()


async def _traced_async_generator(span: AnySpan, agen: Any) -> Any:
    """The async counterpart of :func:`_traced_generator`."""
    try:
        to_send: Any = None
        to_throw: Optional[BaseException] = None
        while True:
            token = _CURRENT.set(span)
            try:
                if to_throw is not None:
                    item = await agen.athrow(to_throw)
                else:
                    item = await agen.asend(to_send)
            except StopAsyncIteration:
                return
            finally:
                _CURRENT.reset(token)
            to_send, to_throw = None, None
            try:
                to_send = yield item
            except GeneratorExit:
                await agen.aclose()
                raise
            except BaseException as exc:  # noqa: BLE001
                to_throw = exc
    except GeneratorExit:
        raise
    except BaseException as exc:
        span.record_exception(exc)
        raise
    finally:
        span.end()


# -- the process-wide default tracer ----------------------------------------------------------------
_default_lock = threading.Lock()
_default: Optional[Tracer] = None


def get_tracer() -> Tracer:
    """The process-wide default tracer, created on first use from ``TRACEDASH_ENDPOINT``,
    ``TRACEDASH_API_KEY`` and ``TRACEDASH_SERVICE`` (default ``my-app``) unless
    :func:`configure` made one."""
    global _default
    tracer = _default
    if tracer is None:
        with _default_lock:
            if _default is None:
                _default = Tracer(service=os.environ.get("TRACEDASH_SERVICE") or "my-app")
            tracer = _default
    return tracer


def cache(name: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None, *,
          parent: Parent = None) -> CacheLookup:
    """:meth:`Tracer.cache` on the process-wide default tracer (:func:`get_tracer`)."""
    return get_tracer().cache(name, attributes=attributes, parent=parent)


def configure(**kwargs: Any) -> Tracer:
    """Make a new default tracer from :class:`Tracer`'s arguments and return it; the previous one
    is flushed and shut down (for at most a second)."""
    global _default
    tracer = Tracer(**kwargs)
    with _default_lock:
        previous, _default = _default, tracer
    if previous is not None:
        previous.shutdown(timeout=1.0)
    return tracer


__all__ = ["Tracer", "CapturedContext", "wrap", "parse_traceparent", "get_tracer", "configure", "cache"]
