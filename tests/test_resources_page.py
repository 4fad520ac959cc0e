"""/resources/: the latest figures per host and GPU, scoped to the user's project."""

import time

import pytest

from store import get_store

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]


def sample(project_id, host, gpu_index=-1, t=None, **values):
    row = {"project_id": project_id, "time": t or time.time_ns(), "host": host, "gpu_index": gpu_index, "gpu_uuid": "",
           "gpu_name": "", "gpu_utilization": None, "gpu_memory_used": None, "gpu_memory_total": None,
           "gpu_temperature": None, "gpu_power_watts": None, "cpu_percent": None, "memory_used": None,
           "memory_total": None, "process_pids": [], "process_names": [], "process_gpu_memory": []}
    row.update(values)
    return row


def test_latest_figures_per_host_and_gpu(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    other, _ = project_with_key(members=[bob])
    now = time.time_ns()
    get_store().insert("resource_samples", [
        sample(mine.pk, "gpu-node-1", t=now - 20 * 10**9, cpu_percent=20.0, memory_used=1, memory_total=4),
        sample(mine.pk, "gpu-node-1", t=now, cpu_percent=75.5, memory_used=2, memory_total=4),
        sample(mine.pk, "gpu-node-1", 0, t=now - 10**9, gpu_name="H100", gpu_memory_used=86, gpu_memory_total=100,
               gpu_utilization=97.0),
        sample(mine.pk, "gpu-node-1", 0, t=now, gpu_name="H100", gpu_utilization=93.0),  # no memory figure this time
        sample(other.pk, "secret-host", cpu_percent=1.0),
    ], tag="tests.resources")
    client.force_login(alice)
    html = client.get("/resources/").content.decode()
    assert "secret-host" not in html
    host = html[html.index('data-host="gpu-node-1" data-gpu="-1"'):]
    host = host[:host.index("</tr>")]
    assert '<td class="num over">75.5</td>' in host and "50.0" in host  # CPU > 70 % flagged; memory 2/4
    gpu = html[html.index('data-host="gpu-node-1" data-gpu="0"'):]
    gpu = gpu[:gpu.index("</tr>")]
    assert "GPU 0 · H100" in gpu and "93.0" in gpu
    assert '<td class="num over">86.0</td>' in gpu  # last known memory %, at or over 85 %: flagged
    client.force_login(bob)
    assert "gpu-node-1" not in client.get("/resources/").content.decode()
