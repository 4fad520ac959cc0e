"""Instrumentation of OpenAI-compatible clients, duck-typed (``openai`` is never imported).

``client.chat.completions.create`` is replaced on that client object by a wrapper that runs each
call in an ``inference`` span: model, input/output tokens (``usage``), ``finish_reason``, errors,
and for ``stream=True`` the time to first token, measured on the returned stream.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Mapping, Optional

from ._span import _CURRENT


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _is_given(value: Any) -> bool:
    return value is not None and type(value).__name__ != "NotGiven"


def _record_usage(span: Any, usage: Any) -> bool:
    if usage is None:
        return False
    prompt, completion = _get(usage, "prompt_tokens"), _get(usage, "completion_tokens")
    span.set_tokens(input=prompt if isinstance(prompt, int) else None,
                    output=completion if isinstance(completion, int) else None)
    return isinstance(completion, int)


def _finish_reasons(choices: Any) -> List[str]:
    reasons = []
    for choice in choices or ():
        reason = _get(choice, "finish_reason")
        if reason:
            reasons.append(str(reason))
    return reasons


def _record_response(span: Any, response: Any) -> None:
    model = _get(response, "model")
    if isinstance(model, str) and model:
        span.set_model(model)
    response_id = _get(response, "id")
    if isinstance(response_id, str):
        span.set_attribute("gen_ai.response.id", response_id)
    _record_usage(span, _get(response, "usage"))
    reasons = _finish_reasons(_get(response, "choices"))
    if reasons:
        span.set_attribute("finish_reason", ",".join(reasons))


def _has_output(delta: Any) -> bool:
    if delta is None:
        return False
    return bool(_get(delta, "content") or _get(delta, "tool_calls") or _get(delta, "refusal")
                or _get(delta, "reasoning_content") or _get(delta, "function_call"))


class _StreamObserver:
    """What the sync and async stream wrappers share: looking at each chunk, finishing the span."""

    def __init__(self, span: Any, injected_usage: bool):
        self._span = span
        self._injected = injected_usage
        self._done = False
        self._usage_seen = False
        self._content_chunks = 0
        self._reasons: List[str] = []

    def _observe(self, chunk: Any) -> bool:
        """Record what ``chunk`` says; True when it should be hidden from the caller (the usage-only
        chunk that exists only because we asked for it)."""
        span = self._span
        choices = _get(chunk, "choices") or ()
        for choice in choices:
            if _has_output(_get(choice, "delta")):
                span.mark_first_token()  # only the first call counts
                self._content_chunks += 1
                break
        self._reasons.extend(_finish_reasons(choices))
        model = _get(chunk, "model")
        if isinstance(model, str) and model:
            span.set_model(model)
        usage = _get(chunk, "usage")
        if usage is not None and _record_usage(span, usage):
            self._usage_seen = True
        return self._injected and not choices and usage is not None

    def _finish(self, exc: Optional[BaseException] = None) -> None:
        if self._done:
            return
        self._done = True
        span = self._span
        if not self._usage_seen and self._content_chunks:
            span.set_tokens(output=self._content_chunks)  # no usage: one token per content chunk
        if self._reasons:
            span.set_attribute("finish_reason", ",".join(self._reasons))
        if exc is not None and not isinstance(exc, GeneratorExit):
            span.record_exception(exc)
        span.end()

    def __del__(self) -> None:  # a stream dropped half-read still ends its span
        try:
            self._finish()
        except Exception:  # noqa: BLE001
            pass


class OpenAIStream(_StreamObserver):
    """Wraps the stream returned by ``create(stream=True)``; everything else reaches the original."""

    def __init__(self, span: Any, stream: Any, injected_usage: bool):
        super().__init__(span, injected_usage)
        self._stream = stream
        self._iterator: Any = None

    def __iter__(self) -> "OpenAIStream":
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        while True:
            try:
                chunk = next(self._iterator)
            except StopIteration:
                self._finish()
                raise
            except BaseException as exc:
                self._finish(exc)
                raise
            if not self._observe(chunk):
                return chunk

    def close(self) -> None:
        try:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()
        finally:
            self._finish()

    def __enter__(self) -> "OpenAIStream":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._stream, name)


class AsyncOpenAIStream(_StreamObserver):
    """The async client's stream, wrapped (``async for``)."""

    def __init__(self, span: Any, stream: Any, injected_usage: bool):
        super().__init__(span, injected_usage)
        self._stream = stream
        self._iterator: Any = None

    def __aiter__(self) -> "AsyncOpenAIStream":
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        while True:
            try:
                chunk = await self._iterator.__anext__()
            except StopAsyncIteration:
                self._finish()
                raise
            except BaseException as exc:
                self._finish(exc)
                raise
            if not self._observe(chunk):
                return chunk

    async def close(self) -> None:
        try:
            close = getattr(self._stream, "close", None) or getattr(self._stream, "aclose", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result
        finally:
            self._finish()

    aclose = close

    async def __aenter__(self) -> "AsyncOpenAIStream":
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        await self.close()
        return False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._stream, name)


