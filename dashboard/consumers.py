import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from config.live import server_loop_register
from ingest.services import traces_group
from projects.selectors import project_for_user


class TracesConsumer(AsyncJsonWebsocketConsumer):
    """Pushes ``traces.ingested``, ``traces.summarized`` and ``resources.ingested`` events of one project
    to its open pages (members only)."""

    async def connect(self):
        user = self.scope.get("user")
        project_id = self.scope["url_route"]["kwargs"]["project_id"]
        project = await database_sync_to_async(project_for_user)(user=user, project_id=project_id) if user else None
        if project is None:
            # Accept, then close with 4403: a refused handshake reaches the browser as 1006, and
            # the page could not tell "not allowed" (stop) from "server restarting" (reconnect).
            await self.accept()
            await self.close(code=4403)
            return
        server_loop_register(asyncio.get_running_loop())
        self.group = traces_group(project.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def traces_ingested(self, event):
        await self.send_json({"type": "traces.ingested", "spans": event["spans"], "trace_ids": event["trace_ids"]})

    async def resources_ingested(self, event):
        await self.send_json({"type": "resources.ingested", "samples": event["samples"], "hosts": event["hosts"]})

    async def traces_summarized(self, event):
        """New or updated per-trace summaries (``dashboard.summarizer``): the explorer adds the rows."""
        await self.send_json({"type": "traces.summarized", "count": event["count"], "trace_ids": event["trace_ids"]})
