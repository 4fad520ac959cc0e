"""The price table, taken over from the dashboard app (its table ``dashboard_modelprice`` is kept:
this migration changes the state only)."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("projects", "0001_initial"),
        ("dashboard", "0002_move_modelprice_to_analytics"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='ModelPrice',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('model', models.CharField(max_length=256)),
                    ('input_usd_per_million', models.DecimalField(decimal_places=6, max_digits=12, validators=[django.core.validators.MinValueValidator(0)])),
                    ('output_usd_per_million', models.DecimalField(decimal_places=6, max_digits=12, validators=[django.core.validators.MinValueValidator(0)])),
                    ('updated_at', models.DateTimeField(auto_now=True)),
                    ('project', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='model_prices', to='projects.project')),
                ],
                options={
                    'db_table': 'dashboard_modelprice',
                    'ordering': ['project', 'model'],
                    'constraints': [models.UniqueConstraint(fields=('project', 'model'), name='unique_model_price')],
                },
            ),
        ]),
    ]
