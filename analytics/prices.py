"""The per-project price table (services and selectors): USD per million input / output tokens
per model. The summariser estimates the cost of spans that carry tokens but no cost from it."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.db import transaction

from .models import ModelPrice

MAX_PRICE = Decimal("1000000")  # USD per million tokens; anything above is a typo


def prices_for_project(*, project_id: int) -> dict[str, tuple[float, float]]:
    """``{model: (input USD per million tokens, output USD per million tokens)}``, the shape
    ``analytics.trace_math.trace_summarize(prices=...)`` takes."""
    return {
        p.model: (float(p.input_usd_per_million), float(p.output_usd_per_million))
        for p in ModelPrice.objects.filter(project_id=project_id)
    }


def model_prices_list(*, project_id: int) -> list[ModelPrice]:
    return list(ModelPrice.objects.filter(project_id=project_id).order_by("model"))


def _price(value, field: str) -> Decimal:
    try:
        price = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError({field: f"{value!r} is not a number"}) from None
    if not price.is_finite() or price < 0:
        raise ValidationError({field: "must be a non-negative number"})
    if price > MAX_PRICE:
        raise ValidationError({field: f"must be at most {MAX_PRICE} USD per million tokens"})
    return price.quantize(Decimal("0.000001"))


def model_price_set(*, project_id: int, model: str, input_usd_per_million, output_usd_per_million) -> ModelPrice:
    """Create or replace the price of ``model`` in the project. Raises ValidationError naming
    the field at fault. New prices apply to traces summarised from now on (re-summarise a time
    range with ``manage.py summarize_traces`` to apply them to the past)."""
    model = (model or "").strip()
    if not model:
        raise ValidationError({"model": "required"})
    if len(model) > 256:
        raise ValidationError({"model": "at most 256 characters"})
    prices = {
        "input_usd_per_million": _price(input_usd_per_million, "input_usd_per_million"),
        "output_usd_per_million": _price(output_usd_per_million, "output_usd_per_million"),
    }
    with transaction.atomic():
        price, _ = ModelPrice.objects.update_or_create(project_id=project_id, model=model, defaults=prices)
    return price


def model_price_delete(*, project_id: int, model: str) -> bool:
    """Remove the project's price of ``model``; False if there was none."""
    deleted, _ = ModelPrice.objects.filter(project_id=project_id, model=model).delete()
    return deleted > 0
