"""Spans, span contexts and the current-span context variable.

The hot path (creating, entering, ending a span) is kept to a few attribute stores: everything that
can wait — validation against the server's limits, JSON encoding — happens later on the exporter's
thread (``_encode.py``).
"""

from __future__ import annotations

import contextvars
import random
import time
import traceback
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    from ._exporter import SpanExporter

PHASES: Tuple[str, ...] = ("network", "preprocess", "inference", "postprocess", "other")
_PHASE_SET = frozenset(PHASES)
MAX_ATTRIBUTES = 128
MAX_EVENTS = 128

_getrandbits = random.getrandbits  # the module's generator is reseeded in forked children
_time_ns = time.time_ns
_perf_ns = time.perf_counter_ns

# Span times are read on the monotonic clock and turned into unix time by one offset for the whole
# process, so every span of a trace is on the same timeline: durations are exact and a child never
# seems to start before, or end after, its parent (reading both clocks per span would add the jitter
# between the two reads). The offset is checked again at most once a second, when a root span
# starts, and moved only when the wall clock was stepped (by more than 1 ms).
_clock_offset = _time_ns() - _perf_ns()
_next_clock_check = 0
_CLOCK_CHECK_NS = 1_000_000_000
_CLOCK_STEP_NS = 1_000_000


def _check_clock(now_perf: int) -> None:
    global _clock_offset, _next_clock_check
    _next_clock_check = now_perf + _CLOCK_CHECK_NS
    offset = _time_ns() - _perf_ns()
    if abs(offset - _clock_offset) > _CLOCK_STEP_NS:
        _clock_offset = offset


def now_ns() -> int:
    """Unix nanoseconds on the SDK's timeline (the monotonic clock, anchored to the wall clock)."""
    return _clock_offset + _perf_ns()

#: The current span of this context (a thread, an asyncio task, or a copied context).
_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("tracedash_current_span", default=None)

Event = Tuple[str, int, Optional[Mapping[str, Any]]]
AttributeValue = Union[str, int, float, bool]


def new_trace_id() -> str:
    """32 lowercase hex characters, never all zero."""
    n = _getrandbits(128)
    while not n:  # pragma: no cover - one chance in 2**128
        n = _getrandbits(128)
    return n.to_bytes(16, "big").hex()


def new_span_id() -> str:
    """16 lowercase hex characters, never all zero."""
    n = _getrandbits(64)
    while not n:  # pragma: no cover
        n = _getrandbits(64)
    return n.to_bytes(8, "big").hex()


def check_phase(phase: str) -> str:
    if phase not in _PHASE_SET:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}; got {phase!r}")
    return phase


class SpanContext:
    """The identity of a span as it travels between processes: trace id, span id and the sampling
    decision. ``Tracer.extract`` returns one; pass it as ``parent=`` to continue the trace."""

    __slots__ = ("trace_id", "span_id", "sampled", "remote")

    def __init__(self, trace_id: str, span_id: str, sampled: bool = True, remote: bool = False):
        self.trace_id = trace_id
        self.span_id = span_id
        self.sampled = sampled
        self.remote = remote

    @property
    def context(self) -> "SpanContext":
        return self

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SpanContext) and other.trace_id == self.trace_id
                and other.span_id == self.span_id and other.sampled == self.sampled)

    def __hash__(self) -> int:
        return hash((self.trace_id, self.span_id, self.sampled))

    def __repr__(self) -> str:
        return (f"SpanContext(trace_id={self.trace_id!r}, span_id={self.span_id!r}, "
                f"sampled={self.sampled!r}, remote={self.remote!r})")


class _SpanBase:
    """What recording and non-recording spans share: being the current span in a ``with`` block."""

    __slots__ = ("_parent", "_tokens")

    if TYPE_CHECKING:  # pragma: no cover
        trace_id: str
        span_id: str
        sampled: bool
        _parent: Any
        _tokens: Any  # None, one Token, or a list of them

    def __enter__(self):
        token = _CURRENT.set(self)
        previous = self._tokens
        # One token in the common case; a list only when the same span is entered again.
        self._tokens = token if previous is None else (previous + [token] if type(previous) is list else [previous, token])
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and exc_type is not GeneratorExit:
            self.record_exception(exc)
        self.end()
        tokens = self._tokens
        if tokens is None:
            return False
        if type(tokens) is list:
            token = tokens.pop()
            self._tokens = tokens if len(tokens) > 1 else tokens[0]
        else:
            token = tokens
            self._tokens = None
        try:
            _CURRENT.reset(token)
        except ValueError:  # entered in another context (e.g. across tasks): restore the parent
            _CURRENT.set(self._parent)
        return False

    @property
    def context(self) -> SpanContext:
        """This span's :class:`SpanContext` (ids and sampling decision)."""
        return SpanContext(self.trace_id, self.span_id, self.sampled)

    # Overridden by Span; no-ops for non-recording spans.
    def record_exception(self, exc: BaseException) -> None:  # pragma: no cover - overridden
        pass

    def end(self, end_time: Optional[int] = None) -> None:  # pragma: no cover - overridden
        pass


