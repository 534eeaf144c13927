from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0013_quota_tpm"),
    ]

    operations = [
        migrations.AddField(
            model_name="replica",
            name="drain_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
