"""Silence matchers over an alert's labels, Alertmanager's four operators."""

from __future__ import annotations

import re
from datetime import datetime

OPERATORS = ("=", "!=", "=~", "!~")


class MatcherError(ValueError):
    pass


def matchers_validate(matchers) -> list[dict]:
    """Normalised matchers, or MatcherError naming the one at fault."""
    if not isinstance(matchers, list) or not matchers:
        raise MatcherError("matchers: give at least one matcher")
    out = []
    for i, m in enumerate(matchers):
        if not isinstance(m, dict):
            raise MatcherError(f"matchers[{i}]: expected an object with label, op, value")
        label, op, value = m.get("label"), m.get("op", "="), m.get("value")
        if not isinstance(label, str) or not label.strip():
            raise MatcherError(f"matchers[{i}].label: a label name is required")
        if op not in OPERATORS:
            raise MatcherError(f"matchers[{i}].op: expected one of {', '.join(OPERATORS)}, got {op!r}")
        if not isinstance(value, str):
            raise MatcherError(f"matchers[{i}].value: expected a string")
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise MatcherError(f"matchers[{i}].value: bad regular expression ({exc})") from None
        out.append({"label": label.strip(), "op": op, "value": value})
    return out


def matcher_matches(matcher: dict, labels: dict) -> bool:
    actual = str(labels.get(matcher["label"], ""))
    op, value = matcher["op"], matcher["value"]
    if op == "=":
        return actual == value
    if op == "!=":
        return actual != value
    hit = re.fullmatch(value, actual) is not None
    return hit if op == "=~" else not hit


def silenced(silences, labels: dict, now: datetime) -> bool:
    return any(s.starts_at <= now < s.ends_at and all(matcher_matches(m, labels) for m in s.matchers)
               for s in silences)
