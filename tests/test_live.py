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
    assert await intruder.receive_output(timeout=30) == {"type": "websocket.close", "code": 4403}
    anonymous = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")])
    assert (await anonymous.connect())[0]
    assert await anonymous.receive_output(timeout=30) == {"type": "websocket.close", "code": 4403}

    member = WebsocketCommunicator(application, path, headers=await sync_to_async(_session_headers)(alice))
    connected, _ = await member.connect()
    assert connected
    spans = llm_trace()
    client = Client()
    response = await sync_to_async(client.post)(
        "/api/v1/traces", data=json.dumps({"spans": spans}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    event = await member.receive_json_from(timeout=30)
    assert event == {"type": "traces.ingested", "spans": 5, "trace_ids": [spans[0]["trace_id"]]}
    await member.disconnect()


@pytest.mark.parametrize("inside_loop", [False, True])
def test_live_send_from_sync_code_gives_up_on_a_frozen_redis(monkeypatch, caplog, inside_loop):
    """A Celery task or the embedded beat sending a live event while Redis is frozen (SIGSTOP:
    it accepts connections and answers nothing) is held at most SEND_TIMEOUT_SECONDS, and the
    failure is logged — the task goes on."""
    import asyncio
    import shutil
    import signal
    import time

    import channels.layers
    from channels_redis.core import RedisChannelLayer

    from config import live
    from tests.conftest import wait_until
    from tests.support.worker_server import start_redis_server
    from tests.test_serve import _free_port

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    redis = start_redis_server(port)
    try:
        layer = RedisChannelLayer(hosts=[f"redis://127.0.0.1:{port}/1"])
        monkeypatch.setattr(channels.layers, "get_channel_layer", lambda *a, **k: layer)
        monkeypatch.setattr(live, "SEND_TIMEOUT_SECONDS", 0.5)
        live.group_send("project-1-traces", {"type": "traces.ingested", "spans": 1})  # works while Redis answers
        redis.send_signal(signal.SIGSTOP)

        def send():
            started = time.monotonic()
            live.group_send("project-1-traces", {"type": "traces.ingested", "spans": 1})
            return time.monotonic() - started

        async def send_inside_a_loop():  # e.g. a task run by a worker thread that owns a loop
            return send()

        elapsed = asyncio.run(send_inside_a_loop()) if inside_loop else send()
        assert elapsed < 3, f"group_send held its caller {elapsed:.1f} s on a frozen Redis"
        # (inside a loop the send runs on a helper thread, which logs once its own wait ends)
        wait_until(lambda: any("live event traces.ingested" in r.getMessage() for r in caplog.records), timeout=30,
                   message="the failed live event is logged")
    finally:
        redis.send_signal(signal.SIGCONT)
        redis.kill()
        redis.wait(10)


def test_an_event_is_built_and_sent_only_when_a_page_listens(monkeypatch):
    """With the in-memory layer (embedded mode) an ingest request sends nothing to a project with
    no open page: the event is not even built. Once a page joins the group, it is sent. The layer
    is the in-memory one whatever this run configures (CI's second run configures Redis, whose
    groups live in Redis: always sent, checked at the end)."""
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    from config.live import nobody_listens
    from ingest import services
    from ingest.services import resources_notify_async, traces_group, traces_notify_async

    configured = get_channel_layer()
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(services, "get_channel_layer", lambda: layer)
    sent, built = [], []
    real_event = services._event

    async def record(group, message):
        sent.append((group, message["type"]))

    def event(rows):
        built.append(len(rows))
        return real_event(rows)

    monkeypatch.setattr(layer, "group_send", record)
    monkeypatch.setattr(services, "_event", event)
    rows = [{"trace_id": "a" * 32}, {"trace_id": "b" * 32}]
    samples = [{"host": "gpu-host-a"}]
    group = traces_group(987)
    async_to_sync(traces_notify_async)(project_id=987, rows=rows)
    async_to_sync(resources_notify_async)(project_id=987, rows=samples)
    assert sent == [] and built == []

    async_to_sync(layer.group_add)(group, "specific.test!listener")
    try:
        async_to_sync(traces_notify_async)(project_id=987, rows=rows)
        async_to_sync(resources_notify_async)(project_id=987, rows=samples)
    finally:
        async_to_sync(layer.group_discard)(group, "specific.test!listener")
    assert sent == [(group, "traces.ingested"), (group, "resources.ingested")] and built == [2]
    if not isinstance(configured, InMemoryChannelLayer):
        assert not nobody_listens(configured, traces_group(986)), "a Redis layer's empty group is not known here"
