from django.db import models


class LoadTestRun(models.Model):
    """One load test (``manage.py loadtest``): what was asked for and the report it produced.

    ``run_id`` is the id every traced request carries as ``loadtest.run_id``; ``report`` is the
    generator's report JSON (docs/loadtest.md), kept whole so the page and the JSON download show
    exactly what the command printed."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        INTERRUPTED = "interrupted", "Interrupted"

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="load_test_runs")
    run_id = models.CharField(max_length=64, unique=True)
    test_type = models.CharField(max_length=16)
    target_url = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    config = models.JSONField(default=dict)
    report = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Runs started from the page (loadtests.runner): the live counters, written about once a
    # second while it runs, and when they were last written. A running run whose heartbeat stopped
    # (its server was stopped) no longer counts as running.
    progress = models.JSONField(default=dict, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["project", "-created_at"], name="loadtest_project_created")]

    def __str__(self) -> str:
        return f"{self.test_type} load test {self.run_id} ({self.status})"


class LoadTestKey(models.Model):
    """The project's one ingest key for load tests (an ordinary ``projects.ApiKey`` named "load
    tests", listed and revocable on Settings), created once and reused by every run.

    Unlike other keys its plaintext is kept here: the server itself sends the traces of the runs it
    starts, so it must be able to present the key again. It can only add traces to its own project;
    revoking it on Settings stops that at once, and the next run creates a fresh one."""

    project = models.OneToOneField("projects.Project", on_delete=models.CASCADE, related_name="load_test_key")
    api_key = models.OneToOneField("projects.ApiKey", on_delete=models.CASCADE, related_name="+")
    secret = models.CharField(max_length=200)

    def __str__(self) -> str:
        return f"load test key of {self.project_id}"
