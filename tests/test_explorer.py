"""The trace explorer: every filter and sort over seeded traces, keyset pagination across ties,
project scoping, escaping, bad input as form errors, and the JSON endpoint the live page uses."""

from __future__ import annotations

import json
import time

import pytest

from dashboard import explorer as ex
from dashboard.explorer import Cursor, ExplorerQuery, QueryError, explorer_page, trace_bounds
from tests.explorer_seed import seed_traces
from tests.spans import llm_trace, span_id, trace_id

pytestmark = [pytest.mark.clickhouse]

NS, MS = 1_000_000_000, 1_000_000
HOUR = 3600 * NS


def make_trace(*, start_ns, service="chat-api", model="gpt-4o-mini", error=False, name="chat", durations=None,
               ttft_ms=210.5, cost=0.00042, attributes=None, extra_service=None):
    """A root over network/preprocess/inference/postprocess children with chosen durations (ms)."""
    durations = durations or {"network": 80, "preprocess": 120, "inference": 900, "postprocess": 60}
    tid, root = trace_id(), span_id()
    total = sum(durations.values()) + 40
    spans = [{"trace_id": tid, "span_id": root, "parent_span_id": None, "name": name, "phase": "other",
              "service": service, "start_time": start_ns, "duration_ms": total,
              "status": "error" if error else "ok", "status_message": "upstream timeout" if error else "",
              "attributes": attributes or {}}]
    offset = 0
    for phase, dur in durations.items():
        span = {"trace_id": tid, "span_id": span_id(), "parent_span_id": root, "name": phase, "phase": phase,
                "service": extra_service if (extra_service and phase == "network") else service,
                "start_time": start_ns + offset * MS, "duration_ms": dur}
        if phase == "inference":
            span.update(model=model, input_tokens=800, output_tokens=100)
            if ttft_ms is not None:
                span["ttft_ms"] = ttft_ms
            if cost is not None:
                span["cost_usd"] = cost
        spans.append(span)
        offset += dur
    return spans


def q(now, **kw):
    return ExplorerQuery(start_ns=now - 24 * HOUR, end_ns=now + NS, **kw)


def ids_of(page):
    return [r.trace_id for r in page.rows]


@pytest.fixture
def seeded():
    """Ten traces of project 1 (and one of project 2, and one of project 1 from last week)."""
    now = time.time_ns()
    t = {}
    t["slow_infer"] = make_trace(start_ns=now - 1 * HOUR, durations={"network": 50, "preprocess": 50, "inference": 4000, "postprocess": 50}, ttft_ms=900)
    t["slow_net"] = make_trace(start_ns=now - 2 * HOUR, durations={"network": 2500, "preprocess": 50, "inference": 300, "postprocess": 50}, ttft_ms=120)
    t["error"] = make_trace(start_ns=now - 3 * HOUR, error=True, cost=None, ttft_ms=None)
    t["gpt4o"] = make_trace(start_ns=now - 4 * HOUR, model="gpt-4o", cost=0.02, ttft_ms=400)
    t["other_svc"] = make_trace(start_ns=now - 5 * HOUR, service="billing", cost=0.001)
    t["tools"] = make_trace(start_ns=now - 6 * HOUR, extra_service="tools", attributes={"user.id": "u-42", "session.id": "s-1"})
    t["user7"] = make_trace(start_ns=now - 7 * HOUR, attributes={"user.id": "u-7"})
    t["prep"] = make_trace(start_ns=now - 8 * HOUR, durations={"network": 10, "preprocess": 3000, "inference": 200, "postprocess": 10}, ttft_ms=50)
    t["post"] = make_trace(start_ns=now - 9 * HOUR, durations={"network": 10, "preprocess": 10, "inference": 200, "postprocess": 2000}, cost=0.005)
    t["fast"] = make_trace(start_ns=now - 10 * HOUR, durations={"network": 5, "preprocess": 5, "inference": 50, "postprocess": 5}, ttft_ms=20, cost=0.0001)
    t["old"] = make_trace(start_ns=now - 7 * 24 * HOUR)
    ids = dict(zip(t, seed_traces(project_id=1, traces=list(t.values()))))
    ids["foreign"] = seed_traces(project_id=2, traces=[make_trace(start_ns=now - 1 * HOUR)])[0]
    return now, ids


