"""When CI points the settings at PostgreSQL and Redis, the tests really run against them."""

import os
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection

from config.celery import app


@pytest.mark.django_db
def test_metadata_database_is_the_configured_one():
    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_celery_broker_is_the_configured_one():
    url = os.environ.get("CELERY_BROKER_URL")
    if not url:
        assert app.conf.task_always_eager and app.conf.broker_url == "memory://"
        return
    assert not app.conf.task_always_eager
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=2)  # a real Redis answers
        assert conn.transport_cls == "redis"


def test_channel_layer_round_trips_through_the_configured_backend():
    layer = get_channel_layer()
    expected = "RedisChannelLayer" if os.environ.get("TRACEDASH_CHANNEL_LAYER_URL") else "InMemoryChannelLayer"
    assert type(layer).__name__ == expected
    channel = async_to_sync(layer.new_channel)()
    message = {"type": "test.message", "id": uuid.uuid4().hex}
    async_to_sync(layer.send)(channel, message)
    assert async_to_sync(layer.receive)(channel) == message
