"""The filter bar shared by the project pages: time range, service, model — read from the query
string and written back into every link, so a page's URL always holds its whole query.

Use in a view::

    bar = filter_bar_from_query(request.GET, default_range="24h")
    # bar.window (dashboard.timewindow.TimeWindow: start, end, preset), bar.start_ns, bar.end_ns,
    # bar.service, bar.model ("" = all), bar.errors (messages for the user; bad values fall back)
    context = {"filters": bar, "filter_choices": {"services": [...], "models": [...]}}

and in the template ``{% include "dashboard/_filters.html" %}``: preset links (15m … 30d),
absolute from/to (UTC), service and model choices, and an Apply button. A page with more fields
of its own passes ``extra_fields="its/_fields.html"`` to the include; they sit in the same form.
``bar.url(**changes)`` gives the current URL's query with changes (``None`` drops a parameter),
for sort headers, pagination and preset links. Parameters: ``range`` (a preset) or ``from``/``to``
(ISO 8601, UTC when no offset), ``service``, ``model``; other parameters of the page are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlencode

from .timewindow import PRESETS, TimeWindow, window_from_query

MAX_NAME = 256  # services and models are at most 256 characters (ingest limit)
BAR_PARAMS = ("range", "from", "to", "service", "model")


@dataclass(frozen=True)
class FilterBar:
    window: TimeWindow
    service: str = ""
    model: str = ""
    params: dict[str, str | list[str]] = field(default_factory=dict)  # every non-empty parameter (a list when repeated)
    errors: tuple[str, ...] = ()  # whole sentences ("range must be one of …"), for the bar itself
    # The same errors as (parameter, message without the parameter's name), for a page that lists
    # them under the parameter ("<code>range</code> must be one of …"), so the name is not said twice.
    field_errors: tuple[tuple[str, str], ...] = ()

    @property
    def start_ns(self) -> int:
        return _ns(self.window.start)

    @property
    def end_ns(self) -> int:
        return _ns(self.window.end)

    @property
    def is_absolute(self) -> bool:
        return not self.window.preset

    def url(self, **changes: str | None) -> str:
        """``?query`` of the current parameters with ``changes`` applied (``None`` removes one).
        Keyword-unfriendly names: ``url(**{"from": None})``."""
        params = dict(self.params)
        for key, value in changes.items():
            if value is None or value == "":
                params.pop(key, None)
            else:
                params[key] = str(value)
        return "?" + urlencode(params, doseq=True) if params else "?"

    def preset_links(self) -> list[dict]:
        """One link per preset, keeping the other filters (and dropping the absolute range and any
        page cursor: the rows change)."""
        return [{"preset": p, "url": self.url(range=p, cursor=None, **{"from": None, "to": None}),
                 "active": self.window.preset == p} for p in PRESETS]

    @property
    def from_value(self) -> str:
        """The absolute start as a ``datetime-local`` value (UTC), empty for a preset."""
        return self.window.start.strftime("%Y-%m-%dT%H:%M:%S") if self.is_absolute else ""

    @property
    def to_value(self) -> str:
        return self.window.end.strftime("%Y-%m-%dT%H:%M:%S") if self.is_absolute else ""


def _ns(value: datetime) -> int:
    delta = value.astimezone(timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _name(query, key: str, errors: list[str]) -> str:
    value = (query.get(key) or "").strip()
    if len(value) > MAX_NAME:
        errors.append(f"{key} is longer than {MAX_NAME} characters")
        return ""
    return value


def _field_error(message: str) -> tuple[str, str]:
    """("range", "must be one of …") of "range must be one of …"; "from/to must …" is from's."""
    name, _, rest = message.partition(" ")
    if "/" in name:  # "from/to must be …": both named, filed under the first
        first, _, others = name.partition("/")
        return first, f"(and {others.replace('/', ', ')}) {rest}"
    return name, rest


def filter_bar_from_query(query, *, default_range: str = "24h", now: datetime | None = None, fit=None) -> FilterBar:
    """The filter bar of a request's query string (a QueryDict or a mapping). Never raises: a bad
    value falls back to its default and adds a message to ``errors``. ``fit``: see
    ``timewindow.window_from_query`` (the default range fitted to the project's data)."""
    window = window_from_query(query, default=default_range, now=now, fit=fit)
    errors = [window.error] if window.error else []
    params: dict[str, str | list[str]] = {}
    for key in query.keys():  # a repeated parameter (the Variants view's ``value``) keeps every value
        found = [v for v in (query.getlist(key) if hasattr(query, "getlist") else [query.get(key)]) if v not in (None, "")]
        if found:
            params[key] = found[0] if len(found) == 1 else found
    if window.error:  # the URL should not keep the value that was refused
        for key in ("range", "from", "to"):
            params.pop(key, None)
    if not window.preset and "range" in params:  # an absolute range wins over a preset
        params.pop("range")
    service, model = _name(query, "service", errors), _name(query, "model", errors)
    for key, value in (("service", service), ("model", model)):
        if not value:
            params.pop(key, None)
    return FilterBar(window=window, service=service, model=model, params=params, errors=tuple(errors),
                     field_errors=tuple(_field_error(e) for e in errors))
