"""Node names unique without regard to case (SIM-1 beside sim-1 both joined before).

Before the constraint, a check: two nodes whose names differ only in case stop the
migration with their names and what to do, rather than PostgreSQL's index error.
"""
from __future__ import annotations

import django.db.models.functions.text
from django.db import migrations, models


def refuse_duplicates(apps, schema_editor):
    Node = apps.get_model("cluster", "Node")
    seen: dict[str, list[str]] = {}
    for name in Node.objects.values_list("name", flat=True):
        seen.setdefault(name.lower(), []).append(name)
    clashes = [names for names in seen.values() if len(names) > 1]
    if clashes:
        listed = "; ".join(", ".join(sorted(names)) for names in clashes)
        raise RuntimeError(
            f"nodes whose names differ only in case: {listed}. Node names are now unique "
            "without regard to case: delete or rename all but one of each (manage.py cluster "
            "node release NAME, then join that machine under another name), and migrate again"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0007_replica_unplaced"),
    ]

    operations = [
        migrations.RunPython(refuse_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="node",
            constraint=models.UniqueConstraint(
                django.db.models.functions.text.Lower("name"),
                name="cluster_node_name_unique_any_case",
                violation_error_message=(
                    "a node of this name in another case exists already: node names are "
                    "unique without regard to case"
                ),
            ),
        ),
    ]
