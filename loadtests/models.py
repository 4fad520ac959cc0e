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

    No secret is stored: like every key, the ApiKey row keeps only the SHA-256 of the key. The
    server itself sends the traces of the runs it starts, so it must present the key again; its
    secret part is derived, not kept: HMAC-SHA256 of the server's SECRET_KEY over a label and
    ``nonce`` (random per key), see ``loadtests.services.load_test_key_ensure``. Without
    SECRET_KEY the row is useless. A revoked key, or one that no longer matches its hash (SECRET_KEY
    changed), is replaced by a fresh one at the next run."""

    project = models.OneToOneField("projects.Project", on_delete=models.CASCADE, related_name="load_test_key")
    api_key = models.OneToOneField("projects.ApiKey", on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"load test key of {self.project_id}"
