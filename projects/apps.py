from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    name = "projects"
    verbose_name = "Projects, members and ingest keys"

    def ready(self) -> None:
        from . import keycache  # noqa: F401 - connects the signals that make every process forget changed keys
