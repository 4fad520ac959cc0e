"""A small asyncio HTTP/1.1 client for OpenAI-compatible chat completions: keep-alive connections,
chunked and content-length bodies, Server-Sent Events. Standard library only.

Why not urllib/http.client: they block a thread per request, and an open-loop load generator needs
hundreds of requests in flight from one thread without its own latency getting in the way.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Callable, List, Optional, Tuple

USER_AGENT = b"tracedash-loadtest/0.1"
MAX_HEADER_BYTES = 64 * 1024


class HttpError(Exception):
    """The target answered something that is not HTTP we understand, or went away mid-response."""


class Target:
    """Where the chat completions go: ``base_url`` like ``http://127.0.0.1:8100/v1``."""

    def __init__(self, base_url: str, api_key: Optional[str] = None):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"target must be an http(s) URL such as http://127.0.0.1:8100/v1, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        path = parts.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            path += "/chat/completions"
        self.path = path
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port:
            host_header += f":{parts.port}"
        head = (f"POST {self.path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: {USER_AGENT.decode()}\r\n"
                "Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n")
        if api_key:
            head += f"Authorization: Bearer {api_key}\r\n"
        self._head = head.encode("latin-1")

    def request_bytes(self, body: bytes) -> bytes:
        return self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - already broken
            pass


class ConnectionPool:
    """Idle keep-alive connections to one target; a request takes one or opens a new one, so the
    number of connections follows the number of requests in flight (open loop: never a cap that
    would hold a request back)."""

    def __init__(self, target: Target, connect_timeout: float = 10.0):
        self.target = target
        self.connect_timeout = connect_timeout
        self._idle: List[_Conn] = []
        self._opening = 0
        self.opened = 0
        self._ssl = None
        if target.scheme == "https":
            import ssl

            self._ssl = ssl.create_default_context()

    def take_idle(self) -> Optional[_Conn]:
        """An idle keep-alive connection that still looks open, or None (never waits)."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.close()
        return None

    async def acquire(self) -> _Conn:
        conn = self.take_idle()
        if conn is not None:
            return conn
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.target.host, self.target.port, ssl=self._ssl, limit=MAX_HEADER_BYTES * 4),
            self.connect_timeout)
        self.opened += 1
        return _Conn(reader, writer)

    def keep_spare(self, n: int) -> None:
        """Open connections in the background until ``n`` are idle or opening, so the next arrivals
        find one ready and are sent on time even while the requests in flight keep growing."""
        while len(self._idle) + self._opening < n:
            self._opening += 1
            asyncio.ensure_future(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.target.host, self.target.port, ssl=self._ssl,
                                        limit=MAX_HEADER_BYTES * 4), self.connect_timeout)
        except (OSError, asyncio.TimeoutError):
            return  # the request that needs one will try, and report the failure
        finally:
            self._opening -= 1
        self.opened += 1
        self._idle.append(_Conn(reader, writer))

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable:
            self._idle.append(conn)
        else:
            conn.close()

    async def warm(self, n: int) -> None:
        """Open ``n`` connections ahead of time (so the first requests do not pay for connecting)."""
        conns = await asyncio.gather(*(self.acquire() for _ in range(n)), return_exceptions=True)
        for conn in conns:
            if isinstance(conn, _Conn):
                self._idle.append(conn)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


class ChatOutcome:
    """What one chat completion returned, with the client-side times (loop clock, seconds)."""

    __slots__ = ("status", "first_token", "output_tokens", "input_tokens", "error", "usage_output_tokens")

    def __init__(self) -> None:
        self.status = 0
        self.first_token: Optional[float] = None
        self.output_tokens = 0            # content chunks seen
        self.usage_output_tokens: Optional[int] = None  # the server's own count, when it sends usage
        self.input_tokens: Optional[int] = None
        self.error: Optional[str] = None


def _parse_head(head: bytes) -> Tuple[int, dict]:
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        raise HttpError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    try:
        status = int(status_line[1])
    except ValueError:
        raise HttpError(f"bad status line: {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict, on_data: Callable[[bytes], None]) -> bool:
    """Read the body, passing each piece to ``on_data``; True when the connection may be reused."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0], 16)
            except ValueError:
                raise HttpError(f"bad chunk size line {size_line[:40]!r}") from None
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                break
            data = await reader.readexactly(size + 2)
            on_data(data[:-2])
    elif b"content-length" in headers:
        length = int(headers[b"content-length"])
        if length:
            on_data(await reader.readexactly(length))
    else:  # read to EOF: the connection cannot be reused
        while True:
            data = await reader.read(65536)
            if not data:
                break
            on_data(data)
        return False
    return headers.get(b"connection", b"").lower() != b"close"