def test_default_query_lists_the_range_newest_first_and_nothing_of_other_projects(seeded):
    now, ids = seeded
    page = explorer_page(project_id=1, query=q(now))
    expected = ["slow_infer", "slow_net", "error", "gpt4o", "other_svc", "tools", "user7", "prep", "post", "fast"]
    assert ids_of(page) == [ids[k] for k in expected]
    assert ids["foreign"] not in ids_of(page) and ids["old"] not in ids_of(page)
    assert page.next_cursor is None
    row = page.rows[0]
    assert row.e2e_ns == (50 + 50 + 4000 + 50 + 40) * MS
    assert row.phase_ns["inference"] == 4000 * MS and row.dominant_phase == "inference"
    bar = {seg["phase"]: seg["percent"] for seg in row.phase_bar()}
    assert bar["inference"] == pytest.approx(100 * 4000 / 4190, abs=0.01)
    assert sum(bar.values()) == pytest.approx(100, abs=0.05)


@pytest.mark.parametrize(("filters", "expected"), [
    ({"service": "billing"}, ["other_svc"]),
    ({"service": "tools"}, []),  # the root's service, as on every page: not a child span's
    ({"model": "gpt-4o"}, ["gpt4o"]),
    ({"status": "error"}, ["error"]),
    ({"phase": "network"}, ["slow_net"]),
    ({"phase": "preprocess"}, ["prep"]),
    ({"phase": "postprocess"}, ["post"]),
    ({"min_duration_ns": 3000 * MS}, ["slow_infer", "prep"]),
    ({"max_duration_ns": 200 * MS}, ["fast"]),
    ({"min_duration_ns": 2000 * MS, "max_duration_ns": 3000 * MS}, ["slow_net", "post"]),
    ({"min_ttft_ns": 400 * MS}, ["slow_infer", "gpt4o"]),
    ({"attribute": ("user.id", "u-42")}, ["tools"]),
    ({"attribute": ("user.id", "u-7")}, ["user7"]),
    ({"attribute": ("user.id", "nobody")}, []),
    ({"attribute": ("session.id", "s-1"), "service": "chat-api"}, ["tools"]),
    ({"status": "ok", "model": "gpt-4o-mini", "phase": "inference", "min_ttft_ns": 200 * MS},
     ["slow_infer", "other_svc", "tools", "user7"]),
])
def test_each_filter(seeded, filters, expected):
    now, ids = seeded
    assert ids_of(explorer_page(project_id=1, query=q(now, **filters))) == [ids[k] for k in expected]


def test_time_range_and_trace_id(seeded):
    now, ids = seeded
    window = ExplorerQuery(start_ns=now - int(4.5 * HOUR), end_ns=now - int(1.5 * HOUR))
    assert ids_of(explorer_page(project_id=1, query=window)) == [ids["slow_net"], ids["error"], ids["gpt4o"]]
    # A trace id finds its trace whatever the range, and never another project's.
    assert ids_of(explorer_page(project_id=1, query=q(now, trace_id=ids["old"]))) == [ids["old"]]
    assert ids_of(explorer_page(project_id=1, query=q(now, trace_id=ids["foreign"]))) == []
    assert ids_of(explorer_page(project_id=2, query=q(now, trace_id=ids["foreign"]))) == [ids["foreign"]]


@pytest.mark.parametrize("sort", ex.SORTS)
@pytest.mark.parametrize("direction", ex.DIRECTIONS)
def test_sorts_put_unknown_values_last(seeded, sort, direction):
    now, ids = seeded
    rows = explorer_page(project_id=1, query=q(now, sort=sort, direction=direction)).rows
    value = {"start": lambda r: r.start_ns, "duration": lambda r: r.e2e_ns, "ttft": lambda r: r.ttft_ns,
             "cost": lambda r: r.cost_usd}[sort]
    known = [r for r in rows if value(r) is not None]
    unknown = [r for r in rows if value(r) is None]
    assert rows == known + unknown
    keys = [(value(r), r.trace_id) for r in known]
    assert keys == sorted(keys, reverse=direction == "desc")
    if sort in ("ttft", "cost"):
        assert [r.trace_id for r in unknown] == [ids["error"]]


