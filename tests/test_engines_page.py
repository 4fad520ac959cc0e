"""/engines/ and /engines/series.json: inference engines' figures over time, scoped to the user's
project, beside the app-side latency of the traces — engine-side TTFT / E2E P95 and the app-side
P95 of the same buckets, with the band between them (time outside the engine) — computed on
seeded ``engine_samples`` and seeded traces, with the exact values."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

from analytics.rollup_services import rollups_rebuild
from dashboard.panels import GAP_CAPTIONS
from store import get_store
from tests.test_resources_page import trace_row

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

S = 10**9
GPU1 = "http://gpu-1:8000/metrics"
GPU2 = "http://gpu-2:30000/metrics"
LES = (0.1, 0.5, 1.0, math.inf)


def _ns(when: datetime) -> int:
    return int(when.timestamp()) * S


def _row(project_id, when, metric, value, *, le=0.0, engine="vllm", target=GPU1, model="llama", host="gpu-1"):
    return {"project_id": project_id, "time": _ns(when), "host": host, "engine": engine, "target": target,
            "model": model, "metric": metric, "le": le, "value": float(value)}


def _histogram(project_id, when, metric, cumulative, total, **labels):
    return [_row(project_id, when, metric, c, le=le, **labels) for le, c in zip(LES, cumulative)] + [
        _row(project_id, when, metric + "_sum", total, **labels)]


def _trace(project_id, n, when, *, model, ttft_ms, e2e_ms):
    row = trace_row(project_id, f"{n:032x}", _ns(when), e2e_ms, version=1)
    row.update(model=model, models=[model], ttft_ns=int(ttft_ms * 1e6))
    return row


def _window():
    """15 minutes (10-second points) ending on a whole minute half an hour ago: the app-side
    series reads ``traces`` exactly; the bucket ``T`` the samples fall in, and its index."""
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=30)
    start = end - timedelta(minutes=15)
    return start, end, start + timedelta(seconds=300), 30


def _query(start, end, **extra):
    q = f"?from={start.isoformat().replace('+00:00', 'Z')}&to={end.isoformat().replace('+00:00', 'Z')}"
    return q + "".join(f"&{k}={v}" for k, v in extra.items())


def _seed(project_id, t, other_project_id=None):
    """In bucket ``t`` (10 s): a vLLM instance serving "llama" (a model the traces name) and an
    SGLang one serving "qwen" (a model no trace names), and the app's traces of the same bucket."""
    before, after = t - timedelta(seconds=5), t + timedelta(seconds=5)
    rows = [
        # vLLM: 10 first tokens in (0.1, 0.5] s, 10 requests finished in (0.5, 1.0] s, queued in (0, 0.1] s
        *_histogram(project_id, before, "ttft_seconds", [0, 0, 0, 0], 0.0),
        *_histogram(project_id, after, "ttft_seconds", [0, 10, 10, 10], 3.0),
        *_histogram(project_id, before, "e2e_seconds", [0, 0, 0, 0], 0.0),
        *_histogram(project_id, after, "e2e_seconds", [0, 0, 10, 10], 7.5),
        *_histogram(project_id, before, "queue_seconds", [0, 0, 0, 0], 0.0),
        *_histogram(project_id, after, "queue_seconds", [10, 10, 10, 10], 0.5),
        _row(project_id, t + timedelta(seconds=2), "requests_running", 7),
        _row(project_id, t + timedelta(seconds=2), "requests_waiting", 3),
        _row(project_id, t + timedelta(seconds=7), "requests_waiting", 5),
        _row(project_id, t + timedelta(seconds=2), "kv_cache_usage", 80),
        _row(project_id, t + timedelta(seconds=7), "kv_cache_usage", 92.5),
        _row(project_id, before, "preemptions", 10), _row(project_id, after, "preemptions", 16),
        _row(project_id, before, "generation_tokens", 1000), _row(project_id, after, "generation_tokens", 1500),
        # SGLang serving "qwen": 4 first tokens in (0.5, 1.0] s
        *_histogram(project_id, before, "ttft_seconds", [0, 0, 0, 0], 0.0, engine="sglang", target=GPU2, model="qwen",
                    host="gpu-2"),
        *_histogram(project_id, after, "ttft_seconds", [0, 0, 4, 4], 3.0, engine="sglang", target=GPU2, model="qwen",
                    host="gpu-2"),
        _row(project_id, t + timedelta(seconds=3), "kv_cache_usage", 40, engine="sglang", target=GPU2, model="qwen",
             host="gpu-2"),
    ]
    if other_project_id is not None:
        rows += [_row(other_project_id, t + timedelta(seconds=1), "kv_cache_usage", 99, target="http://secret-gpu:8000/metrics",
                      model="secret-model", host="secret-host"),
                 *_histogram(other_project_id, after, "ttft_seconds", [0, 0, 0, 50], 500.0)]
    get_store().insert("engine_samples", rows, tag="tests.engines_page")
    # The app's side: 4 "llama" requests (TTFT 600..900 ms, E2E 1200..1600 ms) and one slow other one.
    traces = [_trace(project_id, i + 1, t + timedelta(seconds=1 + i), model="llama", ttft_ms=ttft, e2e_ms=e2e)
              for i, (ttft, e2e) in enumerate([(600, 1200), (700, 1300), (800, 1400), (900, 1600)])]
    traces.append(_trace(project_id, 9, t + timedelta(seconds=6), model="gpt-4o", ttft_ms=5000, e2e_ms=8000))
    get_store().insert("traces", traces, tag="tests.engines_page")


