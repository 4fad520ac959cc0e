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
