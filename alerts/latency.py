"""Latency metrics of a window, per root service, from the per-trace summaries.

The summaries (``traces``: every figure of DOMAIN.md "Per trace", computed in ClickHouse by the
summariser) are brought up to date for the project first (an incremental run: what arrived since
the last one), so a request acknowledged before the evaluation counts. A request is a trace whose
ROOT span starts in the window (DOMAIN.md "Over a time window"); traces whose root has not
arrived are not counted yet. The figures are computed in ClickHouse over the latest summary of each.

Per service (the root span's), over the window's requests:
- ``e2e_p50_ms`` / ``e2e_p95_ms`` / ``e2e_p99_ms``: exact percentiles (linear interpolation
  between closest ranks, ``quantileExactInclusive``) of the roots' durations;
- ``ttft_p95_ms``: over the requests that report a TTFT;
- ``phase_share_percent:<phase>``: that phase's exclusive time summed over the requests / their
  summed E2E (time-weighted, so one long request weighs what it cost);
- ``network_p95_ms``: over the requests that spent any time on the network;
- ``error_rate_percent``: error requests / requests, a request's status being its root's
  (DOMAIN.md "Status": one whose failed model call was retried successfully is recovered, not an
  error); ``request_rate``: requests / window seconds.
A service without a request in the window has no series this round (missing, never 0).

A rule with ``group_by`` (an attribute key, e.g. ``user.tier``) has one series per value of that
attribute instead of per service (labels ``{"user.tier": "premium"}``), over the requests whose
trace carries the key (a trace's value is its earliest span's with the key), only ``group_value``
when the rule names one, and only the rule's service when it names one.
Load-test traffic (traces whose spans carry ``loadtest.run_id``: ``traces.loadtest``) is left out:
a load test measures the service on purpose and must not page anyone (its report shows what it
measured). Each series' ``sample_at`` is the start of its newest request.
"""

from __future__ import annotations

from datetime import datetime, timezone

from django.conf import settings

from analytics.attribute_index import key_declare
from analytics.grouping import trace_value_sql
from analytics.panel_selectors import latest_summaries_sql
from analytics.summary_sql import PHASES
from store import get_store

from .metrics import Series, series_key

# The latest summary of each rooted trace starting in (since, until], as the panels read a window
# (``analytics.panel_selectors.latest_summaries_sql``): from ``traces_by_start`` alone, FINAL, over
# the window's granules only ([since + 1, until + 1) in ns: ``window_params``). Reading the window's
# trace ids there and then their summaries by id in ``traces`` cost ~4x the CPU (~370 against ~100 ms
# over 5 minutes at 12,500 spans/s, ``bench/alert_round_cost.py``), every alert round.
_REQUESTS = latest_summaries_sql(
    "trace_id, start_time, service, models, has_root, loadtest, status, e2e_ns, ttft_ns, "
    + ", ".join(f"{p}_ns" for p in PHASES),
    [("lo_ns", "hi_ns")], unit="Nano",
    where="has_root = 1 AND loadtest = 0 AND ({model:String} = '' OR has(models, {model:String}))")


def window_params(*, project_id: int, since_ns: int, until_ns: int, model: str = "") -> dict:
    """The parameters of ``figures_sql`` for the requests whose root starts in (since_ns, until_ns]."""
    return {"project_id": project_id, "since_ns": since_ns, "until_ns": until_ns, "model": model or "",
            "lo_ns": since_ns + 1, "hi_ns": until_ns + 1}


# Grouped rules (``group_by``): the window's requests joined to the value of the attribute their
# trace carries (the earliest span's with the key, span attribute before resource attribute: as the
# grouped charts, analytics.grouping), inner-joined (a trace without the key is in no series), kept
# to ``group_value`` when given and to the rule's service when given.
_GROUP_VALUES = trace_value_sql(key="group_by", since="since_ns", until="until_ns", unit="Nano", lower=">", upper="<=")
_GROUPED_REQUESTS = """
SELECT r.start_time AS start_time, r.service AS service, r.status AS status, r.e2e_ns AS e2e_ns,
       r.ttft_ns AS ttft_ns, {phase_columns}, tv.v AS group_value
FROM ({requests}) AS r
INNER JOIN (
{trace_value}
) AS tv ON r.trace_id = tv.trace_id
WHERE ({{group_value:String}} = '' OR tv.v = {{group_value:String}})
  AND ({{service:String}} = '' OR r.service = {{service:String}})
"""

# The three E2E percentiles come from one ``quantilesExactInclusive`` (one copy of the values and
# one sort per series, the same interpolation as ``quantileExactInclusive``): three separate ones
# copied and partitioned the values three times. Over 703,000 requests (5 minutes at 20,000
# spans/s) the read went from 182 to 163 ms of CPU (docs/BENCHMARKS.md, "2026-12-07, late night").
_FIGURES = """
SELECT {bucket} AS bucket, {series_column} AS series_value,
    count() AS requests,
    quantilesExactInclusive(0.5, 0.95, 0.99)(e2e_ns) AS e2e_q,
    e2e_q[1] AS e2e_p50, e2e_q[2] AS e2e_p95, e2e_q[3] AS e2e_p99,
    countIf(ttft_ns IS NOT NULL) AS ttft_n, quantileExactInclusiveIf(0.95)(assumeNotNull(ttft_ns), ttft_ns IS NOT NULL) AS ttft_p95,
    countIf(network_ns > 0) AS network_n, quantileExactInclusiveIf(0.95)(network_ns, network_ns > 0) AS network_p95,
    countIf(status = 'error') AS errors, sum(e2e_ns) AS e2e_total, {phase_sums},
    toUnixTimestamp64Nano(max(start_time)) AS newest_ns
FROM ({requests})
GROUP BY bucket, series_value
ORDER BY bucket, series_value
"""


