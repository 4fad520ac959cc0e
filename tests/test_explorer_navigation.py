"""The explorer's navigation (issue 14, item 7): the total count of matching traces, Previous as
well as Next (keyset read backwards, exact across ties), the error message of error rows
(escaped, cut, whole on hover), the short trace id as a filter, and form errors that name their
parameter once."""

from __future__ import annotations

import time

import pytest

from dashboard import explorer as ex
from dashboard.explorer import Cursor, ExplorerQuery, explorer_count, explorer_page
from tests.explorer_seed import seed_traces
from tests.test_explorer import make_trace

pytestmark = [pytest.mark.clickhouse]

NS, MS = 1_000_000_000, 1_000_000
HOUR = 3600 * NS


def q(now, **kw):
    return ExplorerQuery(start_ns=now - 24 * HOUR, end_ns=now + NS, **kw)


def ids_of(page):
    return [r.trace_id for r in page.rows]


def tied_traces(now, n=23):
    """Groups with identical start, duration, TTFT and cost (ties broken by trace id), some
    without TTFT or cost (sorted last either way)."""
    start = now - HOUR
    return [make_trace(start_ns=start + (i % 3) * MS,
                       durations={"network": 10, "preprocess": 10, "inference": 100 + 100 * (i % 2), "postprocess": 10},
                       ttft_ms=None if i % 5 == 0 else 50 + (i % 2), cost=None if i % 4 == 0 else 0.01 * (i % 3))
            for i in range(n)]


@pytest.mark.parametrize("sort", ex.SORTS)
@pytest.mark.parametrize("direction", ex.DIRECTIONS)
def test_previous_pages_retrace_the_next_pages_exactly_across_ties(sort, direction):
    now = time.time_ns()
    seed_traces(project_id=1, traces=tied_traces(now))
    forward, cursor = [], None
    while True:
        page = explorer_page(project_id=1, query=q(now, sort=sort, direction=direction, limit=5, cursor=cursor))
        forward.append(page)
        if page.next_cursor is None:
            break
        cursor = Cursor.decode(page.next_cursor.encode(), sort=sort, direction=direction)
    assert len(forward) == 5 and forward[0].prev_cursor is None
    assert all(p.prev_cursor is not None for p in forward[1:])
    # Back from the last page, through the URL form of each Previous cursor, to the first.
    page, back = forward[-1], [forward[-1]]
    while page.prev_cursor is not None:
        cursor = Cursor.decode(page.prev_cursor.encode(), sort=sort, direction=direction)
        assert cursor.before
        page = explorer_page(project_id=1, query=q(now, sort=sort, direction=direction, limit=5, cursor=cursor))
        back.append(page)
    back.reverse()
    assert [ids_of(p) for p in back] == [ids_of(p) for p in forward]
    # And a Previous page's Next link leads where it came from.
    again = explorer_page(project_id=1, query=q(now, sort=sort, direction=direction, limit=5,
                                                 cursor=back[1].next_cursor))
    assert ids_of(again) == ids_of(forward[2])


def test_total_counts_each_matching_trace_once_by_its_latest_summary():
    now = time.time_ns()
    ids = seed_traces(project_id=1, traces=tied_traces(now, 7) + [make_trace(start_ns=now - HOUR, error=True)])
    seed_traces(project_id=2, traces=[make_trace(start_ns=now - HOUR)])
    assert explorer_count(project_id=1, query=q(now)) == ex.ExplorerCount(8)
    assert str(explorer_count(project_id=1, query=q(now))) == "8 traces"
    assert explorer_count(project_id=1, query=q(now, status="error")).traces == 1
    assert str(explorer_count(project_id=1, query=q(now, trace_id=ids[3]))) == "1 trace"
    assert explorer_count(project_id=1, query=q(now, trace_id="0" * 32)).traces == 0
    assert explorer_count(project_id=1, query=q(now, trace_id=ids[3][:10])).traces == 1
    # Past the cap the count stops reading and says so.
    capped = explorer_count(project_id=1, query=q(now), cap=3)
    assert capped.more and capped.traces == 7 and str(capped) == "more than 3 traces"  # 2 × 3 + 1 rows read
    assert explorer_count(project_id=1, query=q(now), cap=8) == ex.ExplorerCount(8, cap=8)


def test_total_counts_a_resummarised_trace_once_by_its_latest_version():
    now = time.time_ns()
    spans = make_trace(start_ns=now - HOUR)
    seed_traces(project_id=1, traces=[spans])
    late = [dict(s) for s in spans]
    late[0].update(status="error", status_message="late failure")
    seed_traces(project_id=1, traces=[late])  # a newer summary of the same trace
    assert explorer_count(project_id=1, query=q(now)).traces == 1
    assert explorer_count(project_id=1, query=q(now, status="error")).traces == 1
    assert explorer_count(project_id=1, query=q(now, status="ok")).traces == 0


