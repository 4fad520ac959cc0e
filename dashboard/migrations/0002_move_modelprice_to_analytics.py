"""ModelPrice moved to the analytics app: removed from this app's state only (the table
``dashboard_modelprice`` stays; analytics 0001 takes it over)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("dashboard", "0001_initial")]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="ModelPrice")]),
    ]