def figures_sql(*, bucket_seconds: int | None = None, grouped: bool = False) -> str:
    """Per (bucket, service) figures of the requests in (since_ns, until_ns]; one bucket (0) when
    ``bucket_seconds`` is None, else buckets of that many seconds counted from ``since_ns``.
    ``grouped``: per (bucket, value of attribute ``group_by``) instead of per service (parameters
    ``group_by``, ``group_value``, ``service``)."""
    bucket = "0" if bucket_seconds is None else (
        f"intDiv(toUnixTimestamp64Nano(start_time) - {{since_ns:Int64}} - 1, {int(bucket_seconds) * 1_000_000_000})")
    requests = _REQUESTS
    if grouped:
        requests = _GROUPED_REQUESTS.format(requests=requests, trace_value=_GROUP_VALUES,
                                            phase_columns=", ".join(f"r.{p}_ns AS {p}_ns" for p in PHASES))
    return _FIGURES.format(bucket=bucket, requests=requests, series_column="group_value" if grouped else "service",
                           phase_sums=", ".join(f"sum({p}_ns) AS {p}_total" for p in PHASES))


_WINDOW_SQL = figures_sql()
_GROUPED_WINDOW_SQL = figures_sql(grouped=True)


def series_from_row(row: dict, *, window_seconds: float, group_by: str = "") -> Series:
    """A row's series: labelled ``{"service": …}``, or ``{group_by: value}`` for a grouped rule."""
    def ms(value):
        return float(value) / 1e6

    total = int(row["e2e_total"])
    values = {
        "e2e_p50_ms": ms(row["e2e_p50"]),
        "e2e_p95_ms": ms(row["e2e_p95"]),
        "e2e_p99_ms": ms(row["e2e_p99"]),
        "ttft_p95_ms": ms(row["ttft_p95"]) if row["ttft_n"] else None,
        "network_p95_ms": ms(row["network_p95"]) if row["network_n"] else None,
        "error_rate_percent": 100.0 * int(row["errors"]) / int(row["requests"]),
        "request_rate": int(row["requests"]) / window_seconds,
    }
    for phase in PHASES:
        values[f"phase_share_percent:{phase}"] = 100.0 * int(row[f"{phase}_total"]) / total if total > 0 else None
    labels = {group_by: row["series_value"]} if group_by else {"service": row["series_value"]}
    newest = datetime.fromtimestamp(int(row["newest_ns"]) / 1e9, tz=timezone.utc)
    key = f"{group_by}={row['series_value']}" if group_by else series_key(labels)
    return Series(key, labels, values, newest)


# Under load a summariser run takes seconds and the embedded beat runs it, the rollups and the
# alerts one after another, so the watermark is often a few seconds old when the alerts look.
SUMMARIES_FRESH_SECONDS = 10


def summaries_bring_up_to_date(project_id: int) -> None:
    """Summarise what arrived since the summariser's last run (incremental; cheap when nothing did),
    unless the periodic summariser brought the project up to date within ``SUMMARIES_FRESH_SECONDS``
    (or two of its intervals, if longer): then a second run per alert round (one per rule window)
    would only repeat its work while ingestion is busy, and the figures are at most that old.
    It runs under the summariser's lease of the project: while a summariser (here or in another
    worker) is summarising that project, this round leaves it to that run instead of repeating it."""
    from analytics.summarizer import SUMMARIZE_LEASE, summaries_fresh, traces_summarize
    from server.leases import run_by_project

    within = max(SUMMARIES_FRESH_SECONDS, 2 * settings.TRACEDASH_SUMMARIZE_SECONDS)
    if summaries_fresh(project_id=project_id, within_seconds=within):
        return
    run_by_project(SUMMARIZE_LEASE, lambda batch: traces_summarize(project_ids=batch), [project_id])


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def latency_fetch(*, project_id: int, window_seconds: int, now: datetime, model: str = "", group_by: str = "",
                  group_value: str = "", service: str = "") -> list[Series]:
    """The window's series per root service; with ``group_by``, per value of that span/resource
    attribute instead (only ``group_value`` when given; only requests of ``service`` when given)."""
    summaries_bring_up_to_date(project_id)
    until_ns = _ms(now) * 1_000_000
    since_ns = until_ns - window_seconds * 1_000_000_000
    params = window_params(project_id=project_id, since_ns=since_ns, until_ns=until_ns, model=model)
    if group_by:
        key_declare(project_id=project_id, key=group_by)
        params.update(group_by=group_by, group_value=group_value, service=service)
    rows = get_store().query(_GROUPED_WINDOW_SQL if group_by else _WINDOW_SQL, params,
                             tag="alerts.latency.latency_fetch").dicts()
    return [series_from_row(row, window_seconds=window_seconds, group_by=group_by) for row in rows]