@pytest.mark.parametrize("sort", ex.SORTS)
@pytest.mark.parametrize("direction", ex.DIRECTIONS)
def test_keyset_pages_have_no_gaps_or_duplicates_across_ties(sort, direction):
    now = time.time_ns()
    start = now - HOUR
    # 23 traces: groups with identical start, duration, TTFT and cost (ties broken by trace id),
    # and some without TTFT or cost.
    traces = []
    for i in range(23):
        traces.append(make_trace(start_ns=start + (i % 3) * MS, durations={"network": 10, "preprocess": 10,
                                 "inference": 100 + 100 * (i % 2), "postprocess": 10},
                                 ttft_ms=None if i % 5 == 0 else 50 + (i % 2), cost=None if i % 4 == 0 else 0.01 * (i % 3)))
    all_ids = seed_traces(project_id=1, traces=traces)
    whole = explorer_page(project_id=1, query=q(now, sort=sort, direction=direction, limit=100))
    assert sorted(ids_of(whole)) == sorted(all_ids)
    seen, cursor, pages = [], None, 0
    while True:
        page = explorer_page(project_id=1, query=q(now, sort=sort, direction=direction, limit=5, cursor=cursor))
        seen.extend(ids_of(page))
        pages += 1
        if page.next_cursor is None:
            break
        # The cursor travels through the URL.
        cursor = Cursor.decode(page.next_cursor.encode(), sort=sort, direction=direction)
    assert pages == 5
    assert seen == ids_of(whole)  # same order, nothing skipped, nothing twice


def test_a_trace_arriving_between_pages_neither_repeats_nor_hides_rows():
    now = time.time_ns()
    first_ids = seed_traces(project_id=1, traces=[make_trace(start_ns=now - i * MS * 1000) for i in range(1, 7)])
    page1 = explorer_page(project_id=1, query=q(now, limit=3))
    assert ids_of(page1) == first_ids[:3]
    seed_traces(project_id=1, traces=[make_trace(start_ns=now - 100 * MS)])  # newer than page 1's rows
    page2 = explorer_page(project_id=1, query=q(now, limit=3, cursor=page1.next_cursor))
    assert ids_of(page2) == first_ids[3:6]


def test_resummarised_trace_shows_its_latest_version_once():
    from store import get_store
    from tests.explorer_seed import span_rows, summary_row

    now = time.time_ns()
    spans = make_trace(start_ns=now - HOUR)
    rows = span_rows(project_id=1, spans=spans)
    early = summary_row(project_id=1, rows=rows[:2], version=1)  # only root + network arrived
    late = summary_row(project_id=1, rows=rows, version=2)
    get_store().insert("spans", rows, tag="tests")
    get_store().insert("traces", [early], tag="tests")
    get_store().insert("traces", [late], tag="tests")
    page = explorer_page(project_id=1, query=q(now))
    assert len(page.rows) == 1 and page.rows[0].span_count == 5


def shifted_children(spans, delta_ns):
    """The trace with every child starting ``delta_ns`` later (the root stretched to cover them)."""
    spans[0]["duration_ms"] += delta_ns / MS
    for span in spans[1:]:
        span["start_time"] += delta_ns
    return spans


