"""Live events to open pages, sent from synchronous code (tasks, the embedded beat, sync views).

The in-memory channel layer (embedded mode) keeps its queues on the event loop that serves the
websockets: a send from another thread must be scheduled onto that loop, or the waiting consumer
is not woken until something else stirs it. A thread that runs a loop of its own cannot call
``async_to_sync``; it sends from a helper thread. Everything else (Redis layer, no server loop)
uses ``async_to_sync``. Consumers register the serving loop when a page connects.

A live event is a courtesy: the data is already stored, so a failure is logged, never raised.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from asgiref.sync import async_to_sync

log = logging.getLogger("tracedash.live")

_server_loop: asyncio.AbstractEventLoop | None = None
SEND_TIMEOUT_SECONDS = 5.0


def server_loop_register(loop: asyncio.AbstractEventLoop) -> None:
    """Called by consumers on connect: the loop that serves the websockets."""
    global _server_loop
    _server_loop = loop


def group_send(group: str, message: dict, *, wait: bool = True) -> None:
    """``channel_layer.group_send`` from synchronous code, on whichever thread it runs."""
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    try:
        layer = get_channel_layer()
        if layer is None:
            return
        loop = _server_loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if isinstance(layer, InMemoryChannelLayer) and loop is not None and loop.is_running() and running is not loop:
            future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
            if wait:
                future.result(SEND_TIMEOUT_SECONDS)
        elif running is not None:
            sender = threading.Thread(target=async_to_sync(layer.group_send), args=(group, message),
                                      name="live-send", daemon=True)
            sender.start()
            if wait:
                sender.join(SEND_TIMEOUT_SECONDS)
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently; the data is stored
        log.exception("live event %s to %s failed", message.get("type"), group)
