from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0002_changerecord_surface_gateway"),
    ]

    operations = [
        migrations.AlterField(
            model_name="changerecord",
            name="surface",
            field=models.CharField(
                choices=[
                    ("console", "console"),
                    ("api", "API"),
                    ("admin", "admin"),
                    ("file", "file import"),
                    ("cli", "command line"),
                    ("gateway", "gateway"),
                    ("updates", "updates"),
                ],
                max_length=20,
            ),
        ),
    ]
