"""The default rules "Host CPU > 70 % for 5 min" and "P95 end-to-end > 1500 ms" fired on their first
sample (``for`` 0). Installed copies nobody has edited get the new definition: the CPU average over
1 minute, held for 5 minutes; the P95 held for 5 minutes. "Inference share > 60 %" fires on most
healthy LLM apps: an unedited copy is switched off. An edited copy is left as its
owner made it."""

from django.db import migrations

OLD_NEW = (
    ("Host CPU > 70 % for 5 min",
     dict(metric="host_cpu_percent", aggregation="avg", comparator="gt", threshold=70, window_seconds=300, for_seconds=0),
     dict(window_seconds=60, for_seconds=300)),
    ("P95 end-to-end > 1500 ms",
     dict(metric="e2e_p95_ms", comparator="gt", threshold=1500, window_seconds=300, for_seconds=0),
     dict(for_seconds=300)),
    ("Inference share > 60 %",
     dict(metric="phase_share_percent", phase="inference", comparator="gt", threshold=60, window_seconds=300,
          for_seconds=300),
     dict(enabled=False)),
)


def forwards(apps, schema_editor):
    AlertRule = apps.get_model("alerts", "AlertRule")
    for name, old, new in OLD_NEW:
        AlertRule.objects.filter(is_default=True, name=name, **old).update(**new)


class Migration(migrations.Migration):
    dependencies = [("alerts", "0002_series_last_sample_at")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