def test_a_summary_whose_start_moved_is_listed_once_at_its_new_start():
    """The root arrives late: the first summary (no root) starts at the first child, the next one
    at the root, 2 s earlier. The explorer's start-ordered copy keeps both rows; only the latest counts."""
    from store import get_store
    from tests.explorer_seed import span_rows, summary_row

    now = time.time_ns()
    spans = shifted_children(make_trace(start_ns=now - HOUR), 2 * NS)  # children start 2 s after the root
    rows = span_rows(project_id=1, spans=spans)
    early = summary_row(project_id=1, rows=rows[1:], version=1)  # no root yet
    late = summary_row(project_id=1, rows=rows, version=2)
    assert early["start_time"] == now - HOUR + 2 * NS and late["start_time"] == now - HOUR
    get_store().insert("spans", rows, tag="tests")
    get_store().insert("traces", [early], tag="tests")
    get_store().insert("traces", [late], tag="tests")
    assert get_store().query("SELECT count() FROM traces_by_start", tag="tests").scalar() == 2
    page = explorer_page(project_id=1, query=q(now))
    assert [(r.trace_id, r.start_ns, r.has_root) for r in page.rows] == [(late["trace_id"], now - HOUR, True)]
    # A window holding only the old start finds nothing; one holding the new start finds it.
    only_old = ExplorerQuery(start_ns=now - HOUR + NS, end_ns=now - HOUR + 3 * NS)
    assert explorer_page(project_id=1, query=only_old).rows == []
    only_new = ExplorerQuery(start_ns=now - HOUR - NS, end_ns=now - HOUR + NS)
    assert ids_of(explorer_page(project_id=1, query=only_new)) == [late["trace_id"]]
    assert ids_of(explorer_page(project_id=1, query=q(now, trace_id=late["trace_id"]))) == [late["trace_id"]]


def test_stale_rows_do_not_shorten_a_page():
    """Pages keep their size when stale rows are dropped (more candidates are read)."""
    from store import get_store
    from tests.explorer_seed import span_rows, summary_row

    now = time.time_ns()
    stale, fresh = [], []
    for i in range(20):  # 20 stale candidates come first: the first page must read past them
        # Children 50 min after their root: the rootless summaries sort before every real one.
        spans = shifted_children(make_trace(start_ns=now - HOUR - i * NS), 50 * 60 * NS)
        rows = span_rows(project_id=1, spans=spans)
        stale.append(summary_row(project_id=1, rows=rows[1:], version=1))
        fresh.append(summary_row(project_id=1, rows=rows, version=2))
    get_store().insert("traces", stale, tag="tests")
    get_store().insert("traces", fresh, tag="tests")
    pages, cursor = [], None
    while True:
        page = explorer_page(project_id=1, query=q(now, limit=4, cursor=cursor))
        pages.append(ids_of(page))
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == [[r["trace_id"] for r in fresh[i:i + 4]] for i in range(0, 20, 4)]


def test_trace_bounds_from_summary_or_from_spans():
    now = time.time_ns()
    summarised = make_trace(start_ns=now - HOUR)
    summarised[2]["start_time"] = now - HOUR - 5 * MS  # clock skew: a child starts before its root
    unsummarised = make_trace(start_ns=now - 2 * HOUR)
    a = seed_traces(project_id=1, traces=[summarised])[0]
    b = seed_traces(project_id=1, traces=[unsummarised], summarise=False)[0]
    total = (80 + 120 + 900 + 60 + 40) * MS
    assert trace_bounds(project_id=1, trace_id=a) == (now - HOUR - 5 * MS, now - HOUR + total)
    assert trace_bounds(project_id=1, trace_id=b) == (now - 2 * HOUR, now - 2 * HOUR + total)
    assert trace_bounds(project_id=2, trace_id=a) is None
    assert trace_bounds(project_id=1, trace_id="f" * 32) is None
    assert trace_bounds(project_id=1, trace_id="not-a-trace-id") is None


