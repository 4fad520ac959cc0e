from django.contrib import admin

from .models import AlertEvent, AlertRule, AlertSeries, DeliveryAttempt, Notification, NotificationChannel, Silence


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "metric", "comparator", "threshold", "window_seconds", "for_seconds",
                    "severity", "enabled", "last_evaluated_at", "last_error")
    list_filter = ("project", "metric", "severity", "enabled")
    search_fields = ("name",)
    filter_horizontal = ("channels",)
    readonly_fields = ("last_evaluated_at", "last_error", "last_error_at", "created_at", "updated_at")


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "kind", "enabled", "group_wait_seconds", "group_interval_seconds",
                    "repeat_interval_seconds")
    list_filter = ("project", "kind")


@admin.register(AlertSeries)
class AlertSeriesAdmin(admin.ModelAdmin):
    list_display = ("rule", "key", "state", "no_data", "value", "fired_at", "resolved_at", "acknowledged_at")
    list_filter = ("state", "no_data", "project")
    readonly_fields = [f.name for f in AlertSeries._meta.fields]


@admin.register(AlertEvent)
class AlertEventAdmin(admin.ModelAdmin):
    list_display = ("at", "rule", "series_key", "from_state", "to_state", "value", "reason")
    list_filter = ("project", "to_state")
    readonly_fields = [f.name for f in AlertEvent._meta.fields]


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    list_display = ("project", "starts_at", "ends_at", "comment", "created_by")


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("at", "ok", "status_code", "error", "duration_ms")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("created_at", "rule", "channel", "group_status", "status", "attempts", "sent_at", "last_error")
    list_filter = ("status", "project")
    readonly_fields = [f.name for f in Notification._meta.fields]
    inlines = [DeliveryAttemptInline]
