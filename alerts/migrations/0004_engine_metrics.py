"""The inference engines' alert metrics, and their default rules installed in every project made
before them (a project made later gets them from alerts.services.DEFAULT_RULES). A project that
already has a rule of that name keeps its own. The rules are frozen here as they were defined."""

from django.db import migrations, models

RULES = (
    dict(name="Engine KV cache > 90 % for 1 min", metric="engine_kv_cache_percent", aggregation="last",
         window_seconds=60, comparator="gt", threshold=90, for_seconds=60, keep_firing_for_seconds=60,
         severity="warning",
         explanation="An engine's KV cache above 90 % for a whole minute: new requests wait for room and running "
                     "ones are preempted (recomputed later), so time to first token climbs with load.",
         runbook="See the Engines page: waiting requests and preemptions rising with it confirm it. Add a replica, "
                 "lower max-num-seqs / max model length, or give the engine more GPU memory "
                 "(gpu-memory-utilization), a quantised KV cache or a smaller model."),
    dict(name="Engine waiting requests > 10 for 1 min", metric="engine_requests_waiting", aggregation="last",
         window_seconds=60, comparator="gt", threshold=10, for_seconds=60, keep_firing_for_seconds=60,
         severity="warning",
         explanation="More than 10 requests queued in an engine for a whole minute: it takes requests faster "
                     "than it finishes them, and every queued request's TTFT includes the wait.",
         runbook="Compare engine-side and app-side TTFT on the Engines page; scale out or shed load (priority tiers)."),
    dict(name="Engine TTFT P95 > 1000 ms", metric="engine_ttft_p95_ms", aggregation="window", window_seconds=300,
         comparator="gt", threshold=1000, for_seconds=300, keep_firing_for_seconds=60, severity="warning",
         explanation="The engine's own time to first token (arrival to first token, its queue included) above its "
                     "target of 1 s at P95 for 5 minutes: users wait before anything appears. Set the threshold to "
                     "your engine's TTFT target."),
)


def forwards(apps, schema_editor):
    AlertRule = apps.get_model("alerts", "AlertRule")
    Project = apps.get_model("projects", "Project")
    for project in Project.objects.all():
        for rule in RULES:
            AlertRule.objects.get_or_create(project=project, name=rule["name"], defaults={**rule, "is_default": True})


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0003_default_rules_sustained'),
    ]

    operations = [
        migrations.AlterField(
            model_name='alertrule',
            name='metric',
            field=models.CharField(choices=[('gpu_memory_percent', 'GPU memory % (used / total)'), ('gpu_utilization', 'GPU utilisation %'), ('gpu_temperature', 'GPU temperature (°C)'), ('host_cpu_percent', 'Host CPU %'), ('host_memory_percent', 'Host memory %'), ('process_leak_ratio', 'Process GPU memory / its baseline'), ('e2e_p50_ms', 'P50 end-to-end latency (ms)'), ('e2e_p95_ms', 'P95 end-to-end latency (ms)'), ('e2e_p99_ms', 'P99 end-to-end latency (ms)'), ('ttft_p95_ms', 'P95 time to first token (ms)'), ('phase_share_percent', 'Phase share of latency %'), ('network_p95_ms', 'P95 network time (ms)'), ('error_rate_percent', 'Error rate %'), ('request_rate', 'Request rate (requests/s)'), ('engine_kv_cache_percent', 'Engine KV-cache usage %'), ('engine_requests_waiting', 'Engine waiting requests'), ('engine_ttft_p95_ms', 'Engine-side P95 time to first token (ms)')], max_length=32),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