async def _finish_async(span: Any, awaitable: Any, streaming: bool, injected: bool) -> Any:
    token = _CURRENT.set(span)
    try:
        result = await awaitable
    except BaseException as exc:
        span.record_exception(exc)
        span.end()
        raise
    finally:
        _CURRENT.reset(token)
    if streaming and _get(result, "choices") is None and hasattr(result, "__aiter__"):
        return AsyncOpenAIStream(span, result, injected)
    _record_response(span, result)
    span.end()
    return result


def instrument_openai(client: Any, tracer: Any = None, *, include_usage: bool = True) -> Any:
    """Trace every ``client.chat.completions.create`` call of an OpenAI-compatible client (sync
    ``OpenAI`` or ``AsyncOpenAI``, or anything shaped like them) in an ``inference`` span named
    ``chat <model>``, child of the current span. Records the model (the response's, else the
    request's), ``usage`` tokens, a ``finish_reason`` attribute and errors; with ``stream=True`` it
    wraps the returned stream to record the time to first token (first chunk with content) and,
    when the caller did not set ``stream_options``, asks for ``{"include_usage": True}`` (the extra
    usage-only chunk is hidden from the caller; without usage, content chunks are counted).
    ``include_usage=False`` never adds ``stream_options``. ``tracer`` defaults to
    :func:`get_tracer` at call time. Returns the client; instrumenting twice is a no-op."""
    completions = client.chat.completions
    original: Callable[..., Any] = completions.create
    if getattr(original, "_tracedash_original", None) is not None:
        return client

    def create(*args: Any, **kwargs: Any) -> Any:
        from ._tracer import get_tracer

        active = tracer if tracer is not None else get_tracer()
        model = kwargs.get("model")
        model = model if isinstance(model, str) else None
        streaming = kwargs.get("stream") is True
        span = active.span(f"chat {model}" if model else "chat", phase="inference", model=model,
                           attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model or "",
                                       "gen_ai.request.stream": streaming})
        if not span.is_recording:
            return original(*args, **kwargs)
        injected = False
        if streaming and include_usage and not _is_given(kwargs.get("stream_options")):
            kwargs["stream_options"] = {"include_usage": True}
            injected = True
        token = _CURRENT.set(span)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            span.record_exception(exc)
            span.end()
            raise
        finally:
            _CURRENT.reset(token)
        if inspect.isawaitable(result):
            return _finish_async(span, result, streaming, injected)
        if streaming and _get(result, "choices") is None and hasattr(result, "__iter__"):
            return OpenAIStream(span, result, injected)
        _record_response(span, result)
        span.end()
        return result

    create._tracedash_original = original  # type: ignore[attr-defined]
    create.__wrapped__ = original  # type: ignore[attr-defined]
    create.__doc__ = getattr(original, "__doc__", None)
    completions.create = create
    return client


__all__ = ["instrument_openai", "OpenAIStream", "AsyncOpenAIStream"]
