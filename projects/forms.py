"""Project settings forms."""

from __future__ import annotations

from django import forms

from .models import RETENTION_DAYS_MAX, RETENTION_DAYS_MIN


class RetentionForm(forms.Form):
    retention_days = forms.IntegerField(
        label="Retention (days)", min_value=RETENTION_DAYS_MIN, max_value=RETENTION_DAYS_MAX,
        help_text=f"Whole days, {RETENTION_DAYS_MIN} to {RETENTION_DAYS_MAX}.",
    )
