"""The compare page's query: two sides, each a time window (``mode=windows``), a model
(``mode=models``) or a value of a span attribute such as a release (``mode=attribute``), read
from the URL. Bad values fall back to defaults with a message; nothing here raises."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from analytics import rollups
from analytics.panel_selectors import WindowStats, window_stats
from .timewindow import TimeWindow, parse_time, window_from_query
from analytics.trace_math import PHASES

MODES = ("windows", "models", "attribute")
MAX_NAME = 256


@dataclass(frozen=True)
class Side:
    label: str
    start: datetime
    end: datetime
    model: str = ""
    attribute: tuple[str, str] | None = None


@dataclass(frozen=True)
class CompareQuery:
    mode: str
    window: TimeWindow  # the shared window of the models / attribute modes
    service: str
    a: Side
    b: Side
    attribute_key: str
    errors: tuple[str, ...] = ()


def _window(query, prefix: str, default: tuple[datetime, datetime], errors: list[str]) -> tuple[datetime, datetime]:
    start_text, end_text = query.get(f"{prefix}_from", ""), query.get(f"{prefix}_to", "")
    if not start_text and not end_text:
        return default
    try:
        start, end = parse_time(start_text), parse_time(end_text)
    except ValueError:
        errors.append(f"{prefix}_from and {prefix}_to must be ISO 8601 times, e.g. 2026-01-01T12:00:00Z")
        return default
    if not start < end or end - start > timedelta(days=400):
        errors.append(f"{prefix}_from must be before {prefix}_to, and the window at most 400 days")
        return default
    return start.astimezone(timezone.utc), end.astimezone(timezone.utc)


def _name(query, key: str, errors: list[str]) -> str:
    value = (query.get(key) or "").strip()
    if len(value) > MAX_NAME:
        errors.append(f"{key} is longer than {MAX_NAME} characters")
        return ""
    return value


def compare_query_from(query, *, now: datetime | None = None) -> CompareQuery:
    now = now or datetime.now(timezone.utc)
    errors: list[str] = []
    mode = query.get("mode") or "windows"
    if mode not in MODES:
        errors.append(f"mode must be one of {', '.join(MODES)}")
        mode = "windows"
    window = window_from_query(query, default="24h", now=now)
    if window.error:
        errors.append(window.error)
    service = _name(query, "service", errors)
    key = _name(query, "attr", errors) or "release"
    if mode == "windows":
        # Default: the last 24 hours (B) against the 24 hours before (A).
        b = _window(query, "b", (now - timedelta(days=1), now), errors)
        a = _window(query, "a", (b[0] - (b[1] - b[0]), b[0]), errors)
        side_a = Side(label=f"A: {a[0]:%Y-%m-%d %H:%M} – {a[1]:%Y-%m-%d %H:%M}", start=a[0], end=a[1])
        side_b = Side(label=f"B: {b[0]:%Y-%m-%d %H:%M} – {b[1]:%Y-%m-%d %H:%M}", start=b[0], end=b[1])
    elif mode == "models":
        model_a, model_b = _name(query, "a_model", errors), _name(query, "b_model", errors)
        side_a = Side(label=f"A: model {model_a or '(all)'}", start=window.start, end=window.end, model=model_a)
        side_b = Side(label=f"B: model {model_b or '(all)'}", start=window.start, end=window.end, model=model_b)
    else:
        value_a, value_b = _name(query, "a_value", errors), _name(query, "b_value", errors)
        side_a = Side(label=f"A: {key} = {value_a or '(any)'}", start=window.start, end=window.end,
                      attribute=(key, value_a) if value_a else None)
        side_b = Side(label=f"B: {key} = {value_b or '(any)'}", start=window.start, end=window.end,
                      attribute=(key, value_b) if value_b else None)
    return CompareQuery(mode=mode, window=window, service=service, a=side_a, b=side_b, attribute_key=key,
                        errors=tuple(errors))


def side_stats(*, project_id: int, side: Side, service: str) -> WindowStats:
    """One side's figures: from the rollups, except an attribute side (the rollups keep no
    attributes), which reads the per-trace summaries joined with the spans that carry it."""
    if side.attribute:
        return window_stats(project_id=project_id, start=side.start, end=side.end, service=service,
                            release=side.attribute)
    return rollups.window_stats(project_id=project_id, start=side.start, end=side.end, service=service,
                                model=side.model)


@dataclass(frozen=True)
class CompareRow:
    group: str
    label: str
    a: float | None
    b: float | None
    unit: str
    lower_is_better: bool | None
    digits: int = 1

    @property
    def change_percent(self) -> float | None:
        """(B − A) / A in %: what B did to A."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return 100.0 * (self.b - self.a) / abs(self.a)

    @property
    def verdict(self) -> str:
        change = self.change_percent
        if change is None or self.lower_is_better is None or abs(change) < 0.5:
            return "flat"
        return "better" if (change < 0) == self.lower_is_better else "worse"


def compare_rows(a: WindowStats, b: WindowStats) -> list[CompareRow]:
    def pct(v):
        return None if v is None else 100 * v

    rows = [
        CompareRow("Traffic", "Requests", a.requests, b.requests, "", None, 0),
        CompareRow("Traffic", "Throughput (RPS)", a.rps, b.rps, "/s", False, 4),
        CompareRow("Traffic", "Output tokens/s", a.output_tps, b.output_tps, "/s", False, 2),
        CompareRow("Traffic", "Error rate", pct(a.error_rate), pct(b.error_rate), "%", True, 2),
    ]
    for q, name in ((0.5, "P50"), (0.95, "P95"), (0.99, "P99")):
        rows.append(CompareRow("End-to-end", f"E2E {name}", a.e2e_ms[q], b.e2e_ms[q], "ms", True))
    for q, name in ((0.5, "P50"), (0.95, "P95"), (0.99, "P99")):
        rows.append(CompareRow("TTFT", f"TTFT {name}", a.ttft_ms[q], b.ttft_ms[q], "ms", True))
    for q, name in ((0.5, "P50"), (0.95, "P95")):
        rows.append(CompareRow("TTFT", f"TPOT {name}", a.tpot_ms[q], b.tpot_ms[q], "ms", True, 2))
    for phase in PHASES:
        for q, name in ((0.5, "P50"), (0.95, "P95"), (0.99, "P99")):
            rows.append(CompareRow("Phases", f"{phase} {name}", a.phase_ms[phase][q], b.phase_ms[phase][q], "ms", True))
    rows.append(CompareRow("Phases", "Inference share", pct(a.inference_share), pct(b.inference_share), "%", None))
    rows += [
        CompareRow("Cost", "Cost", a.cost_usd, b.cost_usd, "USD", None, 4),
        CompareRow("Cost", "Cost per request", a.cost_per_request, b.cost_per_request, "USD", True, 6),
        CompareRow("Cost", "Cost per 1k tokens", a.cost_per_1k_tokens, b.cost_per_1k_tokens, "USD", True, 6),
    ]
    return rows