def test_query_and_cursor_validation():
    now = time.time_ns()
    with pytest.raises(QueryError) as err:
        ExplorerQuery(start_ns=now, end_ns=now - 1)
    assert err.value.field == "to"
    for kwargs, field in [({"sort": "name"}, "sort"), ({"direction": "up"}, "dir"), ({"status": "bad"}, "status"),
                          ({"phase": "gpu"}, "phase"), ({"trace_id": "xyz"}, "trace_id"), ({"limit": 0}, "limit")]:
        with pytest.raises(QueryError) as err:
            q(now, **kwargs)
        assert err.value.field == field
    good = Cursor(sort="cost", direction="asc", key=1e300, trace_id="a" * 32)
    assert Cursor.decode(good.encode(), sort="cost", direction="asc") == good
    for text in ["", "!!!", "bm90IGpzb24", good.encode()[:-3]]:
        with pytest.raises(QueryError):
            Cursor.decode(text, sort="cost", direction="asc")
    with pytest.raises(QueryError, match="another sort"):
        Cursor.decode(good.encode(), sort="start", direction="asc")


# ---------------------------------------------------------------------------------- the pages
@pytest.fixture
def member(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    return client, project


@pytest.mark.django_db
def test_page_lists_rows_with_phase_bars_sort_links_and_next_page(member):
    client, project = member
    now = time.time_ns()
    ids = seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - i * 60 * NS) for i in range(1, 56)])
    response = client.get("/traces/", {"range": "24h"})
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('<tr class="" data-trace-id=') + html.count('<tr class="is-error" data-trace-id=') == 50
    assert ids[0] in html and ids[49] in html and ids[50] not in html
    assert f'href="/traces/{ids[0]}/"' in html
    assert 'data-phase="inference" style="width: 75.00%' in html
    # Sort headers keep the filters and toggle the direction of the active sort.
    assert 'href="?range=24h&amp;sort=duration&amp;dir=desc"' in html
    assert 'href="?range=24h&amp;sort=start&amp;dir=asc"' in html
    next_url = response.context["next_url"]
    assert next_url.startswith("?range=24h&cursor=")
    second = client.get("/traces/" + next_url)
    assert second.status_code == 200
    assert [r.trace_id for r in second.context["rows"]] == ids[50:]
    assert second.context["next_url"] == ""


@pytest.mark.django_db
def test_page_escapes_stored_names(member):
    client, project = member
    hostile = make_trace(start_ns=time.time_ns() - HOUR, name="<script>alert(1)</script>",
                         service='"><img src=x onerror=alert(2)>', model="<b>m</b>")
    seed_traces(project_id=project.pk, traces=[hostile])
    html = client.get("/traces/").content.decode()
    assert "<script>alert(1)</script>" not in html and "<img src=x" not in html and "<b>m</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in html


@pytest.mark.django_db
@pytest.mark.parametrize(("params", "field"), [
    ({"status": "maybe"}, "status"), ({"phase": "gpu"}, "phase"), ({"min_ms": "-5"}, "min_ms"),
    ({"max_ms": "abc"}, "max_ms"), ({"ttft_ms": "1e99"}, "ttft_ms"), ({"min_ms": "500", "max_ms": "100"}, "max_ms"),
    ({"attr": "no-equals-sign"}, "attr"), ({"attr": "=value"}, "attr"), ({"trace_id": "1234"}, "trace_id"),
    ({"sort": "name"}, "sort"), ({"dir": "sideways"}, "dir"), ({"cursor": "garbage"}, "cursor"),
    ({"range": "2y"}, "range"), ({"from": "yesterday"}, "from"), ({"from": "2026-01-02T00:00:00", "to": "2026-01-01T00:00:00"}, "from"),
    ({"service": "s" * 300}, "service"),
])
def test_bad_filter_values_are_form_errors_naming_the_field(member, params, field):
    client, _ = member
    response = client.get("/traces/", params)
    assert response.status_code == 400
    assert field in response.context["errors"]
    assert "These filters cannot be used" in response.content.decode()
    api = client.get("/traces/rows.json", params)
    assert api.status_code == 400
    body = api.json()
    assert body["error"]["code"] == "invalid_query"
    assert field in [d["field"] for d in body["error"]["details"]]


