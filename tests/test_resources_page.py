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


# --- over time -----------------------------------------------------------------------------------
from datetime import datetime, timedelta, timezone  # noqa: E402

from analytics.selectors import bucket_seconds, resources_hosts, resources_series  # noqa: E402

S = 10**9


def test_bucket_width_keeps_the_range_within_the_point_budget():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert bucket_seconds(start=now - timedelta(minutes=15), end=now) == 10
    assert bucket_seconds(start=now - timedelta(hours=1), end=now) == 30
    assert bucket_seconds(start=now - timedelta(hours=24), end=now) == 900  # 96 points
    assert bucket_seconds(start=now - timedelta(days=30), end=now) == 3 * 3600  # 240 points
    for days in (1, 7, 30, 90):
        step = bucket_seconds(start=now - timedelta(days=days), end=now)
        assert days * 86400 / step <= 240


def test_series_buckets_average_and_peak_and_leave_gaps(make_user, project_with_key):
    mine, _ = project_with_key()
    other, _ = project_with_key()
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=1)  # within the TTL
    start = end - timedelta(minutes=15)  # 10 s buckets
    t0 = int(start.timestamp()) * S
    get_store().insert("resource_samples", [
        # bucket 0: two host samples; CPU averaged, memory % the peak
        sample(mine.pk, "h1", t=t0 + 1 * S, cpu_percent=60.0, memory_used=1, memory_total=4),
        sample(mine.pk, "h1", t=t0 + 6 * S, cpu_percent=80.0, memory_used=3, memory_total=4),
        # bucket 2 (bucket 1 has no sample: a gap)
        sample(mine.pk, "h1", t=t0 + 21 * S, cpu_percent=10.0),
        sample(mine.pk, "h1", 0, t=t0 + 2 * S, gpu_name="H100", gpu_utilization=90.0, gpu_memory_used=90,
               gpu_memory_total=100, gpu_temperature=70.0, gpu_power_watts=400.0,
               process_pids=[11, 12], process_names=["vllm", "py"], process_gpu_memory=[2 * 2**30, 2**30]),
        sample(mine.pk, "h1", 0, t=t0 + 4 * S, gpu_utilization=50.0, gpu_memory_used=80, gpu_memory_total=100,
               process_pids=[11], process_names=["vllm"], process_gpu_memory=[3 * 2**30]),
        sample(mine.pk, "h2", t=t0 + 1 * S, cpu_percent=5.0),
        sample(other.pk, "secret", t=t0 + 1 * S, cpu_percent=99.0),
    ], tag="tests.resources")
    series = resources_series(project_id=mine.pk, start=start, end=end)
    assert series.step_seconds == 10 and len(series.times) == 91
    assert [h.host for h in series.hosts] == ["h1", "h2"]  # never another project's host
    h1 = series.hosts[0]
    assert h1.values["cpu_percent"][:3] == [70.0, None, 10.0]
    assert h1.values["memory_percent"][:3] == [75.0, None, None]  # 3rd sample carried no memory: missing, not 0
    assert all(v is None for v in h1.values["cpu_percent"][3:])
    (gpu,) = series.gpus
    assert gpu.label == "h1 · GPU 0" and gpu.gpu_name == "H100"
    assert gpu.values["gpu_utilization"][0] == 70.0
    assert gpu.values["gpu_memory_percent"][0] == 90.0
    assert gpu.values["gpu_temperature"][0] == 70.0 and gpu.values["gpu_power_watts"][0] == 400.0
    procs = {p.pid: p for p in series.processes}
    assert procs[11].memory_bytes[0] == 3 * 2**30 and procs[12].memory_bytes[0] == 2**30
    assert procs[11].memory_bytes[1] is None
    only_h2 = resources_series(project_id=mine.pk, start=start, end=end, host="h2")
    assert [h.host for h in only_h2.hosts] == ["h2"] and only_h2.gpus == []


