"""Alert configuration from the environment: evaluation interval, email URL, public URL, beat entry."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from config.env import ConfigError, load


def _load(tmp_path, **environ):
    return load({"TRACEDASH_DATA_DIR": str(tmp_path), **environ})


def test_defaults(tmp_path):
    env = _load(tmp_path)
    assert env.alerts_evaluate_seconds == 5.0
    assert env.email == {"EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend"}
    assert env.email_from == "tracedash@localhost" and env.public_url == ""


def test_smtp_urls(tmp_path):
    env = _load(tmp_path, TRACEDASH_EMAIL_URL="smtp://alerts%40corp:p%40ss@mail.corp:2525?starttls=0",
                TRACEDASH_PUBLIC_URL="https://td.example.com/")
    assert env.email["EMAIL_HOST"] == "mail.corp" and env.email["EMAIL_PORT"] == 2525
    assert env.email["EMAIL_HOST_USER"] == "alerts@corp" and env.email["EMAIL_HOST_PASSWORD"] == "p@ss"
    assert env.email["EMAIL_USE_TLS"] is False and env.email["EMAIL_USE_SSL"] is False
    assert env.public_url == "https://td.example.com"
    ssl = _load(tmp_path, TRACEDASH_EMAIL_URL="smtps://mail.corp").email
    assert ssl["EMAIL_PORT"] == 465 and ssl["EMAIL_USE_SSL"] is True and ssl["EMAIL_USE_TLS"] is False


@pytest.mark.parametrize("name, value, message", [
    ("TRACEDASH_EMAIL_URL", "http://mail", "expected smtp://"),
    ("TRACEDASH_EMAIL_URL", "smtp://mail?tls=1", "unknown option"),
    ("TRACEDASH_EMAIL_URL", "smtp:///", "names no host"),
    ("TRACEDASH_PUBLIC_URL", "td.example.com", "expected http(s)://"),
    ("TRACEDASH_ALERTS_EVALUATE_SECONDS", "0", "from 1 to 3600"),
    ("TRACEDASH_ALERTS_EVALUATE_SECONDS", "fast", "whole number"),
])
def test_bad_values_name_the_variable(tmp_path, name, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        _load(tmp_path, **{name: value})
    assert caught.value.variable == name


def test_the_beat_schedule_declares_the_evaluation_once():
    entry = settings.CELERY_BEAT_SCHEDULE["alerts-evaluate"]
    assert entry["task"] == "alerts.tasks.evaluate"
    assert entry["schedule"] == settings.ENV.alerts_evaluate_seconds
    from config.celery import app

    app.loader.import_default_modules()
    assert "alerts.tasks.evaluate" in app.tasks and "alerts.tasks.deliver_notification" in app.tasks
