from django.contrib import admin

from .models import LoadTestRun


@admin.register(LoadTestRun)
class LoadTestRunAdmin(admin.ModelAdmin):
    list_display = ("run_id", "project", "test_type", "status", "target_url", "created_at", "finished_at")
    list_filter = ("project", "test_type", "status")
    search_fields = ("run_id", "target_url")
    readonly_fields = ("run_id", "project", "test_type", "target_url", "config", "report", "progress", "heartbeat_at",
                       "created_at", "finished_at")
