"""Node names are unique without regard to case:
at join (the agents' API), in the admin, and in the database."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from rest_framework.test import APIClient

from cluster.models import JoinToken, Node
from tests.cluster.helpers import inventory


def _join(name: str) -> Any:
    _, secret = JoinToken.issue("t")
    return APIClient().post(
        "/api/v1/agent/join",
        {"token": secret, "name": name, "inventory": inventory(hostname=name)},
        format="json",
    )


@pytest.mark.django_db
def test_a_second_node_differing_only_in_case_is_refused_at_join() -> None:
    assert _join("sim-1").status_code == 201
    r = _join("SIM-1")
    assert r.status_code == 409, r.json()
    assert "sim-1" in str(r.json()) and "without regard to case" in str(r.json())
    assert list(Node.objects.values_list("name", flat=True)) == ["sim-1"]


@pytest.mark.django_db
def test_the_database_refuses_two_names_differing_only_in_case() -> None:
    Node.objects.create(name="gpu-a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.create(name="GPU-A")


@pytest.mark.django_db
def test_the_admin_cannot_make_a_second_spelling(admin_user: Any, client_for: Any) -> None:
    # Nodes join; the admin neither adds one nor changes a name (the DB would refuse too).
    node = Node.objects.create(name="rack-node")
    client = client_for(admin_user)
    assert client.get("/admin/cluster/node/add/").status_code == 403
    r = client.post(f"/admin/cluster/node/{node.pk}/change/", {"name": "RACK-NODE"})
    assert r.status_code in (200, 302, 403)
    assert list(Node.objects.values_list("name", flat=True)) == ["rack-node"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_names_existing_duplicates_and_stops() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("cluster", "0007_replica_unplaced")])
    # The rows are made by the model as it was at 0007 (a later column, such as a node's
    # card use, is not in that schema yet).
    then = executor.loader.project_state(("cluster", "0007_replica_unplaced")).apps
    OldNode = then.get_model("cluster", "Node")  # noqa: N806
    try:
        OldNode.objects.create(name="dup-node")
        OldNode.objects.create(name="DUP-node")
        executor.loader.build_graph()
        with pytest.raises(RuntimeError, match="DUP-node, dup-node"):
            executor.migrate([("cluster", "0008_node_name_unique_any_case")])
        # At 0007's schema: the ORM's delete would look for rows of later columns (an
        # assignment's log, 0009) to cascade to, so the row goes by plain SQL.
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM cluster_node WHERE name = %s", ["DUP-node"])
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert list(Node.objects.values_list("name", flat=True)) == ["dup-node"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "reason"),
    [("../etc", '".."'), ("a b", "space"), ("rack\x1b1", "control character"),
     ("rack/1/drain", "/drain"), ("/rack", "starts or ends with /")],
)  # fmt: skip
def test_a_node_name_outside_the_name_grammar_is_refused_at_join(name: str, reason: str) -> None:
    r = _join(name)
    assert r.status_code == 400, r.content
    assert reason in r.json()["detail"], r.json()
    assert not Node.objects.exists()


@pytest.mark.django_db
def test_a_node_named_with_a_slash_joins() -> None:
    assert _join("rack/1").status_code == 201
    assert list(Node.objects.values_list("name", flat=True)) == ["rack/1"]
