from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0005_node_address"),
    ]

    operations = [
        migrations.CreateModel(
            name="ControlMark",
            fields=[
                ("kind", models.CharField(max_length=20, primary_key=True, serialize=False)),
                ("at", models.DateTimeField()),
                ("by", models.CharField(blank=True, max_length=200)),
            ],
        ),
    ]