def test_short_trace_id_is_a_prefix_of_the_projects_traces_any_time():
    now = time.time_ns()
    mine = seed_traces(project_id=1, traces=[make_trace(start_ns=now - 3 * 24 * HOUR), make_trace(start_ns=now - HOUR)])
    theirs = seed_traces(project_id=2, traces=[make_trace(start_ns=now - HOUR)])
    page = explorer_page(project_id=1, query=q(now, trace_id=mine[0][:12]))  # outside the 24 h range: found
    assert ids_of(page) == [mine[0]]
    assert ids_of(explorer_page(project_id=1, query=q(now, trace_id=mine[1][:8]))) == [mine[1]]
    assert ids_of(explorer_page(project_id=1, query=q(now, trace_id=theirs[0][:16]))) == []  # another project's
    with pytest.raises(ex.QueryError):
        q(now, trace_id="abc")


# ---------------------------------------------------------------------------------- the pages
@pytest.fixture
def member(client, make_user, project_with_key):
    user = make_user()
    project, _ = project_with_key(members=[user])
    client.force_login(user)
    return client, project


@pytest.mark.django_db
def test_page_shows_the_total_and_previous_next_links_that_round_trip(member):
    client, project = member
    now = time.time_ns()
    ids = seed_traces(project_id=project.pk, traces=[make_trace(start_ns=now - i * 60 * NS) for i in range(1, 56)]
                      + [make_trace(start_ns=now - (i % 2) * NS - HOUR) for i in range(1050 - 55)])
    first = client.get("/traces/", {"range": "24h"})
    html = first.content.decode()
    assert "<strong>1,050 traces</strong> match this query" in html
    assert first.context["prev_url"] == "" and 'id="prev-page"' not in html
    second = client.get("/traces/" + first.context["next_url"])
    assert [r.trace_id for r in second.context["rows"]][:5] == ids[50:55]
    assert 'id="prev-page"' in second.content.decode()
    back = client.get("/traces/" + second.context["prev_url"])
    assert [r.trace_id for r in back.context["rows"]] == [r.trace_id for r in first.context["rows"]]
    assert back.context["prev_url"] == ""  # the first page again: nothing before it
    assert "1,050 traces" in back.content.decode()


@pytest.mark.django_db
def test_error_rows_show_their_message_escaped_and_cut_with_the_whole_on_hover(member):
    client, project = member
    spans = make_trace(start_ns=time.time_ns() - HOUR, error=True)
    message = "<script>alert(1)</script> upstream said: " + "x" * 200
    spans[0]["status_message"] = message
    seed_traces(project_id=project.pk, traces=[spans])
    html = client.get("/traces/").content.decode()
    assert "<script>alert(1)</script>" not in html
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt; upstream said: "
    assert f'<span class="error-message" title="{escaped}{"x" * 200}">{escaped}' in html
    shown = html.split('<span class="error-message"', 1)[1].split(">", 1)[1].split("</span>", 1)[0]
    assert shown.endswith("…") and "x" * 100 not in shown


@pytest.mark.django_db
def test_short_id_search_on_the_page_and_its_json(member):
    client, project = member
    ids = seed_traces(project_id=project.pk, traces=[make_trace(start_ns=time.time_ns() - HOUR) for _ in range(3)])
    response = client.get("/traces/", {"trace_id": ids[1][:12].upper()})
    assert response.status_code == 200 and [r.trace_id for r in response.context["rows"]] == [ids[1]]
    assert client.get("/traces/rows.json", {"trace_id": ids[1][:8]}).json()["rows"][0]["trace_id"] == ids[1]
    bad = client.get("/traces/", {"trace_id": "abc"})
    assert bad.status_code == 400 and "first 8 or more" in bad.context["errors"]["trace_id"]


@pytest.mark.django_db
@pytest.mark.parametrize(("params", "field", "says"), [
    ({"range": "2y"}, "range", "must be one of"),
    ({"from": "yesterday"}, "from", "must be ISO 8601"),
    ({"service": "s" * 300}, "service", "is longer than"),
])
def test_form_errors_name_their_parameter_once(member, params, field, says):
    client, _ = member
    response = client.get("/traces/", params)
    assert response.status_code == 400
    message = response.context["errors"][field]
    assert says in message and not message.startswith(field)
    html = response.content.decode()
    assert f"<code>{field}</code> {field}" not in html
    assert html.count(says) == 1  # the filter bar says it; the page's box points there
    assert f"<code>{field}</code>: see the filter bar above" in html
    api = client.get("/traces/rows.json", params).json()["error"]
    assert f"{field}: {field} " not in api["message"]
