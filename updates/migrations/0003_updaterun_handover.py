from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("updates", "0002_updaterun"),
    ]

    operations = [
        migrations.AddField(
            model_name="updaterun",
            name="handover",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="updaterun",
            name="handover_ended",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
