"""The API token moves from llmgw_admin (now the wiring) to llmgw_core (the framework).

State only: the table stays ``llmgw_admin_apitoken``, its rows, indexes and constraint as
they are (``llmgw_admin`` 0003 drops the model from that app's state).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("llmgw_admin", "0002_create_role_groups"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApiToken",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(max_length=100, verbose_name="name")),
                        ("prefix", models.CharField(db_index=True, editable=False, max_length=12)),
                        ("digest", models.CharField(editable=False, max_length=64, unique=True)),
                        ("created", models.DateTimeField(auto_now_add=True)),
                        ("expires", models.DateTimeField(blank=True, null=True)),
                        ("revoked", models.DateTimeField(blank=True, null=True)),
                        ("last_used", models.DateTimeField(blank=True, editable=False, null=True)),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_tokens", to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        "verbose_name": "API token",
                        "ordering": ("-created",),
                        "db_table": "llmgw_admin_apitoken",
                        "constraints": [models.UniqueConstraint(condition=models.Q(("revoked__isnull", True)), fields=("user", "name"), name="llmgw_admin_apitoken_unique_live_name", violation_error_message="this user already has a live token of that name")],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
