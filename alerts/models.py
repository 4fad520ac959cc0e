"""Alert rules, the state of each alert series, notification channels, grouping, silences and the
history of every transition and delivery attempt (docs/alerts.md explains the semantics)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from projects.models import Project


class Metric(models.TextChoices):
    GPU_MEMORY_PERCENT = "gpu_memory_percent", "GPU memory % (used / total)"
    GPU_UTILIZATION = "gpu_utilization", "GPU utilisation %"
    GPU_TEMPERATURE = "gpu_temperature", "GPU temperature (°C)"
    HOST_CPU_PERCENT = "host_cpu_percent", "Host CPU %"
    HOST_MEMORY_PERCENT = "host_memory_percent", "Host memory %"
    PROCESS_LEAK_RATIO = "process_leak_ratio", "Process GPU memory / its baseline"
    E2E_P50 = "e2e_p50_ms", "P50 end-to-end latency (ms)"
    E2E_P95 = "e2e_p95_ms", "P95 end-to-end latency (ms)"
    E2E_P99 = "e2e_p99_ms", "P99 end-to-end latency (ms)"
    TTFT_P95 = "ttft_p95_ms", "P95 time to first token (ms)"
    PHASE_SHARE = "phase_share_percent", "Phase share of latency %"
    NETWORK_P95 = "network_p95_ms", "P95 network time (ms)"
    ERROR_RATE = "error_rate_percent", "Error rate %"
    REQUEST_RATE = "request_rate", "Request rate (requests/s)"
    ENGINE_KV_CACHE_PERCENT = "engine_kv_cache_percent", "Engine KV-cache usage %"
    ENGINE_REQUESTS_WAITING = "engine_requests_waiting", "Engine waiting requests"
    ENGINE_TTFT_P95 = "engine_ttft_p95_ms", "Engine-side P95 time to first token (ms)"


RESOURCE_METRICS = {Metric.GPU_MEMORY_PERCENT, Metric.GPU_UTILIZATION, Metric.GPU_TEMPERATURE,
                    Metric.HOST_CPU_PERCENT, Metric.HOST_MEMORY_PERCENT}
GPU_METRICS = {Metric.GPU_MEMORY_PERCENT, Metric.GPU_UTILIZATION, Metric.GPU_TEMPERATURE}
HOST_METRICS = {Metric.HOST_CPU_PERCENT, Metric.HOST_MEMORY_PERCENT}
PROCESS_METRICS = {Metric.PROCESS_LEAK_RATIO}
LATENCY_METRICS = {Metric.E2E_P50, Metric.E2E_P95, Metric.E2E_P99, Metric.TTFT_P95, Metric.PHASE_SHARE,
                   Metric.NETWORK_P95, Metric.ERROR_RATE, Metric.REQUEST_RATE}
# Inference engines' own metrics (engine_samples): gauges take an aggregation like the resources;
# the TTFT percentile is over the window's requests (from the histogram's bucket increases).
ENGINE_GAUGE_METRICS = {Metric.ENGINE_KV_CACHE_PERCENT, Metric.ENGINE_REQUESTS_WAITING}
ENGINE_WINDOW_METRICS = {Metric.ENGINE_TTFT_P95}
ENGINE_METRICS = ENGINE_GAUGE_METRICS | ENGINE_WINDOW_METRICS
# Metrics that are already an aggregate over the window: their rules use Aggregation.WINDOW.
WINDOW_METRICS = LATENCY_METRICS | ENGINE_WINDOW_METRICS


class Aggregation(models.TextChoices):
    """How a resource metric's samples in the window become one value. Latency metrics are
    already an aggregate over the window (a percentile, a share, a rate): they use WINDOW."""

    LAST = "last", "latest sample"
    AVG = "avg", "average"
    MAX = "max", "maximum"
    MIN = "min", "minimum"
    WINDOW = "window", "the metric's own (percentile, share or rate over the window)"


class Comparator(models.TextChoices):
    GT = "gt", ">"
    GTE = "gte", "≥"
    LT = "lt", "<"
    LTE = "lte", "≤"


class Severity(models.TextChoices):
    CRITICAL = "critical", "critical"
    WARNING = "warning", "warning"
    INFO = "info", "info"


class MissingData(models.TextChoices):
    KEEP_LAST = "keep_last", "keep the last state"
    ALERT = "alert", "treat as breaching (alert)"
    RESOLVE = "resolve", "treat as fine (resolve)"


class Phase(models.TextChoices):
    NETWORK = "network", "network"
    PREPROCESS = "preprocess", "pre-processing"
    INFERENCE = "inference", "inference"
    POSTPROCESS = "postprocess", "post-processing"
    OTHER = "other", "other"


class NotificationChannel(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Webhook (JSON, HMAC-signed)"
        SLACK = "slack", "Slack-compatible webhook"
        EMAIL = "email", "Email"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_channels")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(max_length=2000, blank=True, help_text="webhook and Slack channels")
    secret = models.CharField(max_length=200, blank=True, help_text="HMAC-SHA256 key of the webhook signature header")
    emails = models.TextField(blank=True, help_text="email channels: addresses, comma-separated")
    # Alertmanager's grouping timers, per channel (a group is one rule on one channel).
    group_wait_seconds = models.PositiveIntegerField(default=0, help_text="wait before the first notification of a new group")
    group_interval_seconds = models.PositiveIntegerField(default=60, help_text="least time between two notifications of a group")
    repeat_interval_seconds = models.PositiveIntegerField(default=4 * 3600, help_text="resend a still-firing, unchanged group after this")
    send_resolved = models.BooleanField(default=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_channel_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def email_list(self) -> list[str]:
        return [e.strip() for e in self.emails.split(",") if e.strip()]


class AlertRule(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_rules")
    name = models.CharField(max_length=200)
    metric = models.CharField(max_length=32, choices=Metric.choices)
    aggregation = models.CharField(max_length=8, choices=Aggregation.choices, default=Aggregation.LAST)
    phase = models.CharField(max_length=16, choices=Phase.choices, blank=True, help_text="phase share rules only")
    window_seconds = models.PositiveIntegerField(default=60)
    comparator = models.CharField(max_length=4, choices=Comparator.choices, default=Comparator.GTE)
    threshold = models.FloatField()
    # Scope: blank means "any"; one alert series per matching host/GPU (resources), host/GPU/process
    # (leak ratio) or service (latency).
    host = models.CharField(max_length=256, blank=True)
    gpu_index = models.IntegerField(null=True, blank=True)
    service = models.CharField(max_length=256, blank=True)
    model = models.CharField(max_length=256, blank=True)
    # Latency rules: one series per value of this span/resource attribute (user.tier) instead of per
    # service; group_value keeps one value (blank: every value). See alerts.latency.
    group_by = models.CharField(max_length=256, blank=True)
    group_value = models.CharField(max_length=256, blank=True)
    for_seconds = models.PositiveIntegerField(default=0)
    keep_firing_for_seconds = models.PositiveIntegerField(default=0)
    missing_data = models.CharField(max_length=16, choices=MissingData.choices, default=MissingData.KEEP_LAST)
    missing_grace_seconds = models.PositiveIntegerField(default=300, help_text="a series without data this long resolves")
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    channels = models.ManyToManyField(NotificationChannel, blank=True, related_name="rules")
    runbook = models.TextField(blank=True)
    explanation = models.TextField(blank=True, help_text="why this rule matters")
    enabled = models.BooleanField(default=True)
    is_default = models.BooleanField(default=False)
    # Evaluation health: visible on the page, never swallowed.
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_rule_name")]

    def __str__(self) -> str:
        return self.name

    @property
    def condition(self) -> str:
        metric = Metric(self.metric).label
        if self.metric == Metric.PHASE_SHARE:
            metric = f"{self.phase or 'inference'} share of latency %"
        agg = "" if self.aggregation in (Aggregation.LAST, Aggregation.WINDOW) else f"{self.aggregation} "
        if self.group_by:
            metric = f"{metric} of {self.group_by}={self.group_value or 'each value'}"
        return f"{agg}{metric} {Comparator(self.comparator).label} {self.threshold:g}"


class SeriesState(models.TextChoices):
    INACTIVE = "inactive", "inactive"
    PENDING = "pending", "pending"
    FIRING = "firing", "firing"
    RESOLVED = "resolved", "resolved"


class AlertSeries(models.Model):
    """One alert series: a rule applied to one host/GPU/process/service."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="series")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_series")
    key = models.CharField(max_length=512)
    labels = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=SeriesState.choices, default=SeriesState.INACTIVE)
    no_data = models.BooleanField(default=False)
    value = models.FloatField(null=True, blank=True)
    active_since = models.DateTimeField(null=True, blank=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    last_breach_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    missing_since = models.DateTimeField(null=True, blank=True)
    # the newest breaching sample seen: the `for` coverage and its gap check (state_machine)
    last_sample_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule", "key"], name="unique_series_key")]
        indexes = [models.Index(fields=["project", "state"])]

    def __str__(self) -> str:
        return f"{self.rule} {self.key}: {self.state}"


class AlertEvent(models.Model):
    """Every state transition of every series (the history)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_events")
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="events")
    series_key = models.CharField(max_length=512)
    labels = models.JSONField(default=dict)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    value = models.FloatField(null=True, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["project", "-at"])]


class Silence(models.Model):
    """Matchers over an alert's labels (all must match) and a time range."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_silences")
    matchers = models.JSONField(default=list, help_text='[{"label": "host", "op": "=", "value": "gpu-1"}]; ops = != =~ !~')
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    comment = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-starts_at"]


class NotificationGroup(models.Model):
    """Alertmanager's aggregation group: one rule's alerts on one channel."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="groups")
    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="groups")
    first_active_at = models.DateTimeField(null=True, blank=True)  # when the current group started
    last_sent_at = models.DateTimeField(null=True, blank=True)
    last_sent_keys = models.JSONField(default=list)  # firing series keys in the last notification
    version = models.PositiveIntegerField(default=0)  # bumped on each send: a stale writer updates nothing

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rule", "channel"], name="unique_group")]


class Notification(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        SENDING = "sending", "sending"
        SENT = "sent", "sent"
        FAILED = "failed", "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_notifications")
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="notifications")
    group = models.ForeignKey(NotificationGroup, on_delete=models.CASCADE, related_name="notifications")
    sequence = models.PositiveIntegerField()  # the group's version when it was made
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    group_status = models.CharField(max_length=16)  # firing | resolved (Alertmanager's top-level status)
    firing_count = models.PositiveIntegerField(default=0)
    resolved_count = models.PositiveIntegerField(default=0)
    payload = models.JSONField()
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [models.UniqueConstraint(fields=["group", "sequence"], name="unique_group_sequence")]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]


class DeliveryAttempt(models.Model):
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField()
    ok = models.BooleanField()
    status_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.FloatField()

    class Meta:
        ordering = ["at", "pk"]


class EvaluationLease(models.Model):
    """One row per lock name: whoever holds an unexpired lease runs the round; others skip it."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=128, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    rounds = models.PositiveBigIntegerField(default=0)
    last_round_at = models.DateTimeField(null=True, blank=True)
    last_round_ms = models.FloatField(null=True, blank=True)
    last_error = models.TextField(blank=True)