def _traces(fig):
    return {trace["name"]: trace for trace in fig["data"]}


def test_pages_need_a_login_and_a_membership(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    assert client.get("/engines/").status_code == 302 and client.get("/engines/")["Location"].startswith("/login/")
    answer = client.get("/engines/series.json")
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "not_authenticated"
    client.force_login(bob)  # a member of no project at all
    assert "not a member of any project" in client.get("/engines/").content.decode()
    assert client.get("/engines/series.json").status_code == 404
    assert client.get(f"/engines/?project={mine.pk}").status_code == 404
    assert client.get(f"/engines/series.json?project={mine.pk}").status_code == 404
    client.force_login(alice)
    assert client.get(f"/engines/?project={mine.pk}").status_code == 200
    assert client.get("/engines/series.json?range=2y").json()["error"]["code"] == "invalid_window"


def test_a_project_without_engine_samples_says_how_to_get_them(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key("quiet", members=[alice])
    client.force_login(alice)
    html = client.get("/engines/").content.decode()
    assert 'id="no-engines"' in html and "--scrape vllm=http://HOST:8000/metrics" in html
    assert "TRACEDASH_SCRAPE" in html and "/v1/metrics" in html
    assert 'class="chart"' not in html and 'id="engines-table"' not in html
    body = client.get("/engines/series.json").json()
    assert body["newest_sample"] is None and body["instances"] == [] and body["figures"] == {}
    assert '<a href="/engines/">Engines</a>' in html  # in the nav, next to Resources
    assert html.index(">Resources</a>") < html.index(">Engines</a>") < html.index(">Costs</a>")


def test_engine_and_app_side_latency_with_the_band_between_them(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    other, _ = project_with_key(members=[bob])
    start, end, t, k = _window()
    _seed(mine.pk, t, other_project_id=other.pk)
    # Two points later (none between): 10 more first tokens in (0.1, 0.5] s, and two llama requests.
    get_store().insert("engine_samples", _histogram(mine.pk, t + timedelta(seconds=25), "ttft_seconds", [0, 20, 20, 20], 6.0),
                       tag="tests.engines_page")
    get_store().insert("traces", [_trace(mine.pk, 20 + i, t + timedelta(seconds=21 + i), model="llama", ttft_ms=ttft,
                                         e2e_ms=1000) for i, ttft in enumerate((650, 750))], tag="tests.engines_page")
    client.force_login(alice)
    body = client.get("/engines/series.json" + _query(start, end)).json()
    assert set(body) == {"project_id", "start", "end", "engine", "engines", "newest_sample", "step_seconds", "times",
                         "instances", "figures", "latest"}
    assert body["project_id"] == mine.pk and body["engine"] == "" and len(body["times"]) == 91
    assert body["step_seconds"] == 10 and body["times"][k] == t.isoformat()
    assert set(body["figures"]) == {"fig-engine-requests", "fig-engine-kv", "fig-engine-preemptions", "fig-engine-ttft",
                                    "fig-engine-e2e", "fig-engine-queue", "fig-engine-throughput"}
    assert all(len(values) == 91 for i in body["instances"] for values in i["values"].values())
    assert body["engines"] == ["sglang", "vllm"]
    by_target = {i["target"]: i for i in body["instances"]}
    assert set(by_target) == {GPU1, GPU2}  # never the other project's instance
    vllm, sglang = by_target[GPU1], by_target[GPU2]
    assert vllm["label"] == f"vllm · {GPU1} · llama" and vllm["host"] == "gpu-1"
    v = vllm["values"]
    # Engine side, from the bucket increases (histogram_quantile): P95 at rank 9.5 of 10.
    assert v["ttft_p95_ms"][k] == pytest.approx(100 + 400 * 0.95)  # 480 ms
    assert v["e2e_p95_ms"][k] == pytest.approx(500 + 500 * 0.95)  # 975 ms
    assert v["queue_p95_ms"][k] == pytest.approx(100 * 0.95)  # 95 ms
    assert v["requests_running"][k] == 7 and v["requests_waiting"][k] == 5 and v["kv_cache_usage"][k] == 92.5
    assert v["preemptions_per_minute"][k] == pytest.approx(6 * 60 / 10)
    assert v["generation_tokens_per_second"][k] == pytest.approx(500 / 10)
    assert v["ttft_p95_ms"][k - 1] is None and v["preemptions_per_minute"][k - 1] is None  # the baselines' bucket
    # App side: the llama traces only (the model the instance serves), P95 of 4: the largest (its
    # histogram bucket's value: within 0.5 %, docs/definitions.md).
    assert vllm["app_side_model"] == "llama"
    assert v["app_ttft_p95_ms"][k] == pytest.approx(900.0, rel=0.005)
    assert v["app_e2e_p95_ms"][k] == pytest.approx(1600.0, rel=0.005)
    assert v["app_ttft_p95_ms"][k + 1] is None
    # No trace names "qwen": that instance is compared with every trace (the gpt-4o one included).
    assert sglang["app_side_model"] == ""
    assert sglang["values"]["app_ttft_p95_ms"][k] == pytest.approx(5000.0, rel=0.005)
    assert sglang["values"]["ttft_p95_ms"][k] == pytest.approx(500 + 500 * 3.8 / 4)  # 975 ms

    assert v["ttft_p95_ms"][k + 1] is None and v["ttft_p95_ms"][k + 2] == pytest.approx(480.0)
    assert v["app_ttft_p95_ms"][k + 2] == pytest.approx(750.0, rel=0.005)

    ttft = _traces(body["figures"]["fig-engine-ttft"])
    engine_line = ttft[f"engine TTFT P95 · vllm · {GPU1} · llama"]
    app_line = ttft["app TTFT P95 (traces of llama)"]
    assert engine_line["y"][k] == pytest.approx(480.0) and app_line["y"][k] == pytest.approx(900.0, rel=0.005)
    assert engine_line["y"][k + 1] is None and engine_line["connectgaps"] is False  # a gap, never a line through it
    # The band: one piece per run of points where both lines have a value (none across the gap at
    # k + 1), each filled down to a hidden copy of the engine line just before it.
    data = body["figures"]["fig-engine-ttft"]["data"]
    bands = [(i, tr) for i, tr in enumerate(data) if tr["name"] == f"outside the engine · vllm · {GPU1} · llama"]
    stamp = lambda i: datetime.fromisoformat(body["times"][i]).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    assert [(tr["x"], tr["y"], tr["fill"], tr["showlegend"]) for _, tr in bands] == [
        ([stamp(k)], [pytest.approx(900.0, rel=0.005)], "tonexty", True),
        ([stamp(k + 2)], [pytest.approx(750.0, rel=0.005)], "tonexty", False)]
    # the gap: app side (within 0.5 %) less engine side
    assert [tr["text"] for _, tr in bands] == [[pytest.approx(420.0, abs=4.5)], [pytest.approx(270.0, abs=3.75)]]
    for i, band in bands:
        base = data[i - 1]
        assert base["x"] == band["x"] and base["y"] == [pytest.approx(480.0)] and base["showlegend"] is False
        assert base["legendgroup"] == band["legendgroup"]  # the legend entry toggles every piece
    assert ttft["app TTFT P95 (all traces)"]["y"][k] == pytest.approx(5000.0, rel=0.005)
    assert ttft[f"outside the engine · sglang · {GPU2} · qwen"]["text"] == [pytest.approx(5000.0 - 975.0, abs=25)]
    # A point of the app-side line opens that bucket's llama traces at or above it, slowest first.
    assert "&model=llama&sort=ttft&dir=desc&ttft_ms=" in app_line["customdata"][k]

    e2e = _traces(body["figures"]["fig-engine-e2e"])
    assert e2e[f"engine E2E P95 · vllm · {GPU1} · llama"]["y"][k] == pytest.approx(975.0)
    assert e2e["app E2E P95 (traces of llama)"]["y"][k] == pytest.approx(1600.0, rel=0.005)
    assert e2e[f"outside the engine · vllm · {GPU1} · llama"]["text"] == [pytest.approx(625.0, abs=8)]
    assert f"engine E2E P95 · sglang · {GPU2} · qwen" not in e2e  # that engine sent no E2E histogram

    kv = body["figures"]["fig-engine-kv"]
    assert kv["layout"]["yaxis"]["range"] == [0, 100]
    assert [s["y0"] for s in kv["layout"]["shapes"] if s.get("line", {}).get("dash") == "dash"] == [90.0]
    assert _traces(kv)[f"vllm · {GPU1} · llama"]["y"][k] == 92.5
    requests = _traces(body["figures"]["fig-engine-requests"])
    assert requests[f"vllm · {GPU1} · llama · waiting"]["y"][k] == 5
    assert _traces(body["figures"]["fig-engine-preemptions"])[f"vllm · {GPU1} · llama"]["y"][k] == pytest.approx(36.0)
    assert _traces(body["figures"]["fig-engine-throughput"])[f"vllm · {GPU1} · llama"]["y"][k] == pytest.approx(50.0)
    assert _traces(body["figures"]["fig-engine-queue"])[f"vllm · {GPU1} · llama"]["y"][k] == pytest.approx(95.0)
    for fig in body["figures"].values():  # one time axis, the window's, on every chart
        assert fig["layout"]["xaxis"]["range"] == [start.isoformat(), end.isoformat()]

    html = client.get("/engines/" + _query(start, end)).content.decode()
    for chart in body["figures"]:
        assert f'data-figure="{chart}"' in html
    assert GAP_CAPTIONS["fig-engine-ttft"].replace("'", "&#x27;") in html
    assert '<select name="engine" id="engine-select">' in html  # two engines: a filter
    row = html[html.index(f'data-instance="engine=vllm,target={GPU1},model=llama"'):]
    row = row[:row.index("</tr>")]
    assert '<td class="num">7</td><td class="num">5</td>' in row.replace("\n      ", "")
    assert '<td class="num over">92.5</td>' in row  # KV cache at or over 90 %: flagged
    assert '<td class="num">40.0</td>' in html  # the SGLang one, under 90 %: not
    assert "secret" not in html and "secret" not in str(body)

    only = client.get("/engines/series.json" + _query(start, end, engine="vllm")).json()
    assert [i["target"] for i in only["instances"]] == [GPU1] and only["engines"] == ["sglang", "vllm"]
    assert [r["target"] for r in only["latest"]] == [GPU1]
    assert {k: only["latest"][0][k] for k in ("requests_running", "requests_waiting", "kv_cache_usage", "host",
                                              "last_seen")} == {
        "requests_running": 7, "requests_waiting": 5, "kv_cache_usage": 92.5, "host": "gpu-1",
        "last_seen": (t + timedelta(seconds=7)).strftime("%Y-%m-%d %H:%M:%S")}

    client.force_login(bob)
    theirs = client.get("/engines/series.json" + _query(start, end)).json()
    assert [i["target"] for i in theirs["instances"]] == ["http://secret-gpu:8000/metrics"]
    assert GPU1 not in client.get("/engines/" + _query(start, end)).content.decode()


def test_long_windows_compare_with_the_rollups_in_the_same_buckets(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=30)
    start = end - timedelta(hours=6)  # 5-minute points, the app side from the minute rollups
    t = datetime.fromtimestamp(int(start.timestamp()) // 300 * 300 + 3600, tz=timezone.utc)
    _seed(mine.pk, t + timedelta(seconds=10))
    rollups_rebuild(project_id=mine.pk, from_ns=_ns(start), to_ns=_ns(end))
    client.force_login(alice)
    body = client.get("/engines/series.json" + _query(start, end)).json()
    assert body["step_seconds"] == 300
    k = body["times"].index(t.isoformat())
    v = next(i for i in body["instances"] if i["target"] == GPU1)["values"]
    assert v["ttft_p95_ms"][k] == pytest.approx(480.0)
    # The rollups' log-bucket histograms: within 0.5 % of the exact 900 / 1600 ms.
    assert v["app_ttft_p95_ms"][k] == pytest.approx(900.0, rel=0.005)
    assert v["app_e2e_p95_ms"][k] == pytest.approx(1600.0, rel=0.005)
    band = _traces(body["figures"]["fig-engine-ttft"])[f"outside the engine · vllm · {GPU1} · llama"]
    assert band["text"] == [pytest.approx(v["app_ttft_p95_ms"][k] - 480.0)]


def test_user_sent_labels_are_escaped_everywhere(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    hostile_model, hostile_target = "<b>m</b>", 'http://x/"><img src=x onerror=alert(1)>'
    now = datetime.now(timezone.utc) - timedelta(seconds=30)
    get_store().insert("engine_samples", [
        _row(mine.pk, now, "kv_cache_usage", 50, engine="<i>e</i>", target=hostile_target, model=hostile_model,
             host="<u>h</u>"),
        _row(mine.pk, now, "requests_running", 2, engine="<i>e</i>", target=hostile_target, model=hostile_model,
             host="<u>h</u>")], tag="tests.engines_page")
    client.force_login(alice)
    html = client.get("/engines/?range=15m").content.decode()
    assert "<b>m</b>" not in html and "<img src=x" not in html and "<u>h</u>" not in html and "<i>e</i>" not in html
    assert "&lt;b&gt;m&lt;/b&gt;" in html and "&lt;u&gt;h&lt;/u&gt;" in html  # the table, as text
    body = client.get("/engines/series.json?range=15m").json()
    names = [t["name"] for t in body["figures"]["fig-engine-kv"]["data"]]
    # Plotly renders a little HTML in names: escaped there, so the legend shows the label as written.
    assert names == ["&lt;i&gt;e&lt;/i&gt; · http://x/\"&gt;&lt;img src=x onerror=alert(1)&gt; · &lt;b&gt;m&lt;/b&gt;"]
    assert body["instances"][0]["model"] == hostile_model  # the JSON data itself is as sent


def test_a_window_without_samples_says_when_the_newest_was(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    old = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=3)
    get_store().insert("engine_samples", [_row(mine.pk, old, "kv_cache_usage", 10)], tag="tests.engines_page")
    client.force_login(alice)
    html = client.get("/engines/?range=15m").content.decode()
    assert 'id="no-engine-samples"' in html and old.strftime("%Y-%m-%d %H:%M:%S") in html
    assert 'class="chart"' not in html
    assert 'data-live="1"' in html and 'data-had-samples="1"' in html and 'data-had-instances="0"' in html
    assert 'data-figure="fig-engine-kv"' in client.get("/engines/?range=6h").content.decode()
    # Without a range the default hour shrinks to the smallest preset that covers the samples.
    get_store().insert("engine_samples", [_row(mine.pk, old + timedelta(hours=3) - timedelta(minutes=10),
                                               "kv_cache_usage", 20)], tag="tests.engines_page")
    fitted = client.get("/engines/").content.decode()
    assert 'id="range-fitted"' in fitted and '<option value="15m" selected>' in fitted
    assert 'data-figure="fig-engine-kv"' in fitted


def test_the_engine_filter_appears_only_with_more_than_one_engine(client, make_user, project_with_key):
    alice = make_user()
    mine, _ = project_with_key(members=[alice])
    get_store().insert("engine_samples", [_row(mine.pk, datetime.now(timezone.utc) - timedelta(seconds=20),
                                               "requests_waiting", 4)], tag="tests.engines_page")
    client.force_login(alice)
    html = client.get("/engines/?range=15m").content.decode()
    assert 'data-figure="fig-engine-requests"' in html and 'id="engine-select"' not in html
