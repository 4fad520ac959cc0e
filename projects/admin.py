"""Admin for projects, members and ingest keys.

Keys are created only through ``projects.services.api_key_create`` (the same service as the
settings page): the add form asks for a project and a name, and the answer shows the new key once,
with the same snippets as the settings page. The key hash is never shown; an existing key's
project, prefix and dates cannot be edited (setting "revoked at" revokes it). Keys cannot be added
inline on a project: that form would make rows without a prefix or hash."""

from django.contrib import admin
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from .models import ApiKey, Membership, Project
from .services import api_key_create


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("name", "prefix", "created_at", "last_used_at")
    can_delete = False
    verbose_name_plural = "Ingest keys (create one with “Add api key” in the key list, or on the project's Settings page)"

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "retention_days", "created_at")
    search_fields = ("name",)
    inlines = [MembershipInline, ApiKeyInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("project", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("project",)
    search_fields = ("name", "prefix", "project__name")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("project", "name")
        return ("project", "name", "prefix", "created_at", "last_used_at", "revoked_at", "settings_link")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        fields = ("project", "prefix", "created_at", "last_used_at", "settings_link")
        return fields + ("revoked_at",) if obj.revoked_at is not None else fields  # a revoked key stays revoked

    @admin.display(description="Settings page")
    def settings_link(self, obj):
        return format_html('<a href="{}?project={}">Keys of {} on Settings</a>', reverse("dashboard:settings"),
                           obj.project_id, obj.project)

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw = api_key_create(project=form.cleaned_data["project"], name=form.cleaned_data["name"])
        for field in ("pk", "prefix", "key_hash", "created_at", "name"):
            setattr(obj, field, getattr(key, field))
        obj._state.adding = False
        obj._state.db = key._state.db
        request._tracedash_new_key = raw

    def response_add(self, request, obj, post_url_continue=None):
        raw = getattr(request, "_tracedash_new_key", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        from .views import key_snippets

        base_url = request.build_absolute_uri("/").rstrip("/")
        context = {**self.admin_site.each_context(request), "title": "Ingest key created", "opts": self.opts,
                   "key": obj, "raw": raw, "snippets": key_snippets(base_url=base_url, raw_key=raw),
                   "settings_url": f"{reverse('dashboard:settings')}?project={obj.project_id}",
                   "list_url": reverse("admin:projects_apikey_changelist")}
        response = TemplateResponse(request, "projects/admin_key_created.html", context)
        response["Cache-Control"] = "no-store"
        return response
