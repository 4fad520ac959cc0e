"""The cache figures (docs/definitions.md "Cache") computed exactly on hand-computable traffic
(tests/cache_seed.py: three endpoints, a late hit, a late root, a re-sent trace, another project's
traffic), over the window, per endpoint and per series bucket; and the overview and costs pages
and their JSON showing them, or one quiet line when no span ever consulted a cache."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from analytics.cache_selectors import cache_ever_consulted, cache_savings
from tests.cache_seed import S, request, seed_cache_traffic
from tests.cache_seed import insert as insert_spans
from tests.panel_seed import seed_rolled_up
from tests.spans import llm_trace

pytestmark = [pytest.mark.clickhouse, pytest.mark.django_db]

LATENCY_SAVED_MS = (2 * 1190 + 1950) / 3


@pytest.fixture
def cache_project(make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    other, _ = project_with_key()
    t0_ns = (time.time_ns() // S // 60 * 60 - 30 * 60) * S  # a minute start, half an hour ago
    requests = seed_cache_traffic(project.pk, t0_ns)
    # Another project: hits and misses of the same endpoints, never counted for this one.
    theirs = [request(service="chat-api", name="POST /chat", start_ns=t0_ns + 2 * S, e2e_ms=1, cache=True)
              for _ in range(5)]
    theirs.append(request(service="chat-api", name="POST /chat", start_ns=t0_ns + 2 * S, e2e_ms=9000, cache=False,
                          cost=9.0, tokens=(9000, 9000)))
    insert_spans(other.pk, [s for spans in theirs for s in spans])
    from analytics.summarizer import traces_summarize

    traces_summarize(project_ids=[other.pk])
    start = datetime.fromtimestamp(t0_ns / S, tz=timezone.utc)
    return {"user": alice, "project": project, "other": other, "start": start, "end": start + timedelta(minutes=10),
            "requests": requests}


def test_window_endpoint_and_bucket_figures_are_exact(cache_project):
    savings = cache_savings(project_id=cache_project["project"].pk, start=cache_project["start"],
                            end=cache_project["end"])
    totals = savings.totals
    assert savings.ever
    assert (totals.consulted, totals.hits, totals.misses) == (10, 5, 5)
    assert totals.hit_rate == 0.5
    assert totals.latency_saved_ms == pytest.approx(LATENCY_SAVED_MS)
    assert totals.cost_saved_usd == pytest.approx(0.018)
    assert totals.tokens_saved == pytest.approx(6400)
    assert totals.hits_unpriced == 2  # /search has hits and no miss to price them

    by_label = {e.label: e for e in savings.endpoints}
    assert [e.label for e in savings.endpoints] == ["chat-api · POST /summarize", "chat-api · POST /chat",
                                                    "search · GET /search"]  # most cost saved first
    chat = by_label["chat-api · POST /chat"]
    assert (chat.consulted, chat.hits, chat.misses, chat.hit_rate) == (5, 2, 3, 0.4)
    assert (chat.hit_p50_ms, chat.miss_p50_ms, chat.latency_saved_ms) == (10.0, 1200.0, 1190.0)
    assert chat.miss_cost_mean_usd == pytest.approx(0.004) and chat.cost_saved_usd == pytest.approx(0.008)
    assert chat.miss_tokens_mean == 1200 and chat.tokens_saved == 2400
    summarize = by_label["chat-api · POST /summarize"]
    assert (summarize.consulted, summarize.hits, summarize.latency_saved_ms) == (3, 1, 1950.0)
    assert summarize.miss_cost_mean_usd == pytest.approx(0.01)  # the miss without a cost is left out
    assert summarize.tokens_saved == 4000  # (3000 + 5000) / 2
    search = by_label["search · GET /search"]
    assert (search.consulted, search.hits, search.hit_rate) == (2, 2, 1.0)
    assert search.latency_saved_ms is None and search.cost_saved_usd is None and search.tokens_saved is None

    assert savings.step_seconds == 10
    filled = {i: b for i, b in enumerate(savings.buckets) if b is not None}
    assert sorted(filled) == [0, 6]
    b0, b6 = filled[0], filled[6]
    assert (b0.consulted, b0.hits, b0.hit_rate) == (5, 2, 0.4)
    assert b0.latency_saved_ms == pytest.approx((990 + 1950) / 2)
    assert b0.cost_saved_usd == pytest.approx(0.014) and b0.tokens_saved == pytest.approx(5200)
    assert (b6.consulted, b6.hits, b6.hit_rate) == (5, 3, 0.6)
    assert b6.latency_saved_ms == 1370.0 and b6.hits_unpriced == 2
    assert b6.cost_saved_usd == pytest.approx(0.004) and b6.tokens_saved == pytest.approx(1200)
    # the buckets add up to the window
    assert b0.cost_saved_usd + b6.cost_saved_usd == pytest.approx(totals.cost_saved_usd)
    assert b0.tokens_saved + b6.tokens_saved == pytest.approx(totals.tokens_saved)


def test_service_filter_and_window_bounds(cache_project):
    pk, start, end = cache_project["project"].pk, cache_project["start"], cache_project["end"]
    search = cache_savings(project_id=pk, start=start, end=end, service="search", series=False)
    assert (search.totals.consulted, search.totals.hits, search.totals.cost_saved_usd) == (2, 2, None)
    assert search.buckets == []
    # A window holding only the first bucket's second: the requests whose root starts in it.
    first = cache_savings(project_id=pk, start=start + timedelta(seconds=1), end=start + timedelta(seconds=2),
                          series=False)
    assert (first.totals.consulted, first.totals.hits) == (1, 0)  # /chat miss 1 alone
    assert first.totals.cost_saved_usd == 0.0 and first.totals.latency_saved_ms is None
    empty = cache_savings(project_id=pk, start=end, end=end + timedelta(minutes=5))
    assert empty.ever and empty.totals.consulted == 0 and empty.totals.hit_rate is None
    assert all(b is None for b in empty.buckets)


def test_a_project_that_never_consulted_a_cache(project_with_key):
    project, _ = project_with_key()
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=time.time_ns() - 60 * S)])
    assert not cache_ever_consulted(project_id=project.pk)
    now = datetime.now(timezone.utc)
    savings = cache_savings(project_id=project.pk, start=now - timedelta(hours=1), end=now)
    assert not savings.ever and savings.totals.consulted == 0 and savings.endpoints == []


def _window_query(cache_project) -> str:
    start, end = cache_project["start"], cache_project["end"]
    return f"from={start.isoformat().replace('+00:00', 'Z')}&to={end.isoformat().replace('+00:00', 'Z')}"


def test_overview_and_costs_json_carry_the_cache_figures(client, cache_project):
    client.force_login(cache_project["user"])
    query = _window_query(cache_project)
    overview = client.get(f"/overview.json?{query}").json()
    cache = overview["cache"]
    assert cache["ever"] is True
    totals = cache["stats"]
    assert (totals["consulted"], totals["hits"], totals["misses"], totals["hit_rate"]) == (10, 5, 5, 0.5)
    assert totals["latency_saved_ms"] == pytest.approx(LATENCY_SAVED_MS)
    assert totals["cost_saved_usd"] == pytest.approx(0.018) and totals["tokens_saved"] == pytest.approx(6400)
    assert cache["previous"]["consulted"] == 0  # the 10 minutes before: nothing
    kpis = {k["key"]: k for k in cache["kpis"]}
    assert kpis["cache_hit_rate"]["value"] == 50.0 and kpis["cache_latency_saved"]["value"] == pytest.approx(
        LATENCY_SAVED_MS)
    assert {k["key"] for k in overview["kpis"]}.isdisjoint(kpis)  # the request tiles are unchanged
    series = cache["series"]
    assert series["step_seconds"] == 10 and len(series["times"]) == len(series["buckets"])
    assert series["buckets"][0]["hit_rate"] == 0.4 and series["buckets"][6]["hit_rate"] == 0.6
    assert series["buckets"][1] is None  # no request consulted a cache there: a gap, not 0
    rate = overview["figures"]["fig-cache"]
    hit_rate = next(t for t in rate["data"] if t["name"] == "hit rate %")
    assert hit_rate["y"][0] == 40.0 and hit_rate["y"][6] == 60.0 and hit_rate["y"][1] is None
    saved = next(t for t in rate["data"] if t["name"] == "latency saved (P50)")
    assert saved["y"][0] == pytest.approx(1470.0) and saved["y"][6] == 1370.0

    costs = client.get(f"/costs.json?{query}").json()
    assert costs["cache"]["stats"]["cost_saved_usd"] == pytest.approx(0.018)
    endpoints = costs["cache"]["endpoints"]
    assert [(e["service"], e["root_name"], e["hits"]) for e in endpoints] == [
        ("chat-api", "POST /summarize", 1), ("chat-api", "POST /chat", 2), ("search", "GET /search", 2)]
    assert endpoints[1]["cost_saved_usd"] == pytest.approx(0.008) and endpoints[1]["latency_saved_ms"] == 1190.0
    over_time = costs["figures"]["fig-cache-saved"]
    cost_bars = next(t for t in over_time["data"] if t["name"] == "cost saved")
    assert cost_bars["y"][0] == pytest.approx(0.014) and cost_bars["y"][6] == pytest.approx(0.004)
    by_endpoint = costs["figures"]["fig-cache-endpoints"]
    assert by_endpoint["data"][0]["x"] == ["chat-api · POST /summarize", "chat-api · POST /chat", "search · GET /search"]
    for fid in ("fig-cache", "fig-cache-saved", "fig-cache-endpoints"):  # every hover names its unit
        fig = (overview if fid == "fig-cache" else costs)["figures"][fid]
        for trace in fig["data"]:
            assert any(u in trace["hovertemplate"] for u in (" %", " ms", " tokens", "%{hovertext}")), (fid, trace)
    assert cost_bars["hovertext"][0] == "$0.014"


def test_pages_show_the_cache_section_escaped(client, cache_project):
    client.force_login(cache_project["user"])
    query = _window_query(cache_project)
    page = client.get(f"/?{query}").content.decode()
    section = page[page.index('id="cache-savings"'):]
    assert 'data-kpi="cache_hit_rate"' in section and '<span class="num">50.0</span>' in section
    assert 'data-figure="fig-cache"' in section
    costs = client.get(f"/costs/?{query}").content.decode()
    section = costs[costs.index('id="cache-savings"'):]
    assert 'data-kpi="cache_cost_saved"' in section and "$0.018" in section
    assert 'data-figure="fig-cache-saved"' in section and 'data-figure="fig-cache-endpoints"' in section
    table = section[section.index('id="cache-endpoints"'):]
    assert "chat-api · POST /summarize" in table and "2 hits without a miss to price them" in section
    # A model filter narrows the request figures, not the cache's (a hit calls no model), and says so.
    filtered = client.get(f"/?{query}&model=m-unpriced").content.decode()
    assert "The model filter does not apply here" in filtered and '<span class="num">50.0</span>' in filtered
    body = client.get(f"/overview.json?{query}&model=m-unpriced").json()
    assert body["stats"]["requests"] == 6 and body["cache"]["stats"]["hits"] == 5  # the misses and the plain request
    assert body["cache"]["model_filter_applied"] is False


def test_a_user_sent_endpoint_name_is_rendered_escaped(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    start_ns = (time.time_ns() // S - 120) * S
    name = '<img src=x onerror="alert(1)">'
    spans = (request(service="svc", name=name, start_ns=start_ns, e2e_ms=900, cache=False, cost=0.001, tokens=(10, 5))
             + request(service="svc", name=name, start_ns=start_ns + S, e2e_ms=5, cache=True))
    seed_rolled_up(project_id=project.pk, traces=[spans[:3], spans[3:]])
    client.force_login(alice)
    html = client.get("/costs/?range=15m").content.decode()
    assert name not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html


def test_the_pages_say_so_in_one_line_when_no_span_ever_consulted_a_cache(client, make_user, project_with_key):
    alice = make_user()
    project, _ = project_with_key(members=[alice])
    seed_rolled_up(project_id=project.pk, traces=[llm_trace(start_ns=time.time_ns() - 60 * S)])
    client.force_login(alice)
    for path in ("/?range=15m", "/costs/?range=15m"):
        html = client.get(path).content.decode()
        assert 'id="cache-none"' in html and "No span has consulted a cache yet" in html, path
        assert 'id="cache-savings"' not in html and "fig-cache" not in html, path
    body = client.get("/overview.json?range=15m").json()
    assert body["cache"]["ever"] is False and "fig-cache" not in body["figures"]


def test_the_trace_page_and_json_say_hit_or_miss(client, cache_project):
    client.force_login(cache_project["user"])
    outcomes = {}
    for key in ("chat_hit_2", "chat_miss_1", "chat_plain"):
        trace_id = cache_project["requests"][key][0]["trace_id"]
        outcomes[key] = client.get(f"/api/v1/traces/{trace_id}").json()["summary"]["cache"]
        page = client.get(f"/traces/{trace_id}/").content.decode()
        if outcomes[key] is None:
            assert 'id="fig-cache"' not in page
        else:
            assert f'<dd id="fig-cache">{outcomes[key]}</dd>' in page
    assert outcomes == {"chat_hit_2": "hit", "chat_miss_1": "miss", "chat_plain": None}  # the late hit won
