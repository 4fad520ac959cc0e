"""The shared filter bar (dashboard/filters.py): read from the query string, written back into links."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django.http import QueryDict

from dashboard.filters import filter_bar_from_query

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def bar(query: str, **kw):
    return filter_bar_from_query(QueryDict(query), now=NOW, **kw)


def test_preset_range_service_and_model():
    b = bar("range=6h&service=chat-api&model=gpt-4o&status=error")
    assert (b.window.start, b.window.end, b.window.preset) == (NOW - timedelta(hours=6), NOW, "6h")
    assert b.start_ns == int((NOW - timedelta(hours=6)).timestamp()) * 10**9 and b.end_ns == int(NOW.timestamp()) * 10**9
    assert (b.service, b.model, b.errors) == ("chat-api", "gpt-4o", ())
    assert not b.is_absolute and b.from_value == "" and b.to_value == ""
    # Links keep every parameter of the page, with changes; None removes one.
    assert b.url(sort="duration", cursor=None) == "?range=6h&service=chat-api&model=gpt-4o&status=error&sort=duration"
    assert b.url(service=None) == "?range=6h&model=gpt-4o&status=error"
    links = {link["preset"]: link for link in b.preset_links()}
    assert list(links) == ["15m", "1h", "6h", "24h", "7d", "30d"]
    assert links["6h"]["active"] and not links["1h"]["active"]
    assert links["1h"]["url"] == "?range=1h&service=chat-api&model=gpt-4o&status=error"


def test_default_range_and_absolute_range():
    assert bar("", default_range="24h").window.start == NOW - timedelta(hours=24)
    b = bar("range=1h&from=2026-11-01T10:00:00&to=2026-11-01T12:30:00Z&cursor=abc")
    assert b.is_absolute and b.window.start == datetime(2026, 11, 1, 10, tzinfo=timezone.utc)
    assert b.from_value == "2026-11-01T10:00:00" and b.to_value == "2026-11-01T12:30:00"
    assert "range" not in b.params  # the absolute range wins over the preset
    # Choosing a preset drops the absolute range and the page cursor.
    assert {link["preset"]: link["url"] for link in b.preset_links()}["7d"] == "?range=7d"


def test_bad_values_fall_back_with_a_message_and_leave_the_url():
    b = bar("range=2y&service=ok", default_range="24h")
    assert b.window.preset == "24h" and b.errors and "range" in b.errors[0]
    assert b.url() == "?service=ok"
    b = bar("from=2026-11-02T00:00:00&to=2026-11-01T00:00:00")
    assert b.window.preset and b.errors and "from" not in b.params
    b = bar("service=" + "s" * 300)
    assert b.service == "" and "service" not in b.params and "256" in b.errors[0]


def test_repeated_parameters_keep_every_value():
    """The Variants view names its values as ``value=fp16&value=int8``: a preset link keeps both."""
    b = bar("key=llm.quantization&value=fp16&value=int8&range=1h")
    links = {link["preset"]: link for link in b.preset_links()}
    assert links["24h"]["url"] == "?key=llm.quantization&value=fp16&value=int8&range=24h"
    assert b.url(value="fp16") == "?key=llm.quantization&value=fp16&range=1h"
