"""End to end: the agent (``--once``, in this process: the embedded ClickHouse belongs to it) with a
fake NVML, against the real server (uvicorn) -> rows in ClickHouse ``resource_samples``."""

from __future__ import annotations

import os
import sys

import psutil
import pytest

from agent import cli
from store import get_store
from tests.conftest import wait_until
from tests.fake_nvml import GiB, FakeGpu, FakeNvml

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db(transaction=True)]

COLUMNS = ("host, gpu_index, gpu_uuid, gpu_name, gpu_utilization, gpu_memory_used, gpu_memory_total, gpu_temperature, "
           "gpu_power_watts, cpu_percent, memory_used, memory_total, process_pids, process_names, process_gpu_memory, "
           "toUnixTimestamp64Milli(time) AS time_ms")


def _rows(project_id):
    return get_store().query(
        f"SELECT {COLUMNS} FROM resource_samples WHERE project_id = {{p:UInt64}} ORDER BY time, gpu_index",
        {"p": project_id}, tag="tests.agent").dicts()


def test_agent_once_lands_in_resource_samples(asgi_server, project_with_key, monkeypatch):
    project, key = project_with_key()
    other, _ = project_with_key()
    me = os.getpid()
    fake = FakeNvml([
        FakeGpu("GPU-e2e-0", "Fake H100 80GB HBM3", memory_used=70 * GiB, memory_total=80 * GiB, utilization=97,
                temperature=71, power_mw=350_500, compute=[(me, 60 * GiB), (4242, GiB)], graphics=[(me, 60 * GiB)]),
        FakeGpu("GPU-e2e-1", "Fake H100 80GB HBM3", memory_used=GiB, memory_total=80 * GiB, utilization=0,
                temperature=35, power_mw=70_000),
    ])
    fake.fail(1, "nvmlDeviceGetPowerUsage", fake.NVMLError_NotSupported)  # missing stays missing (NULL), never 0
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    assert cli.main(["--endpoint", asgi_server.url, "--api-key", key, "--once", "--host", "gpu-e2e"], environ={}) == 0

    rows = wait_until(lambda: len(_rows(project.pk)) == 3 and _rows(project.pk), message="three resource samples")
    assert _rows(other.pk) == []  # the key's project only
    host, gpu0, gpu1 = rows
    assert {r["host"] for r in rows} == {"gpu-e2e"} and len({r["time_ms"] for r in rows}) == 1

    assert host["gpu_index"] == -1 and host["gpu_uuid"] == "" and host["gpu_memory_used"] is None
    assert 0 <= host["cpu_percent"] <= 100
    assert host["memory_total"] == psutil.virtual_memory().total and 0 < host["memory_used"] <= host["memory_total"]

    assert (gpu0["gpu_index"], gpu0["gpu_uuid"], gpu0["gpu_name"]) == (0, "GPU-e2e-0", "Fake H100 80GB HBM3")
    assert gpu0["gpu_memory_used"] == 70 * GiB and gpu0["gpu_memory_total"] == 80 * GiB
    assert gpu0["gpu_memory_used"] / gpu0["gpu_memory_total"] == pytest.approx(0.875)
    assert gpu0["gpu_utilization"] == pytest.approx(97) and gpu0["gpu_temperature"] == pytest.approx(71)
    assert gpu0["gpu_power_watts"] == pytest.approx(350.5)
    assert gpu0["cpu_percent"] is None and gpu0["memory_used"] is None
    assert gpu0["process_pids"] == [me, 4242]  # compute and graphics merged, one entry per PID
    assert gpu0["process_gpu_memory"] == [60 * GiB, GiB]
    assert gpu0["process_names"][0] == psutil.Process(me).name()

    assert (gpu1["gpu_index"], gpu1["gpu_uuid"]) == (1, "GPU-e2e-1")
    assert gpu1["gpu_utilization"] == 0 and gpu1["gpu_power_watts"] is None
    assert gpu1["process_pids"] == [] and gpu1["process_gpu_memory"] == []


def test_agent_once_with_a_wrong_key_stores_nothing_and_exits_1(asgi_server, project_with_key, monkeypatch):
    project, _ = project_with_key()
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=FakeNvml().NVMLError_LibraryNotFound))
    assert cli.main(["--endpoint", asgi_server.url, "--api-key", "td_not_a_real_key", "--once", "--host", "x"],
                    environ={}) == 1
    assert _rows(project.pk) == []
