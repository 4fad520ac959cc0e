from django.core.validators import MinValueValidator
from django.db import models


class ModelPrice(models.Model):
    """What one model costs a project, in USD per million input and output tokens. Fills in the
    cost of spans that carry tokens but no ``cost_usd`` (marked as estimated, DOMAIN.md)."""

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="model_prices")
    model = models.CharField(max_length=256)  # as spans name it (the ``model`` field)
    input_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6, validators=[MinValueValidator(0)])
    output_usd_per_million = models.DecimalField(max_digits=12, decimal_places=6, validators=[MinValueValidator(0)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "dashboard_modelprice"  # created by the dashboard app before analytics had its own
        ordering = ["project", "model"]
        constraints = [models.UniqueConstraint(fields=["project", "model"], name="unique_model_price")]

    def __str__(self) -> str:
        return f"{self.model} in {self.project}: ${self.input_usd_per_million}/M in, ${self.output_usd_per_million}/M out"


class GroupTarget(models.Model):
    """A target for one value of an attribute (``user.tier`` = ``premium``: E2E P95 ≤ 800 ms), drawn
    as a dashed line in that value's colour on the grouped latency chart (analytics.grouping)."""

    class Metric(models.TextChoices):
        E2E_P95_MS = "e2e_p95_ms", "E2E P95 (ms)"

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="group_targets")
    attribute_key = models.CharField(max_length=256)
    value = models.CharField(max_length=256)
    metric = models.CharField(max_length=32, choices=Metric.choices, default=Metric.E2E_P95_MS)
    target = models.FloatField(validators=[MinValueValidator(0)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "attribute_key", "value", "metric"]
        constraints = [models.UniqueConstraint(fields=["project", "attribute_key", "value", "metric"],
                                               name="unique_group_target")]

    def __str__(self) -> str:
        return f"{self.attribute_key}={self.value} {self.metric} ≤ {self.target:g} in {self.project}"
