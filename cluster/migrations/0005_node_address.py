from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0004_node_inventory_digest"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="address",
            field=models.CharField(blank=True, editable=False, max_length=100),
        ),
        migrations.AddField(
            model_name="node",
            name="allowed_address",
            field=models.CharField(
                blank=True,
                help_text=(
                    "The address an operator allowed for this node's engines, used instead of "
                    "the address its requests come from; empty: that address."
                ),
                max_length=200,
            ),
        ),
    ]
