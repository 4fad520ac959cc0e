from config.live import ProjectGroupConsumer
from ingest.services import traces_group


class TracesConsumer(ProjectGroupConsumer):
    """Pushes ``traces.ingested``, ``traces.summarized`` and ``resources.ingested`` events of one project
    to its open pages (members only)."""

    group_for = staticmethod(traces_group)

    async def traces_ingested(self, event):
        await self.send_json({"type": "traces.ingested", "spans": event["spans"], "trace_ids": event["trace_ids"]})

    async def resources_ingested(self, event):
        await self.send_json({"type": "resources.ingested", "samples": event["samples"], "hosts": event["hosts"]})

    async def traces_summarized(self, event):
        """New or updated per-trace summaries (``analytics.summarizer``): the explorer adds the rows."""
        await self.send_json({"type": "traces.summarized", "count": event["count"], "trace_ids": event["trace_ids"]})
