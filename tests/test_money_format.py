"""One money format on every page: the template filter ``money`` (server-rendered pages) and
``tracedashFormat.money`` of static/tracedash/format.js (the live pages' JSON-driven redraws)
give the same text for one table of cases."""

from __future__ import annotations

import json
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from django.template import Context, Template

from charts.money import money_signed_text, money_text

FORMAT_JS = Path(__file__).resolve().parent.parent / "static" / "tracedash" / "format.js"

CASES = [
    (0.0042, "$0.0042"),        # a tiny per-request cost keeps its figures
    (0.00042, "$0.00042"),
    (0.000123456, "$0.00012"),  # two significant digits below $1
    (0.005, "$0.005"),          # no trailing zero after the second decimal
    (0.01, "$0.01"),
    (0.1, "$0.10"),
    (0.42, "$0.42"),
    (0.999, "$1.00"),
    (1, "$1.00"),
    (12.3, "$12.30"),
    (1234.56, "$1,234.56"),     # totals: thousands separators, cents
    (1234567.891, "$1,234,567.89"),
    (0, "$0.00"),
    (-1.5, "-$1.50"),
    (-0.0042, "-$0.0042"),
    (1e-12, "$0.00"),           # below the last shown decimal
    (None, "–"),
]

# A difference (the trace comparison's B − A): the same text with a sign on any non-zero amount.
SIGNED_CASES = [
    (0.0012, "+$0.0012"),
    (-0.0012, "-$0.0012"),
    (1234.56, "+$1,234.56"),
    (-1234.56, "-$1,234.56"),
    (0, "$0.00"),
    (1e-12, "$0.00"),           # rounds to zero: no sign
    (-1e-12, "$0.00"),
    (None, "–"),
]


@pytest.mark.parametrize("value, text", CASES)
def test_money_filter(value, text):
    assert money_text(value) == text
    assert Template("{% load panel_tags %}{{ v|money }}").render(Context({"v": value})) == text


@pytest.mark.parametrize("value, text", SIGNED_CASES)
def test_money_signed_filter(value, text):
    assert money_signed_text(value) == text
    assert Template("{% load panel_tags %}{{ v|money_signed }}").render(Context({"v": value})) == text


def test_money_filter_takes_decimals_and_strings_and_refuses_junk():
    assert money_text(Decimal("2.5")) == "$2.50"
    assert money_text("0.0042") == "$0.0042"
    assert money_text("n/a") == "–" and money_text(float("nan")) == "–" and money_text(float("inf")) == "–"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run static/tracedash/format.js")
def test_js_formatter_gives_the_same_text():
    values = [value for value, _ in CASES]
    signed = [value for value, _ in SIGNED_CASES]
    script = FORMAT_JS.read_text() + (
        "\nconst f = globalThis.tracedashFormat;"
        f"\nprocess.stdout.write(JSON.stringify([{json.dumps(values)}.map(f.money), {json.dumps(signed)}.map(f.moneySigned)]));")
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout
    plain, with_sign = json.loads(out)
    assert plain == [text for _, text in CASES]
    assert with_sign == [text for _, text in SIGNED_CASES]
