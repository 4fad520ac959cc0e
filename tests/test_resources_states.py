"""/resources/ without GPU samples shows one card (no GPU has reported, the agent command with this
server's address, a copy button) instead of five empty GPU charts; the live JSON carries the
latest-figures table so the page redraws it with the charts."""

import time

import pytest

from store import get_store
from tests.test_resources_page import sample

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]
GPU_CHARTS = ("fig-gpu-util", "fig-gpu-mem", "fig-gpu-temp", "fig-gpu-power", "fig-gpu-proc")


def test_no_gpu_samples_is_one_card_with_the_agent_command_and_no_gpu_chart(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    get_store().insert("resource_samples", [sample(mine.pk, "cpu-box", cpu_percent=12.0)], tag="tests.resources")
    client.force_login(alice)
    html = client.get("/resources/?range=15m").content.decode()
    card = html[html.index('id="no-gpu"'):]
    card = card[:card.index("</section>")]
    assert "No GPU has reported" in card
    assert "python -m agent --endpoint http://testserver --api-key &lt;a key from Settings&gt;" in card
    assert 'data-copy="agent-command"' in card and f'/settings/?project={mine.pk}' in card
    for chart in GPU_CHARTS:
        assert f'data-figure="{chart}"' not in html
    assert 'data-figure="fig-host-cpu"' in html and 'data-figure="fig-rps"' in html  # the rest still drawn
    assert 'data-host="cpu-box" data-gpu="-1"' in html  # the host's latest figures


def test_a_gpu_sample_replaces_the_card_with_the_gpu_charts(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    get_store().insert("resource_samples", [sample(mine.pk, "gpu-a", 0, gpu_utilization=40.0, gpu_memory_used=40,
                                                   gpu_memory_total=100)], tag="tests.resources")
    client.force_login(alice)
    html = client.get("/resources/?range=15m").content.decode()
    assert 'id="no-gpu"' not in html
    for chart in GPU_CHARTS:
        assert f'data-figure="{chart}"' in html


def test_series_json_carries_the_latest_table(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    project_with_key(members=[bob])
    now = time.time_ns()
    get_store().insert("resource_samples", [
        sample(mine.pk, "gpu-a", 0, t=now - 10**9, gpu_name="H100", gpu_utilization=40.0, gpu_memory_used=30,
               gpu_memory_total=100),
        sample(mine.pk, "gpu-a", 0, t=now, gpu_name="H100", gpu_utilization=91.0),
    ], tag="tests.resources")
    client.force_login(alice)
    body = client.get("/resources/series.json?range=15m").json()
    assert body["has_gpu"] is True
    [row] = body["latest"]
    assert row["host"] == "gpu-a" and row["gpu_index"] == 0 and row["gpu_name"] == "H100"
    assert row["gpu_utilization"] == 91.0 and row["gpu_memory_percent"] == 30.0  # last known memory figure
    assert len(row["last_seen"]) == 19 and row["last_seen"][10] == " "
    client.force_login(bob)
    other = client.get("/resources/series.json?range=15m").json()
    assert other["latest"] == [] and other["has_gpu"] is False


def test_no_samples_at_all_draws_no_device_chart(client, make_user, project_with_key):
    alice = make_user()
    project_with_key(members=[alice])
    client.force_login(alice)
    html = client.get("/resources/?range=15m").content.decode()
    assert 'id="no-gpu"' in html and 'id="no-samples"' in html
    for chart in GPU_CHARTS + ("fig-host-cpu", "fig-host-mem"):
        assert f'data-figure="{chart}"' not in html
    assert 'data-figure="fig-rps"' in html  # the request rate still has its own data
