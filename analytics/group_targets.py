"""Targets per group value (services and selectors): ``user.tier`` = ``premium`` has an E2E P95
target of 800 ms. Shown as dashed lines on the grouped latency chart (dashboard.panels)."""

from __future__ import annotations

import math

from django.core.exceptions import ValidationError

from .grouping import MAX_KEY
from .models import GroupTarget

MAX_TARGET_MS = 3_600_000.0  # an hour; anything above is a typo


def group_targets_list(*, project_id: int, attribute_key: str | None = None) -> list[GroupTarget]:
    qs = GroupTarget.objects.filter(project_id=project_id)
    if attribute_key is not None:
        qs = qs.filter(attribute_key=attribute_key)
    return list(qs.order_by("attribute_key", "value", "metric"))


def group_target_set(*, project_id: int, attribute_key: str, value: str, target, metric: str = "e2e_p95_ms") -> GroupTarget:
    """Create or replace the target of (attribute_key, value, metric). Raises ValidationError naming
    the field at fault; nothing is written then."""
    attribute_key, value = (attribute_key or "").strip(), (value or "").strip()
    errors: dict[str, str] = {}
    if not attribute_key:
        errors["attribute_key"] = "required"
    elif len(attribute_key) > MAX_KEY:
        errors["attribute_key"] = f"at most {MAX_KEY} characters"
    if not value:
        errors["value"] = "required"
    elif len(value) > MAX_KEY:
        errors["value"] = f"at most {MAX_KEY} characters"
    if metric not in GroupTarget.Metric.values:
        errors["metric"] = f"must be one of {', '.join(GroupTarget.Metric.values)}"
    try:
        number = float(str(target).strip())
    except (TypeError, ValueError):
        errors["target"] = f"{str(target)[:40]!r} is not a number"
    else:
        if not math.isfinite(number) or not 0 < number <= MAX_TARGET_MS:
            errors["target"] = f"must be a number of ms above 0 and at most {MAX_TARGET_MS:g}"
    if errors:
        raise ValidationError(errors)
    row, _ = GroupTarget.objects.update_or_create(project_id=project_id, attribute_key=attribute_key, value=value,
                                                  metric=metric, defaults={"target": number})
    return row


def group_target_delete(*, project_id: int, attribute_key: str, value: str, metric: str = "e2e_p95_ms") -> bool:
    deleted, _ = GroupTarget.objects.filter(project_id=project_id, attribute_key=attribute_key, value=value,
                                            metric=metric).delete()
    return deleted > 0