def test_request_rate_and_p95_beside_the_resources_come_from_the_rollups(client, make_user, project_with_key):
    from analytics.rollup_services import rollups_rebuild

    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    now = time.time_ns()
    t0 = (now - 30 * 60 * S) // (300 * S) * (300 * S)  # a 5-minute bucket start, half an hour ago
    rows = [trace_row(mine.pk, f"{i:032x}", t0 + S * (1 + i), e2e_ms, version=1)
            for i, e2e_ms in enumerate([100, 200, 300, 400])]
    rows.append(trace_row(mine.pk, f"{0:032x}", t0 + S, 5000, version=2))  # re-summarised: latest wins
    get_store().insert("traces", rows, tag="tests.resources")
    rollups_rebuild(project_id=mine.pk, from_ns=t0, to_ns=t0 + 60 * S)
    client.force_login(alice)
    body = client.get("/resources/series.json?range=6h").json()  # 5-minute buckets, from the rollups
    assert body["step_seconds"] == 300
    i = body["times"].index(datetime.fromtimestamp(t0 / S, tz=timezone.utc).isoformat())
    assert body["load"]["rps"][i] == pytest.approx(4 / 300)
    assert body["load"]["rps"][i - 1] == 0.0 and body["load"]["p95_e2e_ms"][i - 1] is None
    assert body["load"]["p95_e2e_ms"][i] == pytest.approx(5000, rel=0.005)  # nearest rank of 4: the largest
    rps = body["figures"]["fig-rps"]["data"][0]["y"]
    assert rps[i] == pytest.approx(4 / 300)


def trace_row(project_id, trace_id, start_ns, e2e_ms, *, version):
    e2e = int(e2e_ms * 1e6)
    return {"project_id": project_id, "trace_id": trace_id, "start_time": start_ns, "e2e_ns": e2e, "has_root": 1,
            "spans_start": start_ns, "spans_end": start_ns + e2e, "root_name": "chat", "service": "api",
            "model": "m", "services": ["api"], "models": ["m"], "phases": ["inference"], "status": "ok",
            "error_message": "", "ttft_ns": None, "tpot_ns": None, "input_tokens": 0, "output_tokens": 0,
            "cost_usd": None, "cost_estimated": 0, "span_count": 1, "network_ns": 0, "preprocess_ns": 0,
            "inference_ns": e2e, "postprocess_ns": 0, "other_ns": 0, "version": version, "error_spans": 0,
            "model_input_tokens": {}, "model_output_tokens": {}, "model_cost_usd": {}, "cache": 0}


