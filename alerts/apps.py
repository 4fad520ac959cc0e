from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self):
        from . import signals  # noqa: F401 - connects the default-rules receiver
