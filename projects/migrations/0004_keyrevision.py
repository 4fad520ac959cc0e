from django.db import migrations, models


def create_row(apps, schema_editor):
    apps.get_model("projects", "KeyRevision").objects.get_or_create(pk=1, defaults={"version": 0})


class Migration(migrations.Migration):

    dependencies = [
        ("projects", "0003_apikey_last_used_at"),
    ]

    operations = [
        migrations.CreateModel(
            name="KeyRevision",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("version", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(create_row, migrations.RunPython.noop),
    ]
