from django.contrib import admin

from .models import ModelPrice


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = ("project", "model", "input_usd_per_million", "output_usd_per_million", "updated_at")
    list_filter = ("project",)
    search_fields = ("model",)
