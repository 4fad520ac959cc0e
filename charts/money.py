"""Money as every page, JSON redraw and chart hover writes it."""

from __future__ import annotations

import math

# --- money -----------------------------------------------------------------------------------------
# One money format everywhere (pages, JSON-driven redraws through static/tracedash/format.js, chart
# hovers): "$" first, thousands separators, two decimals from $1 up ($1,234.56) and two significant
# digits below it (trailing zeros after the second decimal dropped), so a tiny per-request cost keeps
# its figures ($0.0042, $0.00042, $0.005) instead of rounding to $0.00. Negative amounts read "-$1.50";
# None (no cost known) is "–".
MONEY_MAX_DECIMALS = 8


def money_text(value) -> str:
    if value is None or value == "":
        return "–"
    try:
        amount = float(value)
    except (TypeError, ValueError):
        return "–"
    if amount != amount or amount in (float("inf"), float("-inf")):
        return "–"
    sign, amount = ("-" if amount < 0 else ""), abs(amount)
    decimals = 2
    if 0 < amount < 1:
        decimals = min(MONEY_MAX_DECIMALS, max(2, 1 - math.floor(math.log10(amount))))
    text = f"{amount:,.{decimals}f}"
    if decimals > 2:  # $0.0050 reads $0.005; never fewer than two decimals
        text = text.rstrip("0").ljust(text.index(".") + 3, "0")
    if float(text.replace(",", "")) == 0:
        sign = ""  # -0.000000001 rounds to $0.00, not "-$0.00"
    return f"{sign}${text}"


def money_signed_text(value) -> str:
    """A difference of money: ``money_text`` with a sign always shown on a non-zero amount
    (``+$0.0012``, ``-$0.0012``); what rounds to zero reads ``$0.00``, unknown ``–``."""
    text = money_text(value)
    if text.startswith("$") and float(text[1:].replace(",", "")) != 0:
        return "+" + text
    return text
