import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from config.live import server_loop_register
from projects.selectors import project_for_user

from .services import alerts_group


class AlertsConsumer(AsyncJsonWebsocketConsumer):
    """Pushes ``alerts.changed`` (the project's firing alerts after a transition) to its open pages
    (members only; others get close code 4403 like the traces socket)."""

    async def connect(self):
        server_loop_register(asyncio.get_running_loop())
        user = self.scope.get("user")
        project_id = self.scope["url_route"]["kwargs"]["project_id"]
        project = await database_sync_to_async(project_for_user)(user=user, project_id=project_id) if user else None
        if project is None:
            await self.accept()
            await self.close(code=4403)
            return
        self.group = alerts_group(project.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        group = getattr(self, "group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def alerts_changed(self, event):
        await self.send_json({"type": "alerts.changed", "firing": event["firing"]})
