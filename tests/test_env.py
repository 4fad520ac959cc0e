"""Settings come from the environment; a bad value fails at start naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import env

ROOT = Path(__file__).resolve().parent.parent


def test_unset_variables_mean_embedded_defaults(tmp_path):
    loaded = env.load({"TRACEDASH_DATA_DIR": str(tmp_path)})
    assert loaded.data_dir == tmp_path
    assert loaded.clickhouse is None and loaded.embedded_store
    assert loaded.database["ENGINE"] == "django.db.backends.sqlite3"
    assert loaded.database["NAME"] == str(tmp_path / "tracedash.sqlite3")
    assert loaded.broker_url is None and loaded.embedded_beat
    assert loaded.ingest_journal  # auto: on with the embedded store
    assert loaded.channel_layer_url is None
    assert (loaded.host, loaded.port) == ("127.0.0.1", 8000)
    # The generated secret key is kept, so sessions survive a restart.
    assert env.load({"TRACEDASH_DATA_DIR": str(tmp_path)}).secret_key == loaded.secret_key
    assert oct((tmp_path / "secret_key").stat().st_mode & 0o777) == "0o600"


def test_production_urls_are_parsed(tmp_path):
    loaded = env.load({
        "TRACEDASH_DATA_DIR": str(tmp_path),
        "TRACEDASH_CLICKHOUSE_URL": "clickhouse://td:p%40ss@ch.internal:9001/traces?connect_timeout=2",
        "DATABASE_URL": "postgres://td:secret@pg:5433/meta",
        "CELERY_BROKER_URL": "redis://redis:6379/0",
        "TRACEDASH_CHANNEL_LAYER_URL": "redis://redis:6379/1",
        "TRACEDASH_SECRET_KEY": "x" * 40,
        "PORT": "9000",
    })
    ch = loaded.clickhouse
    assert (ch.host, ch.port, ch.database, ch.user, ch.password, ch.connect_timeout) == (
        "ch.internal", 9001, "traces", "td", "p@ss", 2.0)
    assert loaded.database["ENGINE"] == "django.db.backends.postgresql"
    assert (loaded.database["HOST"], loaded.database["PORT"], loaded.database["NAME"]) == ("pg", "5433", "meta")
    assert loaded.broker_url == "redis://redis:6379/0" and not loaded.embedded_beat
    assert not loaded.ingest_journal  # auto: off with a ClickHouse server
    assert loaded.port == 9000 and loaded.secret_key == "x" * 40


@pytest.mark.parametrize("value, embedded, server", [("on", True, True), ("off", False, False), ("AUTO", True, False)])
def test_the_ingest_journal_can_be_forced_either_way(tmp_path, value, embedded, server):
    base = {"TRACEDASH_DATA_DIR": str(tmp_path), "TRACEDASH_INGEST_JOURNAL": value}
    assert env.load(base).ingest_journal is embedded
    assert env.load({**base, "TRACEDASH_CLICKHOUSE_URL": "clickhouse://ch/db"}).ingest_journal is server


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        ("TRACEDASH_CLICKHOUSE_URL", "http://ch:8123/db", "scheme 'http'"),
        ("TRACEDASH_CLICKHOUSE_URL", "clickhouse:///db", "names no host"),
        ("TRACEDASH_CLICKHOUSE_URL", "clickhouse://ch:notaport/db", "port"),
        ("TRACEDASH_CLICKHOUSE_URL", "clickhouse://ch/db;drop", "database name"),
        ("TRACEDASH_CLICKHOUSE_URL", "clickhouse://ch/db?timeout=3", "unknown option"),
        ("DATABASE_URL", "mysql://u@h/db", "scheme 'mysql'"),
        ("DATABASE_URL", "postgres://u@h:5432/", "names no database"),
        ("CELERY_BROKER_URL", "kafka://k:9092", "expected a URL"),
        ("TRACEDASH_CHANNEL_LAYER_URL", "amqp://rabbit", "expected a URL"),
        ("TRACEDASH_SECRET_KEY", "short", "at least 32"),
        ("TRACEDASH_DEBUG", "maybe", "expected 1/0"),
        ("TRACEDASH_RETENTION_DAYS", "-3", "from 1"),
        ("TRACEDASH_RETENTION_DAYS", "ten", "whole number"),
        ("PORT", "70000", "from 1 to 65535"),
        ("TRACEDASH_CLICKHOUSE_CLUSTER", "a b", "cluster name"),
        ("TRACEDASH_SUMMARY_ENGINE", "pandas", "expected one of auto, arrays, sql"),
        ("TRACEDASH_INGEST_JOURNAL", "sometimes", "expected one of auto, on, off"),
    ],
)
def test_bad_values_name_the_variable(tmp_path, variable, value, fragment):
    with pytest.raises(env.ConfigError) as caught:
        env.load({"TRACEDASH_DATA_DIR": str(tmp_path), variable: value})
    assert caught.value.variable == variable
    assert str(caught.value).startswith(f"{variable}: ")
    assert fragment in str(caught.value)


def test_data_dir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(env.ConfigError, match="TRACEDASH_DATA_DIR"):
        env.load({"TRACEDASH_DATA_DIR": str(path)})


def test_a_bad_value_stops_manage_py_at_start_with_a_clear_message(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environ.update(TRACEDASH_DATA_DIR=str(tmp_path), TRACEDASH_CLICKHOUSE_URL="mysql://nope")
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "configuration error: TRACEDASH_CLICKHOUSE_URL:" in done.stderr
    assert "Traceback" not in done.stderr
