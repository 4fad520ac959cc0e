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
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer

log = logging.getLogger("tracedash.live")

_server_loop: asyncio.AbstractEventLoop | None = None
SEND_TIMEOUT_SECONDS = 5.0


def server_loop_register(loop: asyncio.AbstractEventLoop) -> None:
    """Called by consumers on connect: the loop that serves the websockets."""
    global _server_loop
    _server_loop = loop


def nobody_listens(layer, group: str) -> bool:
    """Whether a send to ``group`` would reach no one, known without a round trip: the in-memory
    layer (embedded mode) holds its groups in this process, and an empty one means no page of the
    project is open. A send to it would still build the event and schedule a task per request (a
    few per cent of a 100-span ingest request's time on the event loop). A Redis layer's groups
    live in Redis: always sent."""
    return isinstance(layer, InMemoryChannelLayer) and not layer.groups.get(group)


async def _bounded_send(layer, group: str, message: dict) -> None:
    # A Redis that accepts connections but answers nothing (frozen, overloaded) must not hold a
    # task or the beat: the event is given up after SEND_TIMEOUT_SECONDS (TimeoutError, logged).
    await asyncio.wait_for(layer.group_send(group, message), SEND_TIMEOUT_SECONDS)


def _send_logged(layer, group: str, message: dict) -> None:
    try:
        async_to_sync(_bounded_send)(layer, group, message)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently; the data is stored
        log.exception("live event %s to %s failed", message.get("type"), group)


def group_send(group: str, message: dict, *, wait: bool = True) -> None:
    """``channel_layer.group_send`` from synchronous code, on whichever thread it runs."""
    from channels.layers import get_channel_layer

    try:
        layer = get_channel_layer()
        if layer is None or nobody_listens(layer, group):
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
            sender = threading.Thread(target=_send_logged, args=(layer, group, message),
                                      name="live-send", daemon=True)
            sender.start()
            if wait:
                sender.join(SEND_TIMEOUT_SECONDS)
        else:
            _send_logged(layer, group, message)
    except Exception:  # noqa: BLE001 - logged, never swallowed silently; the data is stored
        log.exception("live event %s to %s failed", message.get("type"), group)


class ProjectGroupConsumer(AsyncJsonWebsocketConsumer):
    """A websocket that joins one group of the project in its URL, for members only.

    Subclasses name the group (``group_for(project_id)``) and handle its events. A non-member's
    socket is accepted, then closed with 4403: a refused handshake reaches the browser as 1006,
    and the page could not tell "not allowed" (stop) from "server restarting" (reconnect).
    """

    @staticmethod
    def group_for(project_id: int) -> str:
        raise NotImplementedError

    async def connect(self):
        from projects.selectors import project_for_user

        server_loop_register(asyncio.get_running_loop())
        user = self.scope.get("user")
        project_id = self.scope["url_route"]["kwargs"]["project_id"]
        project = await database_sync_to_async(project_for_user)(user=user, project_id=project_id) if user else None
        if project is None:
            await self.accept()
            await self.close(code=4403)
            return
        self.group = self.group_for(project.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)
