"""The rule editor's preview: the rule's metric per series over the last hours against its threshold."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone

from charts import figure, figure_dict, threshold_line
from store import get_store

from .latency import figures_sql, series_from_row, summaries_bring_up_to_date, window_params
from .metrics import _AGG_SQL, _RESOURCE_FIGURES, engine_series_of, rule_values, series_key, Series
from .models import ENGINE_METRICS, GPU_METRICS, LATENCY_METRICS, PROCESS_METRICS, Comparator, Metric

RESOURCE_HOURS = 6
LATENCY_HOURS = 6
MAX_SERIES = 20

_RESOURCE_PREVIEW_SQL = """
SELECT host, gpu_index, toUnixTimestamp(toStartOfInterval(time, toIntervalSecond({{step:UInt32}}))) AS bucket,
       {agg} AS value
FROM (
    SELECT host, gpu_index, time, {figure} AS f
    FROM resource_samples
    WHERE project_id = {{project_id:UInt64}}
      AND time > fromUnixTimestamp64Milli({{since_ms:Int64}})
      AND gpu_index {gpu_filter}
)
GROUP BY host, gpu_index, bucket
HAVING value IS NOT NULL
ORDER BY bucket
"""


def rule_preview_figure(*, rule, now: datetime | None = None) -> dict:
    now = now or datetime.now(timezone.utc)
    metric = rule.metric
    hours = LATENCY_HOURS if metric in LATENCY_METRICS else RESOURCE_HOURS
    title = f"{rule.condition} — last {hours} h"
    fig = figure(title={"text": title, "x": 0, "font": {"size": 13}}, height=320,
                 yaxis={"title": {"text": Metric(metric).label}},
                 xaxis={"type": "date", "range": [now - timedelta(hours=hours), now]})  # the whole period, always
    if metric in PROCESS_METRICS:
        lines = {}
        note = "The leak ratio needs each process's baseline; see the current values on the alerts page."
        fig.add_annotation(text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    elif metric in LATENCY_METRICS:
        lines = _latency_lines(rule, now)
    elif metric in ENGINE_METRICS:
        lines = _engine_lines(rule, now)
    else:
        lines = _resource_lines(rule, now)
    for key, points in sorted(lines.items())[:MAX_SERIES]:
        xs = [datetime.fromtimestamp(t, tz=timezone.utc) for t, _ in points]
        fig.add_scatter(x=xs, y=[v for _, v in points], mode="lines+markers", name=key or "project",
                        marker={"size": 4})
    threshold_line(fig, y=rule.threshold, label=f"threshold {Comparator(rule.comparator).label} {rule.threshold:g}")
    if not lines and metric not in PROCESS_METRICS:
        fig.add_annotation(text="no data in this period", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return figure_dict(fig)


def _resource_lines(rule, now: datetime) -> dict[str, list[tuple[int, float]]]:
    step = max(60, min(int(rule.window_seconds), 900))
    agg = rule.aggregation if rule.aggregation in _AGG_SQL else "last"
    sql = _RESOURCE_PREVIEW_SQL.format(agg=_AGG_SQL[agg].format(c="f"), figure=_RESOURCE_FIGURES[Metric(rule.metric)],
                                       gpu_filter=">= 0" if rule.metric in GPU_METRICS else "= -1")
    rows = get_store().query(sql, {"project_id": rule.project_id, "step": step,
                                   "since_ms": int(now.timestamp() * 1000) - RESOURCE_HOURS * 3600 * 1000},
                             tag="alerts.preview.resources").dicts()
    series = []
    for r in rows:
        labels = {"host": r["host"]} if r["gpu_index"] < 0 else {"host": r["host"], "gpu": str(r["gpu_index"])}
        series.append((int(r["bucket"]), Series(series_key(labels), labels, {f"{rule.metric}__{agg}": float(r["value"])})))
    return _collect(rule, series)


def _latency_lines(rule, now: datetime) -> dict[str, list[tuple[int, float]]]:
    """The rule's figure per window-long bucket of the period (each point at its bucket's end)."""
    summaries_bring_up_to_date(rule.project_id)
    step = max(60, int(rule.window_seconds))
    until_ns = int(now.timestamp() * 1000) * 1_000_000
    since_ns = until_ns - LATENCY_HOURS * 3600 * 1_000_000_000
    group_by = getattr(rule, "group_by", "") or ""
    params = window_params(project_id=rule.project_id, since_ns=since_ns, until_ns=until_ns, model=rule.model)
    if group_by:
        params.update(group_by=group_by, group_value=rule.group_value or "", service=rule.service or "")
    rows = get_store().query(figures_sql(bucket_seconds=step, grouped=bool(group_by)), params,
                             tag="alerts.preview.latency").dicts()
    series = [((since_ns // 1_000_000_000) + (int(row["bucket"]) + 1) * step,
               series_from_row(row, window_seconds=step, group_by=group_by)) for row in rows]
    return _collect(rule, series)


def _engine_lines(rule, now: datetime) -> dict[str, list[tuple[int, float]]]:
    """The rule's figure per window-long bucket of the period, from the same engine reads."""
    from analytics.engines import engine_series

    step = max(60, int(rule.window_seconds))
    series = engine_series(project_id=rule.project_id, start=now - timedelta(hours=RESOURCE_HOURS), end=now,
                           step_seconds=step)
    stamped = [(int(t.timestamp()) + step, engine_series_of(f))
               for instance in series.instances for t, f in zip(series.times, instance.buckets) if f is not None]
    return _collect(rule, stamped)


def _collect(rule, stamped: list[tuple[int, Series]]) -> dict[str, list[tuple[int, float]]]:
    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for t, s in stamped:
        for key, (_, value) in rule_values(rule, [s]).items():
            if value is not None:
                lines[key].append((t, value))
    return lines
