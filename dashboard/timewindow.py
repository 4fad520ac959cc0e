"""The time window of a panel page, from the URL: ``?range=1h`` (a preset ending now) or
``?from=<ISO>&to=<ISO>`` (absolute, UTC when no offset is given). Bad values fall back to the
default and say so (``error``), so a hand-edited URL never turns into a 500."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

PRESETS = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "6h": timedelta(hours=6),
           "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
MAX_SPAN = timedelta(days=400)


@dataclass(frozen=True)
class TimeWindow:
    start: datetime
    end: datetime
    preset: str  # '' for an absolute window
    error: str = ""
    fitted: bool = False  # the preset was chosen to fit the project's data (no range in the URL)

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    def previous(self) -> "TimeWindow":
        """The window of the same length just before this one (for "change against the previous period")."""
        return TimeWindow(start=self.start - (self.end - self.start), end=self.start, preset="")


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def fit_preset(first: datetime | None, *, now: datetime, default: str) -> str | None:
    """The smallest preset, up to ``default``, that covers data starting at ``first`` (a project
    with 10 minutes of data gets 15m, not 24 hours of empty axis with a sliver at the right edge);
    None when there is no data (or it is older than ``default``): keep the default."""
    if first is None:
        return None
    age = now - first
    for preset, span in PRESETS.items():
        if span > PRESETS[default]:
            break
        if span >= age:
            return preset
    return None


def window_from_query(query, *, default: str = "1h", now: datetime | None = None,
                      fit: Callable[[datetime], datetime | None] | None = None) -> TimeWindow:
    """``fit(since)``, when given and the URL names no range, reads when the project's data starts
    (at or after ``since``); the default range then shrinks to the smallest preset covering it. An
    explicit ``?range=`` or ``?from=`` is always honoured."""
    now = now or datetime.now(timezone.utc)
    start_text, end_text = query.get("from", ""), query.get("to", "")
    if fit is not None and not start_text and not end_text and not query.get("range"):
        preset = fit_preset(fit(now - PRESETS[default]), now=now, default=default)
        if preset is not None:
            return TimeWindow(now - PRESETS[preset], now, preset, fitted=True)
    if start_text or end_text:
        try:
            start, end = parse_time(start_text), parse_time(end_text) if end_text else now
        except ValueError:
            return TimeWindow(now - PRESETS[default], now, default,
                              error="from/to must be ISO 8601 times, e.g. 2026-01-01T12:00:00Z")
        if not start < end or end - start > MAX_SPAN:
            return TimeWindow(now - PRESETS[default], now, default,
                              error=f"from must be before to, and the window at most {MAX_SPAN.days} days")
        return TimeWindow(start.astimezone(timezone.utc), end.astimezone(timezone.utc), "")
    preset = query.get("range", default)
    if preset not in PRESETS:
        return TimeWindow(now - PRESETS[default], now, default,
                          error=f"range must be one of {', '.join(PRESETS)}")
    return TimeWindow(now - PRESETS[preset], now, preset)
