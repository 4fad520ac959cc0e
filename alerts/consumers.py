from config.live import ProjectGroupConsumer

from .services import alerts_group


class AlertsConsumer(ProjectGroupConsumer):
    """Pushes ``alerts.changed`` (the project's firing alerts after a transition) to its open pages
    (members only; others get close code 4403 like the traces socket)."""

    group_for = staticmethod(alerts_group)

    async def alerts_changed(self, event):
        await self.send_json({"type": "alerts.changed", "firing": event["firing"]})
