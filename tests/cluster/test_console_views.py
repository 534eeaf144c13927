"""The cluster's console pages and actions over HTTP (the live push is tests/llmgw_admin/test_live_ws.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import live
from cluster.models import ClusterAction, FacilityBudget, Node, Replica
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db


def test_home_is_the_live_dashboard(client_for: Any, viewer: Any) -> None:
    c = client_for(viewer)
    response = c.get("/")
    assert response.status_code == 302 and response["Location"] == "/cluster/"
    page = c.get("/cluster/").content.decode()
    # The page opens the socket the consumer serves, with the htmx extension from static/;
    # the socket names the pages of the nodes and models shown, whose blocks it pushes.
    assert 'ws-connect="/ws/live/nodes,models,judges,peers/?nodes_page=1&amp;models_page=1"' in page
    assert "/static/llmgw/htmx-ext-ws-2.0.4.js" in page


def test_dashboard_shows_nodes_classes_power_and_unplaced(client_for: Any, viewer: Any) -> None:
    node, _ = join_node(
        "gpu-1",
        ["nvidia-h100-80gb", "nvidia-h100-80gb", "nvidia-l4-24gb"],
        labels={"llmgw.io/rack": "r7"},
    )
    FacilityBudget.objects.create(level="rack", name="r7", cap_watts=3000)
    Replica.objects.create(model_name="big", reason="needs 4 free nvidia-h100-80gb on one node")
    page = client_for(viewer).get("/cluster/").content.decode()
    assert f'id="cluster-node-{node.pk}"' in page
    assert "2 free of 2" in page and "1 free of 1" in page
    assert 'data-domain="rack/r7"' in page and "3000 W" in page
    assert "needs 4 free nvidia-h100-80gb on one node" in page
    # A viewer is offered no action.
    assert "Cordon" not in page and "Drain" not in page


def test_dashboard_reads_a_fixed_number_of_queries(
    client_for: Any, viewer: Any, django_assert_max_num_queries: Any
) -> None:
    c = client_for(viewer)
    for i in range(3):
        join_node(f"n{i}", ["nvidia-l4-24gb"] * 2)
        Replica.objects.create(model_name=f"m{i}", reason="waiting")
    with django_assert_max_num_queries(40) as small:
        c.get("/cluster/")
    for i in range(3, 30):
        join_node(f"n{i}", ["nvidia-l4-24gb"] * 2)
        Replica.objects.create(model_name=f"m{i}", reason="waiting")
    with django_assert_max_num_queries(len(small.captured_queries)):
        c.get("/cluster/")


def test_operator_cordons_and_drains_and_it_is_logged(client_for: Any, operator: Any) -> None:
    node, _ = join_node("gpu-2", ["nvidia-l4-24gb"])
    c = client_for(operator)
    html = c.post(f"/cluster/nodes/{node.pk}/cordon/").content.decode()
    assert f'id="cluster-node-{node.pk}"' in html and "Uncordon" in html
    assert Node.objects.get(pk=node.pk).cordoned
    c.post(f"/cluster/nodes/{node.pk}/uncordon/")
    assert not Node.objects.get(pk=node.pk).cordoned
    c.post(f"/cluster/nodes/{node.pk}/drain/")
    assert Node.objects.get(pk=node.pk).cordoned
    actions = list(ClusterAction.objects.order_by("pk").values_list("action", "actor_name"))
    assert actions == [
        ("cordon", "otto (console)"),
        ("uncordon", "otto (console)"),
        ("drain", "otto (console)"),
    ]


def test_viewer_cannot_act(client_for: Any, viewer: Any) -> None:
    node, _ = join_node("gpu-3", ["nvidia-l4-24gb"])
    r = Replica.objects.create(model_name="m", reason="x")
    c = client_for(viewer)
    assert c.post(f"/cluster/nodes/{node.pk}/cordon/").status_code == 403
    assert c.post(f"/cluster/nodes/{node.pk}/drain/").status_code == 403
    assert c.post(f"/cluster/replicas/{r.pk}/restart/").status_code == 403
    assert c.post("/cluster/models/m/roll/").status_code == 403
    assert not Node.objects.get(pk=node.pk).cordoned
    assert not ClusterAction.objects.exists()


def test_unknown_action_and_node_are_not_found(client_for: Any, operator: Any) -> None:
    node, _ = join_node("gpu-4", [])
    c = client_for(operator)
    assert c.post(f"/cluster/nodes/{node.pk}/explode/").status_code == 404
    assert c.post("/cluster/nodes/999999/cordon/").status_code == 404
    assert c.get(f"/cluster/nodes/{node.pk}/cordon/").status_code == 405
    assert c.post("/cluster/models/not-in-catalog/roll/").status_code == 404


def test_roll_steps_read_in_order() -> None:
    new = live.ReplicaRow(
        pk=9, state="loading", reason="", profile="p", since=None, progress=0.5,  # type: ignore[arg-type]
        nodes=["n1"], cards=1, restarts=0, outdated=False, desired=True, endpoint="",
        replaces=3, evicted_by="",
    )  # fmt: skip
    old = live.ReplicaRow(**{**new.__dict__, "pk": 3, "state": "ready", "replaces": None})
    steps = live._roll_steps(new, old)
    assert [s.status for s in steps] == ["done", "done", "current", "todo"]
    assert steps[0].label == "new replica #9 placed on n1"
    ready = live.ReplicaRow(**{**new.__dict__, "state": "ready"})
    gone = live.ReplicaRow(**{**old.__dict__, "desired": False})
    assert [s.status for s in live._roll_steps(ready, gone)] == ["done"] * 4
    unplaced = live.ReplicaRow(**{**new.__dict__, "nodes": [], "state": "pending"})
    assert [s.status for s in live._roll_steps(unplaced, old)] == [
        "current", "todo", "todo", "todo",
    ]  # fmt: skip


def test_model_dom_ids_are_stable_and_distinct() -> None:
    assert live.model_dom_id("org/Chat-1") == live.model_dom_id("org/Chat-1")
    assert live.model_dom_id("org/chat-1") != live.model_dom_id("org-chat-1")
    assert live.model_dom_id("org/chat-1").startswith("cluster-model-org-chat-1-")


def test_operator_rolls_an_outdated_model_and_sees_its_steps(
    client_for: Any, operator: Any, viewer: Any
) -> None:
    from catalog import services as catalog_services
    from catalog.choices import Surface
    from catalog.models import ServedModel
    from cluster.reconciler import tick
    from tests.catalog.samples import gpu_model, store

    join_node("n1", ["nvidia-h100-80gb"] * 4)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    tick()
    m = ServedModel.objects.get(name="chat").to_spec()
    m.profiles[0].args = ["--enforce-eager"]
    catalog_services.save_model(m, catalog_services.Actor(None, Surface.CLI), replacing="chat")

    page = client_for(viewer).get("/cluster/").content.decode()
    assert "1 outdated" in page and "old definition" in page
    assert ">Roll<" not in page  # a viewer is offered no roll

    html = client_for(operator).post("/cluster/models/chat/roll/").content.decode()
    new = Replica.objects.get(replaces__isnull=False)
    assert f"new replica #{new.pk} placed" in html
    assert 'class="step-current"' in html
    tick()
    page = client_for(viewer).get("/cluster/").content.decode()
    assert f"new replica #{new.pk} placed on n1" in page
    assert ClusterAction.objects.get(action="roll").actor_name == "otto (console)"


def test_a_download_shows_as_a_progress_bar(client_for: Any, viewer: Any) -> None:
    Replica.objects.create(
        model_name="big", state="loading", progress=0.42,
        reason="downloading weights: 4.2 GB of 10.0 GB",
    )  # fmt: skip
    page = client_for(viewer).get("/cluster/").content.decode()
    assert '<progress max="100" value="42" data-role="progress">' in page
    assert "downloading weights: 4.2 GB of 10.0 GB" in page


def test_heartbeats_give_every_nodes_last_one_to_viewers_only(
    client: Any, client_for: Any, viewer: Any, outsider: Any, django_assert_num_queries: Any
) -> None:
    node, _ = join_node("hb-2", ["nvidia-l4-24gb"])
    quiet = Node.objects.create(name="hb-3")
    c = client_for(viewer)
    c.get("/cluster/heartbeats/")
    with django_assert_num_queries(1 + 3):  # the nodes; the session, its user, the role
        body = c.get("/cluster/heartbeats/").json()
    node.refresh_from_db()
    assert body["nodes"] == {str(node.pk): node.last_heartbeat.isoformat(), str(quiet.pk): None}
    assert body["now"] >= node.last_heartbeat.isoformat()
    assert client.get("/cluster/heartbeats/").status_code == 302  # to sign in
    assert client_for(outsider).get("/cluster/heartbeats/").status_code == 403


@pytest.mark.parametrize(
    "form, says",
    [
        (
            {"min": "abc", "max": "2"},
            "scaling.min must be a whole number from 0 to 10000, not 'abc'",
        ),
        ({"min": "1"}, "scaling.max must be a whole number from 0 to 10000, not ''"),
        ({"min": "-1", "max": "2"}, "scaling.min must be a whole number"),
        ({"min": "1", "max": "99999999999"}, "scaling.max must be a whole number"),
    ],
)
def test_scale_refuses_what_is_not_a_replica_count_saying_which_and_changes_nothing(
    client_for: Any, operator: Any, form: dict[str, str], says: str
) -> None:
    from catalog.models import ChangeRecord, ServedModel
    from tests.catalog.samples import gpu_model, store

    store(gpu_model("chat"))
    r = client_for(operator).post("/cluster/models/chat/scale/", form, follow=True)
    assert r.status_code == 200
    shown = [str(m) for m in r.context["messages"]]
    assert len(shown) == 1 and says in shown[0] and shown[0].endswith("Nothing changed."), shown
    scaling = ServedModel.objects.get(name="chat").to_spec().scaling
    assert (scaling.min, scaling.max) == (1, 2)
    assert ChangeRecord.objects.count() == 1


def test_scale_and_wake_of_a_model_not_in_the_catalog_are_404(
    client_for: Any, operator: Any
) -> None:
    c = client_for(operator)
    assert c.post("/cluster/models/ghost/scale/", {"min": "1", "max": "1"}).status_code == 404
    assert c.post("/cluster/models/ghost/wake/").status_code == 404
    assert c.get("/cluster/models/ghost/wake/").status_code == 405
    assert not ClusterAction.objects.exists()
