"""Project settings forms."""

from __future__ import annotations

from django import forms

from analytics.attribute_index import MAX_KEY

from .models import RETENTION_DAYS_MAX, RETENTION_DAYS_MIN
from .services import NAME_MAX_LENGTH


class RetentionForm(forms.Form):
    retention_days = forms.IntegerField(
        label="Retention (days)", min_value=RETENTION_DAYS_MIN, max_value=RETENTION_DAYS_MAX,
        help_text=f"Whole days, {RETENTION_DAYS_MIN} to {RETENTION_DAYS_MAX}.",
    )


class _Form(forms.Form):
    """Several forms share one page (and field names such as ``name``): each gets its own ids."""

    id_prefix = "id"

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", f"{self.id_prefix}_%s")
        super().__init__(*args, **kwargs)


class ApiKeyCreateForm(_Form):
    id_prefix = "key"
    name = forms.CharField(label="Key name", max_length=NAME_MAX_LENGTH, initial="default",
                           help_text="What uses it, e.g. chat-api or ci; shown in the list, not secret.")


class MemberAddForm(_Form):
    id_prefix = "member"
    username = forms.CharField(label="Username", max_length=150,
                               help_text="An existing account; it becomes a member of this project.")


class ProjectCreateForm(_Form):
    id_prefix = "project"
    name = forms.CharField(label="Project name", max_length=NAME_MAX_LENGTH,
                           help_text="You become its first member; it gets its own ingest key.")


class IndexKeyForm(_Form):
    id_prefix = "index"
    key = forms.CharField(label="Attribute key", max_length=MAX_KEY,  # stripped; required: never empty
                          help_text="A span or resource attribute that names a group, e.g. user.tier or llm.quantization.")
