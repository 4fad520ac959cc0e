"""Duck-typed stand-ins for the OpenAI client (``client.chat.completions.create``); the SDK never
imports ``openai``, and neither do the tests."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace


def _chunk(content=None, role=None, finish_reason=None, usage=None, choices=True):
    choice = SimpleNamespace(index=0, delta=SimpleNamespace(role=role, content=content, tool_calls=None),
                             finish_reason=finish_reason)
    return SimpleNamespace(id="chatcmpl-1", model="gpt-4o-mini-2024-07-18", choices=[choice] if choices else [],
                           usage=usage)


def _chunks(include_usage):
    yield _chunk(role="assistant", content="")
    yield _chunk(content="Hello")
    yield _chunk(content=" there")
    yield _chunk(finish_reason="stop")
    if include_usage:
        yield _chunk(choices=False, usage=SimpleNamespace(prompt_tokens=12, completion_tokens=5, total_tokens=17))


def _response():
    return SimpleNamespace(
        id="chatcmpl-1", model="gpt-4o-mini-2024-07-18",
        choices=[SimpleNamespace(index=0, finish_reason="stop",
                                 message=SimpleNamespace(role="assistant", content="Hello there"))],
        usage=SimpleNamespace(prompt_tokens=12, completion_tokens=5, total_tokens=17))


class FakeStream:
    """Like ``openai.Stream``: iterable, closable, a context manager, with extra attributes."""

    def __init__(self, include_usage, first_token_delay):
        self._chunks = _chunks(include_usage)
        self._delay = first_token_delay
        self._first = True
        self.response_headers = {"x-request-id": "req-1"}
        self.closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._first:
            self._first = False
            time.sleep(self._delay)
        return next(self._chunks)

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FakeCompletions:
    def __init__(self, first_token_delay=0.0, fail=False):
        self.calls = []
        self.first_token_delay = first_token_delay
        self.fail = fail

    def create(self, **kwargs):
        self.calls.append(kwargs)
        if self.fail:
            raise ConnectionError("upstream down")
        if kwargs.get("stream"):
            include_usage = bool((kwargs.get("stream_options") or {}).get("include_usage"))
            return FakeStream(include_usage, self.first_token_delay)
        return _response()


class FakeClient:
    def __init__(self, **kwargs):
        self.chat = SimpleNamespace(completions=FakeCompletions(**kwargs))


class FakeAsyncStream:
    def __init__(self, include_usage, first_token_delay):
        self._chunks = _chunks(include_usage)
        self._delay = first_token_delay
        self._first = True

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._first:
            self._first = False
            await asyncio.sleep(self._delay)
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self):
        pass


class FakeAsyncCompletions(FakeCompletions):
    # Like openai's: a plain function that returns a coroutine (not an ``async def``).
    def create(self, **kwargs):
        return self._create(**kwargs)

    async def _create(self, **kwargs):
        self.calls.append(kwargs)
        await asyncio.sleep(0)
        if kwargs.get("stream"):
            include_usage = bool((kwargs.get("stream_options") or {}).get("include_usage"))
            return FakeAsyncStream(include_usage, self.first_token_delay)
        return _response()


class FakeAsyncClient:
    def __init__(self, **kwargs):
        self.chat = SimpleNamespace(completions=FakeAsyncCompletions(**kwargs))
