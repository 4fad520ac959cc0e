"""Trace-query scenarios for bench/query.py: the reads of the trace page and the explorer, each
run in-process through the selector the page calls (server time, no HTTP).

A scenario is anything with ``name``, ``target_ms`` (None: no target), ``jaeger_ms`` (Jaeger's
published figure for the same search, or None), ``setup(store)`` (called once: picks the ids,
users and times to query from the loaded data) and ``run(i)`` (one timed call; ``i`` varies the
input so runs do not all hit the same granules). ``SCENARIOS`` lists them in print order.

Jaeger's figures: its ClickHouse storage benchmark (jaeger-clickhouse, 10 M spans) publishes
101 ms to fetch a trace by id, 37 ms to search by service and 1,769 ms to search by a tag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

NS = 1_000_000_000
HOUR = 3600 * NS
PROJECT_ID = 1


@dataclass
class Scenario:
    name: str
    target_ms: float | None
    jaeger_ms: float | None
    prepare: Callable[[Any], dict]
    call: Callable[[dict, int], int]  # returns the number of rows (or spans) it got
    state: dict = field(default_factory=dict)
    note: str = ""

    def setup(self, store) -> None:
        self.state = self.prepare(store)

    def run(self, i: int) -> int:
        return self.call(self.state, i)


def _latest_ns(store) -> int:
    return int(store.query("SELECT toUnixTimestamp64Nano(max(start_time)) FROM traces WHERE project_id = {p:UInt64}",
                           {"p": PROJECT_ID}, tag="bench.query.latest").scalar())


def _sample_trace_ids(store) -> dict:
    # Spread over the whole 30 days: a trace of any age is found as fast as a recent one.
    rows = store.query(
        "SELECT trace_id FROM traces WHERE project_id = {p:UInt64} AND cityHash64(trace_id) % 5000 = 0 LIMIT 100",
        {"p": PROJECT_ID}, tag="bench.query.sample_ids").rows
    return {"ids": [r[0] for r in rows]}


def _trace_by_id(state: dict, i: int) -> int:
    """What the trace page and GET /api/v1/traces/<id> do: the trace's spans, tree and figures."""
    trace_id = state["ids"][i % len(state["ids"])]
    try:
        from dashboard.trace_detail import trace_get
    except ImportError:  # the trace page's selector; without it, the bounded spans read alone
        return len(_spans_by_bounds(trace_id))
    detail = trace_get(project_id=PROJECT_ID, trace_id=trace_id)
    assert detail is not None, trace_id
    return len(detail.spans)


def _spans_by_bounds(trace_id: str) -> list:
    from dashboard.explorer import trace_bounds
    from store import get_store

    lo, hi = trace_bounds(project_id=PROJECT_ID, trace_id=trace_id)
    return get_store().query(
        "SELECT * FROM spans WHERE project_id = {p:UInt64} AND trace_id = {t:FixedString(32)}"
        " AND start_time >= fromUnixTimestamp64Nano({lo:Int64}) AND start_time <= fromUnixTimestamp64Nano({hi:Int64})",
        {"p": PROJECT_ID, "t": trace_id, "lo": lo, "hi": hi}, tag="bench.query.spans_by_bounds").rows


def _window(store, hours: float) -> dict:
    end = _latest_ns(store) + 1
    return {"end": end, "start": end - int(hours * HOUR)}


def _explorer(**filters):
    def call(state: dict, i: int) -> int:
        from dashboard.explorer import ExplorerQuery, explorer_page

        extra = {k: (v(state, i) if callable(v) else v) for k, v in filters.items()}
        page = explorer_page(project_id=PROJECT_ID, query=ExplorerQuery(start_ns=state["start"], end_ns=state["end"], **extra))
        return len(page.rows)
    return call


def _second_page_setup(store) -> dict:
    """The 24 h window and the cursor that the first page (service filter) hands out."""
    from dashboard.explorer import ExplorerQuery, explorer_page

    state = _window(store, 24)
    first = explorer_page(project_id=PROJECT_ID, query=ExplorerQuery(
        start_ns=state["start"], end_ns=state["end"], service="agent-gateway"))
    state["cursor"] = first.next_cursor
    return state


def _explorer_page2(state: dict, i: int) -> int:
    from dashboard.explorer import ExplorerQuery, explorer_page

    page = explorer_page(project_id=PROJECT_ID, query=ExplorerQuery(
        start_ns=state["start"], end_ns=state["end"], service="agent-gateway", cursor=state["cursor"]))
    return len(page.rows)


def _facets(state: dict, i: int) -> int:
    from dashboard.explorer import explorer_facets

    facets = explorer_facets(project_id=PROJECT_ID, start_ns=state["start"], end_ns=state["end"])
    return len(facets["services"]) + len(facets["models"])


def _attribute_values(store, key: str, hours: float) -> dict:
    """Values of ``key`` on spans of the last ``hours``, to filter by (different ones per run)."""
    state = _window(store, hours)
    rows = store.query(
        "SELECT DISTINCT attributes[{k:String}] AS v FROM spans WHERE project_id = {p:UInt64}"
        " AND start_time >= fromUnixTimestamp64Nano({s:Int64}) AND start_time < fromUnixTimestamp64Nano({e:Int64})"
        " AND parent_span_id = '' AND mapContains(attributes, {k:String}) LIMIT 200",
        {"p": PROJECT_ID, "k": key, "s": state["start"], "e": state["end"]}, tag="bench.query.attribute_values").rows
    state["values"] = [r[0] for r in rows]
    return state


def _by_attribute(key: str):
    def value(state: dict, i: int):
        return (key, state["values"][i % len(state["values"])])
    return value


SCENARIOS = [
    Scenario("trace by id (spans, tree, figures)", 50, 101, _sample_trace_ids, _trace_by_id,
             note="trace_detail.trace_get: summary bounds + spans of the trace"),
    Scenario("explorer first page, service filter, 24 h", 100, 37, lambda s: _window(s, 24), _explorer(service="agent-gateway")),
    Scenario("explorer first page, service filter, 30 d", None, None, lambda s: _window(s, 24 * 31), _explorer(service="agent-gateway")),
    Scenario("explorer next page (cursor), service, 24 h", None, None, _second_page_setup, _explorer_page2),
    Scenario("explorer filter choices (services, models), 24 h", None, None, lambda s: _window(s, 24), _facets),
    Scenario("explorer sorted by duration, errors, 24 h", None, None, lambda s: _window(s, 24),
             _explorer(sort="duration", status="error")),
    Scenario("attribute filter user.id=…, 24 h", 300, 1769, lambda s: _attribute_values(s, "user.id", 24),
             _explorer(attribute=_by_attribute("user.id"))),
    Scenario("attribute filter session.id=…, 24 h", 300, None, lambda s: _attribute_values(s, "session.id", 24),
             _explorer(attribute=_by_attribute("session.id"))),
    Scenario("attribute filter user.id=…, 7 d", None, None, lambda s: _attribute_values(s, "user.id", 24 * 7),
             _explorer(attribute=_by_attribute("user.id"))),
]


def timed(fn, *args) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args)
    return (time.perf_counter() - started) * 1000, result
