"""Live resource updates: ``resources.ingested`` reaches members' open pages after samples are
ingested (native API) or recorded by the embedded sampler (a thread outside the server's loop)."""

import asyncio
import json
import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from tests.test_live import _session_headers

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def test_members_receive_resources_ingested_from_the_api_and_the_sampler(project_with_key, make_user):
    async_to_sync(_scenario)(project_with_key, make_user)


async def _scenario(project_with_key, make_user):
    alice = await sync_to_async(make_user)("alice")
    project, key = await sync_to_async(project_with_key)("live-res", members=[alice])
    member = WebsocketCommunicator(application, f"/ws/projects/{project.pk}/traces/",
                                   headers=await sync_to_async(_session_headers)(alice))
    assert (await member.connect())[0]
    samples = [{"time": time.time_ns(), "host": "gpu-a", "gpu_index": -1, "cpu_percent": 12.5},
               {"time": time.time_ns(), "host": "gpu-b", "gpu_index": 0, "gpu_utilization": 90.0}]
    response = await sync_to_async(Client().post)(
        "/api/v1/resources", data=json.dumps({"samples": samples}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    assert await member.receive_json_from(timeout=5) == {"type": "resources.ingested", "samples": 2,
                                                         "hosts": ["gpu-a", "gpu-b"]}

    # The embedded sampler records from a plain thread: the event is handed to the loop serving
    # the socket and arrives without anything else waking that loop.
    from agent.tasks import resource_samples_record

    row = {"time": time.time_ns(), "host": "local", "gpu_index": -1, "gpu_uuid": "", "gpu_name": "",
           "gpu_utilization": None, "gpu_memory_used": None, "gpu_memory_total": None, "gpu_temperature": None,
           "gpu_power_watts": None, "cpu_percent": 3.0, "memory_used": 1, "memory_total": 2,
           "process_pids": [], "process_names": [], "process_gpu_memory": []}
    sampler = threading.Thread(target=resource_samples_record, kwargs={"rows": [row], "project_ids": [project.pk]})
    sampler.start()
    await asyncio.get_running_loop().run_in_executor(None, sampler.join)
    assert await member.receive_json_from(timeout=5) == {"type": "resources.ingested", "samples": 1, "hosts": ["local"]}
    await member.disconnect()