class _SSE:
    """Incremental Server-Sent Events parser for chat completion chunks."""

    __slots__ = ("buf", "outcome", "clock", "done", "on_first")

    def __init__(self, outcome: ChatOutcome, clock: Callable[[], float], on_first: Optional[Callable[[], None]]):
        self.buf = b""
        self.outcome = outcome
        self.clock = clock
        self.done = False
        self.on_first = on_first

    def feed(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            self._event(buf[start:end])
            start = end + 2
        self.buf = buf[start:]

    def _event(self, event: bytes) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise HttpError(f"unparsable stream chunk {payload[:60]!r}") from None
            out = self.outcome
            if isinstance(chunk, dict) and "error" in chunk:
                out.error = _error_text(chunk)
                continue
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("tool_calls"):
                    if out.first_token is None:
                        out.first_token = self.clock()
                        if self.on_first is not None:
                            self.on_first()
                    out.output_tokens += 1
            usage = chunk.get("usage")
            if usage:
                out.usage_output_tokens = usage.get("completion_tokens")
                out.input_tokens = usage.get("prompt_tokens")


def _error_text(data) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    return json.dumps(data)[:500]


def send_now(pool: ConnectionPool, body: bytes) -> Optional[_Conn]:
    """Write the request at once on an idle keep-alive connection (no await, so no event-loop turn
    between the planned moment and the send); None when every connection is busy."""
    conn = pool.take_idle()
    if conn is not None:
        conn.writer.write(pool.target.request_bytes(body))
    return conn


async def chat_completion(pool: ConnectionPool, body: bytes, *, stream: bool, clock: Callable[[], float],
                          sent_on: Optional[_Conn] = None, on_sent: Optional[Callable[[], None]] = None,
                          on_first_token: Optional[Callable[[], None]] = None) -> ChatOutcome:
    """POST one chat completion (or read the answer to one already written on ``sent_on`` by
    :func:`send_now`); fills a :class:`ChatOutcome`. Network and protocol failures are raised
    (``OSError``, ``HttpError``, ``asyncio.IncompleteReadError``); HTTP errors are returned with
    ``status`` and ``error`` set."""
    outcome = ChatOutcome()
    conn = sent_on
    reusable = False
    if conn is None:
        conn = await pool.acquire()
    try:
        if sent_on is None:
            if on_sent is not None:
                on_sent()
            conn.writer.write(pool.target.request_bytes(body))
        head = await conn.reader.readuntil(b"\r\n\r\n")
        status, headers = _parse_head(head[:-4])
        outcome.status = status
        ctype = headers.get(b"content-type", b"")
        if status == 200 and stream and ctype.startswith(b"text/event-stream"):
            sse = _SSE(outcome, clock, on_first_token)
            reusable = await _read_body(conn.reader, headers, sse.feed)
            if not sse.done and outcome.error is None:
                outcome.error = "stream ended without [DONE]"
        else:
            parts: List[bytes] = []
            reusable = await _read_body(conn.reader, headers, parts.append)
            raw = b"".join(parts)
            try:
                data = json.loads(raw) if raw else None
            except ValueError:
                data = None
            if status != 200:
                outcome.error = f"HTTP {status}: " + (_error_text(data) if data is not None else raw[:200].decode("utf-8", "replace"))
            elif not isinstance(data, dict) or not data.get("choices"):
                outcome.error = "response has no choices"
            else:
                now = clock()
                outcome.first_token = now  # not streamed: the whole answer is the first token
                if on_first_token is not None:
                    on_first_token()
                usage = data.get("usage") or {}
                outcome.usage_output_tokens = usage.get("completion_tokens")
                outcome.input_tokens = usage.get("prompt_tokens")
                outcome.output_tokens = outcome.usage_output_tokens or 1
        return outcome
    finally:
        pool.release(conn, reusable)