class NonRecordingSpan(_SpanBase):
    """A span of an unsampled trace: it carries ids (so the decision propagates to children and to
    other services) and ignores everything else. It is never queued or sent."""

    __slots__ = ("_trace_id", "_span_id")
    is_recording = False
    sampled = False
    name = ""
    phase_name = None
    service = ""
    model = None
    parent_span_id = None
    status = "ok"
    ended = False

    def __init__(self, trace_id: Optional[str] = None, span_id: Optional[str] = None, parent: Any = None):
        # Ids are made only when asked for (to propagate the trace): unsampled spans stay cheap.
        self._trace_id = trace_id
        self._span_id = span_id
        self._parent = parent
        self._tokens = None

    @property
    def trace_id(self) -> str:
        trace_id = self._trace_id
        if trace_id is None:
            parent = self._parent
            trace_id = self._trace_id = parent.trace_id if parent is not None else new_trace_id()
        return trace_id

    @property
    def span_id(self) -> str:
        span_id = self._span_id
        if span_id is None:
            span_id = self._span_id = new_span_id()
        return span_id

    def set_attribute(self, key: str, value: Any) -> "NonRecordingSpan":
        return self

    def set_attributes(self, attributes: Mapping[str, Any]) -> "NonRecordingSpan":
        return self

    def add_event(self, name: str, attributes: Optional[Mapping[str, Any]] = None,
                  timestamp: Optional[int] = None) -> "NonRecordingSpan":
        return self

    def set_model(self, model: str) -> "NonRecordingSpan":
        return self

    def set_tokens(self, input: Optional[int] = None, output: Optional[int] = None) -> "NonRecordingSpan":
        return self

    def set_cost(self, usd: float) -> "NonRecordingSpan":
        return self

    def set_ttft(self, seconds: float) -> "NonRecordingSpan":
        return self

    def mark_first_token(self) -> "NonRecordingSpan":
        return self

    def set_status(self, status: str, message: Optional[str] = None) -> "NonRecordingSpan":
        return self

    def record_exception(self, exc: BaseException) -> None:
        pass

    def phase(self, phase: str, name: Optional[str] = None) -> "NonRecordingSpan":
        check_phase(phase)
        return NonRecordingSpan(None, None, self)

    def cache(self, name: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> "CacheLookup":
        return CacheLookup(NonRecordingSpan(None, None, self))

    def end(self, end_time: Optional[int] = None) -> None:
        pass

    def score(self, name: str, value: Any, *, comment: Optional[str] = None, source: str = "sdk",
              author: Optional[str] = None, score_id: Optional[str] = None,
              data_type: Optional[str] = None) -> "NonRecordingSpan":
        """The trace is not recorded (sampled out): the score is checked, then dropped."""
        from ._score import build_score

        build_score(self.trace_id, name, value, span_id=self.span_id, comment=comment, source=source, author=author,
                    score_id=score_id, data_type=data_type)
        return self

    def _add_output_tokens(self, n: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"NonRecordingSpan(trace_id={self.trace_id!r}, span_id={self.span_id!r})"


class Span(_SpanBase):
    """A timed piece of a trace, recorded and sent when it ends.

    Use it as a context manager (``with tracer.span(...) as s:``): it is the current span inside
    the block, ends at the end of the block, and records an exception that escapes the block
    (status ``error``, the message and an ``exception`` event) before re-raising it. Setters
    return the span, so they chain; after :meth:`end` they do nothing.
    """

    __slots__ = ("trace_id", "span_id", "sampled", "_exporter", "_tracer", "parent_span_id", "name", "phase_name", "service", "model",
                 "start_time", "_start_perf", "end_time", "status", "status_message", "ttft_ms",
                 "input_tokens", "output_tokens", "cost_usd", "attributes", "events", "ended")
    is_recording = True

    def __init__(self, tracer: Any, exporter: "SpanExporter", name: str, trace_id: str,
                 parent_span_id: Optional[str], phase: Optional[str], service: str, model: Optional[str],
                 attributes: Optional[Mapping[str, Any]], parent: Any):
        self._tracer = tracer
        self._exporter = exporter
        self._parent = parent
        self._tokens = None
        self.trace_id = trace_id
        self.span_id = new_span_id()
        self.sampled = True
        self.parent_span_id = parent_span_id
        self.name = name
        self.phase_name = phase
        self.service = service
        self.model = model
        self.status = "ok"
        self.status_message: Optional[str] = None
        self.ttft_ms: Optional[float] = None
        self.input_tokens: Optional[int] = None
        self.output_tokens: Optional[int] = None
        self.cost_usd: Optional[float] = None
        self.attributes: Optional[Dict[str, Any]] = dict(attributes) if attributes else None
        self.events: Optional[List[Event]] = None
        self.end_time: Optional[int] = None
        self.ended = False
        self._start_perf = start = _perf_ns()
        if parent_span_id is None and start > _next_clock_check:
            _check_clock(start)
        self.start_time: int = _clock_offset + start

    # -- data ------------------------------------------------------------------------------------
    def set_attribute(self, key: str, value: AttributeValue) -> "Span":
        """Set one attribute. Values are str, int, float or bool (anything else is sent as its
        ``str()``); at most 128 attributes per span, values cut at 64 KiB."""
        if not self.ended:
            attributes = self.attributes
            if attributes is None:
                self.attributes = {key: value}
            elif key in attributes or len(attributes) < MAX_ATTRIBUTES:
                attributes[key] = value
        return self

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> "Span":
        """Set several attributes at once (see :meth:`set_attribute`)."""
        for key, value in attributes.items():
            self.set_attribute(key, value)
        return self

    def add_event(self, name: str, attributes: Optional[Mapping[str, Any]] = None,
                  timestamp: Optional[int] = None) -> "Span":
        """Record a point in time inside the span (at most 128 events). ``timestamp`` is unix
        nanoseconds; by default now, on the span's monotonic clock."""
        if not self.ended:
            if timestamp is None:
                timestamp = self.start_time + (_perf_ns() - self._start_perf)
            event = (name, int(timestamp), dict(attributes) if attributes else None)
            if self.events is None:
                self.events = [event]
            elif len(self.events) < MAX_EVENTS:
                self.events.append(event)
        return self

    def set_model(self, model: str) -> "Span":
        """The model this span called (e.g. ``"gpt-4o"``)."""
        if not self.ended:
            self.model = model
        return self

    def set_tokens(self, input: Optional[int] = None, output: Optional[int] = None) -> "Span":
        """Input (prompt) and output (completion) token counts; ``None`` leaves a count as it is."""
        if not self.ended:
            if input is not None:
                self.input_tokens = input
            if output is not None:
                self.output_tokens = output
        return self

    def set_cost(self, usd: float) -> "Span":
        """The cost of this span in US dollars."""
        if not self.ended:
            self.cost_usd = usd
        return self

    def set_ttft(self, seconds: float) -> "Span":
        """Time to first token, in seconds from the start of this span (sent as ``ttft_ms``)."""
        if not self.ended:
            self.ttft_ms = seconds * 1000.0
        return self

    def mark_first_token(self) -> "Span":
        """Record now as the first output token: sets ``ttft_ms`` from the span's start (on the
        monotonic clock) and adds a ``first_token`` event. Only the first call counts."""
        if not self.ended and self.ttft_ms is None:
            elapsed = _perf_ns() - self._start_perf
            self.ttft_ms = elapsed / 1e6
            self.add_event("first_token", timestamp=self.start_time + elapsed)
        return self

    def _add_output_tokens(self, n: int) -> None:
        if not self.ended:
            self.output_tokens = (self.output_tokens or 0) + n

    def set_status(self, status: str, message: Optional[str] = None) -> "Span":
        """``"ok"`` or ``"error"``, with an optional message."""
        if status not in ("ok", "error"):
            raise ValueError(f"status must be 'ok' or 'error', got {status!r}")
        if not self.ended:
            self.status = status
            if message is not None:
                self.status_message = message
        return self

    def record_exception(self, exc: BaseException) -> None:
        """Mark the span as failed: status ``error``, ``status_message`` ``"Type: message"``, and an
        ``exception`` event with ``exception.type``, ``exception.message`` and
        ``exception.stacktrace``."""
        if self.ended:
            return
        try:
            kind = type(exc)
            type_name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
            text = str(exc)
            self.status = "error"
            self.status_message = f"{kind.__name__}: {text}" if text else kind.__name__
            stack = "".join(traceback.format_exception(kind, exc, exc.__traceback__))
            self.add_event("exception", {"exception.type": type_name, "exception.message": text,
                                         "exception.stacktrace": stack})
        except Exception:  # noqa: BLE001 - a broken __str__ must not break the host app
            self.status = "error"
            self.status_message = type(exc).__name__

    # -- structure -------------------------------------------------------------------------------
    def phase(self, phase: str, name: Optional[str] = None) -> "Span":
        """A child span for one phase of the request, named after the phase unless ``name`` is
        given: ``with t.phase("inference"): ...``. Phases: network, preprocess, inference,
        postprocess, other."""
        check_phase(phase)
        return self._tracer.span(name or phase, phase=phase, parent=self)

    def cache(self, name: Optional[str] = None, attributes: Optional[Mapping[str, Any]] = None) -> "CacheLookup":
        """A child span for a cache lookup in front of the model (see :class:`CacheLookup`):
        ``with t.cache("semantic") as c: c.hit = ...``."""
        return self._tracer.cache(name, attributes=attributes, parent=self)

    def score(self, name: str, value: Any, *, comment: Optional[str] = None, source: str = "sdk",
              author: Optional[str] = None, score_id: Optional[str] = None,
              data_type: Optional[str] = None) -> "Span":
        """Score this span (``tracer.score(trace_id, ...)`` scores the trace as a whole): ``bool`` ->
        boolean, ``int``/``float`` -> numeric, ``str`` -> categorical. Sent in the background to
        ``POST /api/v1/scores`` with the spans; a bad argument raises ValueError/TypeError here."""
        self._tracer.score(self.trace_id, name, value, span_id=self.span_id, comment=comment, source=source,
                           author=author, score_id=score_id, data_type=data_type)
        return self

    @property
    def duration_ns(self) -> Optional[int]:
        """Nanoseconds from start to end (``None`` while the span runs)."""
        return None if self.end_time is None else self.end_time - self.start_time

    def end(self, end_time: Optional[int] = None) -> None:
        """End the span and hand it to the exporter. Idempotent; never blocks, never raises.
        ``end_time`` (unix ns) overrides the monotonic end."""
        if self.ended:
            return
        self.ended = True
        self.end_time = self.start_time + (_perf_ns() - self._start_perf) if end_time is None else int(end_time)
        try:
            self._exporter.on_end(self)
        except Exception:  # noqa: BLE001 - tracing must never break the host app
            pass

    def __repr__(self) -> str:
        return (f"Span(name={self.name!r}, phase={self.phase_name!r}, trace_id={self.trace_id!r}, "
                f"span_id={self.span_id!r}, parent_span_id={self.parent_span_id!r}, ended={self.ended!r})")


CACHE_HIT_ATTRIBUTE = "tracedash.cache.hit"
CACHE_NAME_ATTRIBUTE = "tracedash.cache.name"


class CacheLookup:
    """The span of one cache lookup in front of the model (``Tracer.cache``): phase ``preprocess``,
    named ``cache <name>`` (``cache`` without a name), with ``tracedash.cache.name``.

    Set :attr:`hit` inside the block — ``True`` when the cache answered, ``False`` when it missed —
    and the span carries ``tracedash.cache.hit``, which the server's cache figures count (a request
    is a hit when any of its spans is). Until it is set, the span says nothing about a hit: a lookup
    that raised, or that was skipped, is neither. Setting it again replaces the value; ``None``
    removes it. Everything else (``set_attribute``, ``add_event``, ``span_id`` …) is the span's.
    """

    __slots__ = ("span",)

    def __init__(self, span: "AnySpan"):
        self.span = span

    @property
    def hit(self) -> Optional[bool]:
        attributes = getattr(self.span, "attributes", None)
        return None if not attributes else attributes.get(CACHE_HIT_ATTRIBUTE)

    @hit.setter
    def hit(self, value: Any) -> None:
        span = self.span
        if value is None:
            if span.is_recording and not span.ended and span.attributes:
                span.attributes.pop(CACHE_HIT_ATTRIBUTE, None)
            return
        span.set_attribute(CACHE_HIT_ATTRIBUTE, bool(value))

    def __enter__(self) -> "CacheLookup":
        self.span.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return self.span.__exit__(exc_type, exc, tb)

    def end(self, end_time: Optional[int] = None) -> None:
        self.span.end(end_time)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.span, name)

    def __repr__(self) -> str:
        return f"CacheLookup(hit={self.hit!r}, span={self.span!r})"


AnySpan = Union[Span, NonRecordingSpan]
Parent = Union[Span, NonRecordingSpan, SpanContext, None]


def current_span() -> Optional[AnySpan]:
    """The span current in this context (thread or asyncio task), or ``None``."""
    current = _CURRENT.get()
    return current if isinstance(current, _SpanBase) else None