def test_page_and_json_draw_the_series_of_the_users_project_only(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    project_with_key(members=[bob])
    now = time.time_ns()
    get_store().insert("resource_samples", [
        sample(mine.pk, "gpu-node-1", 0, t=now - 30 * S, gpu_memory_used=90, gpu_memory_total=100, gpu_utilization=40.0),
        sample(mine.pk, "gpu-node-1", t=now - 30 * S, cpu_percent=72.0),
    ], tag="tests.resources")
    client.force_login(alice)
    page = client.get("/resources/?range=15m")
    assert page.status_code == 200
    html = page.content.decode()
    assert '<option value="gpu-node-1">gpu-node-1</option>' in html  # a host choice
    for chart in ("fig-gpu-util", "fig-gpu-mem", "fig-gpu-temp", "fig-gpu-power", "fig-gpu-proc", "fig-host-cpu",
                  "fig-host-mem", "fig-rps", "fig-p95"):
        assert f'data-figure="{chart}"' in html
    body = client.get("/resources/series.json?range=15m").json()
    mem = body["figures"]["fig-gpu-mem"]
    assert [t["name"] for t in mem["data"]] == ["gpu-node-1 · GPU 0"]
    assert 90.0 in mem["data"][0]["y"]
    assert any(s.get("y0") == 85.0 for s in mem["layout"]["shapes"])  # the 85 % line
    assert any(s.get("y0") == 50.0 for s in body["figures"]["fig-gpu-util"]["layout"]["shapes"])  # the 50 % line
    cpu = body["figures"]["fig-host-cpu"]
    assert 72.0 in cpu["data"][0]["y"] and any(s.get("y0") == 70.0 for s in cpu["layout"]["shapes"])
    assert body["step_seconds"] == 10
    assert {d["host"] for d in body["devices"]} == {"gpu-node-1"}
    bad = client.get("/resources/series.json?range=2y")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_window"
    client.force_login(bob)
    assert client.get("/resources/series.json?range=15m").json()["devices"] == []
    assert client.get(f"/resources/series.json?project={mine.pk}").status_code == 404


def test_firing_alerts_are_marked_on_the_charts_with_a_link(client, make_user, project_with_key):
    from django.utils import timezone as dj_timezone

    from alerts.models import AlertRule, AlertSeries, SeriesState

    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    rule = AlertRule.objects.filter(project=mine).first()  # every project starts with the default rules
    assert rule is not None
    AlertRule.objects.filter(pk=rule.pk).update(name="GPU <b>memory</b>")
    fired = dj_timezone.now() - timedelta(minutes=3)
    AlertSeries.objects.create(rule=rule, project=mine, key="host=gpu-node-1", labels={"host": "gpu-node-1"},
                               state=SeriesState.FIRING, fired_at=fired, value=91.0)
    get_store().insert("resource_samples", [sample(mine.pk, "gpu-node-1", 0, gpu_memory_used=91, gpu_memory_total=100)],
                       tag="tests.resources")
    client.force_login(alice)
    mem = client.get("/resources/series.json?range=15m").json()["figures"]["fig-gpu-mem"]
    # Folded: a small marker linking to /alerts/, the rule's name (escaped: it is the user's) in its hover.
    notes = [a for a in mem["layout"]["annotations"] if "firing" in a.get("hovertext", "")]
    assert [a["text"] for a in notes] == ['<a href="/alerts/">⚑</a>']
    assert "GPU &lt;b&gt;memory&lt;/b&gt;" in notes[0]["hovertext"] and "<b>memory" not in notes[0]["hovertext"]
    lines = [s for s in mem["layout"]["shapes"] if s.get("yref") == "paper"]
    assert len(lines) == 1 and lines[0]["x0"] == fired.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def test_long_ranges_read_the_minute_rollup_with_the_same_figures(project_with_key):
    """Buckets of whole minutes come from ``resource_minute`` (kept by a materialized view on the
    samples): averages, peaks, gaps and per-process peaks as the raw samples give them."""
    mine, _ = project_with_key()
    other, _ = project_with_key()
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=30)
    start = end - timedelta(hours=6)  # 5-minute buckets
    block = 3 * 3600
    t0 = -(-int(start.timestamp()) // block) * block * S  # a 3-hour (so also 5-minute) bucket start in the window
    get_store().insert("resource_samples", [
        sample(mine.pk, "h1", t=t0 + 10 * S, cpu_percent=60.0, memory_used=1, memory_total=4),
        sample(mine.pk, "h1", t=t0 + 130 * S, cpu_percent=80.0, memory_used=3, memory_total=4),  # two minutes later
        sample(mine.pk, "h1", t=t0 + 610 * S, cpu_percent=10.0),  # two buckets on; no memory figure
        sample(mine.pk, "h1", 0, t=t0 + 20 * S, gpu_name="H100", gpu_utilization=90.0, gpu_memory_used=90,
               gpu_memory_total=100, gpu_temperature=70.0, gpu_power_watts=400.0,
               process_pids=[11, 12], process_names=["vllm", "py"], process_gpu_memory=[2 * 2**30, 2**30]),
        sample(mine.pk, "h1", 0, t=t0 + 200 * S, gpu_utilization=50.0, gpu_memory_used=80, gpu_memory_total=100,
               process_pids=[11], process_names=["vllm"], process_gpu_memory=[3 * 2**30]),
        sample(other.pk, "h1", t=t0 + 10 * S, cpu_percent=99.0),
    ], tag="tests.resources")
    series = resources_series(project_id=mine.pk, start=start, end=end)
    assert series.step_seconds == 300
    i = [int(t.timestamp()) * S for t in series.times].index(t0)
    (h1,) = series.hosts
    assert h1.values["cpu_percent"][i:i + 3] == [70.0, None, 10.0]  # averaged over the bucket's samples
    assert h1.values["memory_percent"][i:i + 3] == [75.0, None, None]  # the peak; missing is missing
    assert h1.values["cpu_percent"][i - 1] is None
    (gpu,) = series.gpus
    assert gpu.gpu_name == "H100" and gpu.values["gpu_utilization"][i] == 70.0
    assert gpu.values["gpu_memory_percent"][i] == 90.0 and gpu.values["gpu_temperature"][i] == 70.0
    procs = {p.pid: p for p in series.processes}
    assert procs[11].name == "vllm" and procs[11].memory_bytes[i] == 3 * 2**30
    assert procs[12].name == "py" and procs[12].memory_bytes[i] == 2**30 and procs[12].memory_bytes[i + 1] is None

    # 30 days: 3-hour buckets from the hour rollup (kept from the minutes by its own view).
    month = resources_series(project_id=mine.pk, start=end - timedelta(days=30), end=end)
    assert month.step_seconds == 3 * 3600
    j = [int(t.timestamp()) * S for t in month.times].index(t0 // (3 * 3600 * S) * (3 * 3600 * S))
    (h1,) = month.hosts
    assert h1.values["cpu_percent"][j] == pytest.approx((60 + 80 + 10) / 3) and h1.values["memory_percent"][j] == 75.0
    (gpu,) = month.gpus
    assert gpu.values["gpu_utilization"][j] == 70.0 and gpu.values["gpu_memory_percent"][j] == 90.0
    assert {p.pid: p.memory_bytes[j] for p in month.processes} == {11: 3 * 2**30, 12: 2**30}
    assert resources_hosts(project_id=mine.pk, start=end - timedelta(days=30), end=end) == ["h1"]
