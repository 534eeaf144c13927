"""The API token is llmgw_core's now (llmgw_core 0001): dropped from this app's state only;
the table, ``llmgw_admin_apitoken``, and its rows stay as they are."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("llmgw_admin", "0002_create_role_groups"),
        ("llmgw_core", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ApiToken")],
            database_operations=[],
        ),
    ]
