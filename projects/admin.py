from django.contrib import admin

from .models import ApiKey, Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("name", "prefix", "created_at", "revoked_at")
    readonly_fields = ("prefix", "created_at")
    can_delete = False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "retention_days", "created_at")
    search_fields = ("name",)
    inlines = [MembershipInline, ApiKeyInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("project", "name", "prefix", "created_at", "revoked_at")
    list_filter = ("project",)
    readonly_fields = ("project", "prefix", "key_hash", "created_at")
    exclude = ()