@pytest.mark.django_db
def test_other_users_project_is_404_and_rows_are_scoped(client, make_user, project_with_key):
    alice, bob = make_user(), make_user()
    mine, _ = project_with_key(members=[alice])
    theirs, _ = project_with_key(members=[bob])
    now = time.time_ns()
    my_id = seed_traces(project_id=mine.pk, traces=[make_trace(start_ns=now - HOUR)])[0]
    their_id = seed_traces(project_id=theirs.pk, traces=[make_trace(start_ns=now - HOUR)])[0]
    client.force_login(alice)
    assert client.get("/traces/", {"project": theirs.pk}).status_code == 404
    assert client.get("/traces/rows.json", {"project": theirs.pk}).status_code == 404
    html = client.get("/traces/", {"project": mine.pk}).content.decode()
    assert my_id in html and their_id not in html
    body = client.get("/traces/rows.json", {"ids": f"{my_id},{their_id}"}).json()
    assert [r["trace_id"] for r in body["rows"]] == [my_id]
    assert client.get("/traces/rows.json", {"trace_id": their_id}).json()["rows"] == []
    client.logout()
    assert client.get("/traces/rows.json").status_code == 401  # JSON, not a redirect to the login page


@pytest.mark.django_db
def test_rows_json_pages_and_filters_announced_ids(member):
    client, project = member
    now = time.time_ns()
    ok = seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - i * NS) for i in range(1, 4)])
    failed = seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - 10 * NS, error=True)])[0]
    body = client.get("/traces/rows.json", {"range": "1h", "status": "error"}).json()
    assert [r["trace_id"] for r in body["rows"]] == [failed] and body["next_cursor"] is None
    row = body["rows"][0]
    assert row["status"] == "error" and row["error_message"] == "upstream timeout" and row["span_count"] == 5
    assert [s["phase"] for s in row["phases"]] == ["network", "preprocess", "inference", "postprocess", "other"]
    # What the live page asks: which of the announced traces match its query.
    body = client.get("/traces/rows.json", {"range": "1h", "status": "ok", "ids": ",".join(ok + [failed])}).json()
    assert [r["trace_id"] for r in body["rows"]] == ok
    assert client.get("/traces/rows.json", {"ids": "nope"}).status_code == 400
    page = client.get("/traces/rows.json", {"range": "1h"}).json()
    assert len(page["rows"]) == 4
    json.dumps(page)


@pytest.mark.django_db
def test_filter_bar_shows_choices_and_keeps_the_query(member):
    client, project = member
    now = time.time_ns()
    seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - HOUR, service="svc-a", model="m-1"),
                                              make_trace(start_ns=now - HOUR, service="svc-b", model="m-2")])
    response = client.get("/traces/", {"range": "6h", "service": "svc-a", "status": "ok", "attr": "k=v"})
    html = response.content.decode()
    assert response.status_code == 200
    assert '<option value="svc-a" selected>svc-a</option>' in html and '<option value="svc-b">svc-b</option>' in html
    assert '<option value="m-2">m-2</option>' in html
    # Preset links keep the other filters and replace the range.
    assert 'href="?range=1h&amp;service=svc-a&amp;status=ok&amp;attr=k%3Dv"' in html
    assert 'name="attr" value="k=v"' in html


@pytest.mark.django_db
def test_store_down_is_a_503_page(member, monkeypatch):
    from store import StoreError

    client, _ = member

    def down(**kwargs):
        raise StoreError("connection refused")

    monkeypatch.setattr("dashboard.explorer_views.explorer_facets", down)
    response = client.get("/traces/")
    assert response.status_code == 503
    assert "unavailable" in response.content.decode()
    monkeypatch.setattr("dashboard.explorer_views.explorer_page", down)
    assert client.get("/traces/rows.json").status_code == 503


def test_llm_trace_helper_still_matches_the_explorer():
    """The shared test trace (tests/spans.py) is summarised as the explorer expects."""
    now = time.time_ns()
    tid = seed_traces(project_id=1, traces=[llm_trace(start_ns=now - HOUR)])[0]
    row = explorer_page(project_id=1, query=q(now)).rows[0]
    assert row.trace_id == tid and row.ttft_ns == 210_500_000 and row.cost_usd == pytest.approx(0.00042)
