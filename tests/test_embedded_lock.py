"""chdb opens a data directory from one process only: a second one gets a clear error."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.clickhouse
def test_second_process_on_the_same_data_dir_gets_a_clear_error(clickhouse_store):
    if settings.TRACEDASH_CLICKHOUSE is not None:
        pytest.skip("this run uses a ClickHouse server, not the embedded store")
    clickhouse_store.ping()  # this process holds the data directory now
    environ = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "TRACEDASH_CLICKHOUSE_URL")}
    environ["TRACEDASH_DATA_DIR"] = str(settings.DATA_DIR)
    done = subprocess.run([sys.executable, "manage.py", "migrate_clickhouse", "--check"], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    message = done.stderr
    assert f"data directory {settings.TRACEDASH_CLICKHOUSE_PATH} is in use by another process" in message
    assert "TRACEDASH_DATA_DIR" in message
    assert "Traceback" not in message
