from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

RETENTION_DAYS_MIN = 1
RETENTION_DAYS_MAX = 3650


def default_retention_days() -> int:
    """A new project keeps its data as long as the server's global retention (the TTL)."""
    return int(settings.TRACEDASH_RETENTION_DAYS)


class Project(models.Model):
    """Everything tracedash stores belongs to one project; reads are always scoped to one."""

    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")
    # Days this project's spans, traces, resource samples and rollups are kept. The ClickHouse TTL
    # (TRACEDASH_RETENTION_DAYS) stays the upper bound; a shorter value is enforced by the daily
    # retention task (analytics.retention_services).
    retention_days = models.PositiveIntegerField(
        default=default_retention_days,
        validators=[MinValueValidator(RETENTION_DAYS_MIN), MaxValueValidator(RETENTION_DAYS_MAX)],
        help_text="Days this project's traces, spans, resource samples and rollups are kept "
                  f"({RETENTION_DAYS_MIN}-{RETENTION_DAYS_MAX}); the server's global retention is the upper bound.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="unique_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ApiKey(models.Model):
    """An ingest key. The secret is shown once; only its SHA-256 is kept.

    Format: ``td_<prefix>_<secret>``. The prefix (public, unique) finds the row without a scan;
    the hash of the whole key is compared in constant time.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, default="default")
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # When an ingest request last used the key, to the minute: written at most once a minute per
    # key (projects.services.api_key_record_use), never once per request.
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def public_key(self) -> str:
        """``td_<prefix>``: names the key without its secret; the public key of a Basic key pair
        (the Langfuse SDK's ``LANGFUSE_PUBLIC_KEY``, ``ingest.auth``)."""
        return f"td_{self.prefix}"

    def __str__(self) -> str:
        return f"td_{self.prefix}_… ({self.project}, {self.name})"


class KeyRevision(models.Model):
    """One row whose ``version`` goes up whenever an ingest key is revoked, changed or deleted.

    Every process keeps the keys it has checked in memory (``projects.keycache``) and compares this
    number, at most every ``TRACEDASH_KEY_CACHE_MS``, with the one it last saw: a change drops the
    whole cache, so a revocation made by any process (settings page, admin, another web worker)
    is honoured by all of them."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    version = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"ingest keys, revision {self.version}"
