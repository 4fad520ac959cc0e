"""Live updates over the websocket: members of the project get ``traces.ingested``; others don't."""

import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]


def _session_headers(user):
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    return [(b"cookie", f"sessionid={cookie}".encode()), (b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]


def test_members_receive_ingested_event_and_outsiders_are_refused(project_with_key, make_user):
    async_to_sync(_scenario)(project_with_key, make_user)


async def _scenario(project_with_key, make_user):
    alice, mallory = await sync_to_async(make_user)("alice"), await sync_to_async(make_user)("mallory")
    project, key = await sync_to_async(project_with_key)("live", members=[alice])
    path = f"/ws/projects/{project.pk}/traces/"

    intruder = WebsocketCommunicator(application, path, headers=await sync_to_async(_session_headers)(mallory))
    assert (await intruder.connect())[0]
    assert await intruder.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    anonymous = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")])
    assert (await anonymous.connect())[0]
    assert await anonymous.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}

    member = WebsocketCommunicator(application, path, headers=await sync_to_async(_session_headers)(alice))
    connected, _ = await member.connect()
    assert connected
    spans = llm_trace()
    client = Client()
    response = await sync_to_async(client.post)(
        "/api/v1/traces", data=json.dumps({"spans": spans}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    event = await member.receive_json_from(timeout=5)
    assert event == {"type": "traces.ingested", "spans": 5, "trace_ids": [spans[0]["trace_id"]]}
    await member.disconnect()
