"""The agents' API over HTTP: join, heartbeat, desired list, reports; each agent only
speaks for its own node; bad input changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from cluster import reconciler
from cluster.models import Assignment, Card, JoinToken, Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import inventory

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"


def agent(token: str | None = None) -> APIClient:
    c = APIClient()
    if token:
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def joined(name: str, cards: list[str]) -> tuple[APIClient, str]:
    _, secret = JoinToken.issue("t")
    r = agent().post(
        "/api/v1/agent/join",
        {"token": secret, "name": name, "inventory": inventory(cards, hostname=name)},
        format="json",
    )
    assert r.status_code == 201, r.json()
    token = r.json()["node_token"]
    return agent(token), token


def test_join_stores_the_node_and_only_a_hash_of_its_token() -> None:
    _, token = joined("gpu-1", [H100, H100])
    node = Node.objects.get(name="gpu-1")
    assert node.state == "ready"
    assert node.token_digest and token not in node.token_digest
    assert list(Card.objects.values_list("index", "gpu_class")) == [(0, H100), (1, H100)]


def test_join_refused_with_bad_or_used_up_tokens() -> None:
    r = agent().post(
        "/api/v1/agent/join",
        {"token": "llmgw_join_nope", "name": "x", "inventory": inventory()},
        format="json",
    )
    assert r.status_code == 401
    _, secret = JoinToken.issue("once", max_uses=1)
    assert (
        agent()
        .post(
            "/api/v1/agent/join",
            {"token": secret, "name": "a", "inventory": inventory()},
            format="json",
        )
        .status_code
        == 201
    )
    r = agent().post(
        "/api/v1/agent/join",
        {"token": secret, "name": "b", "inventory": inventory()},
        format="json",
    )
    assert r.status_code == 401 and "used up" in r.json()["detail"]
    assert not Node.objects.filter(name="b").exists()


def test_bad_inventory_is_refused_and_changes_nothing() -> None:
    client, _ = joined("gpu-1", [H100])
    bad = inventory([H100])
    bad["cards"].append({"index": 0, "class": H100})
    r = client.post("/api/v1/agent/heartbeat", {"inventory": bad}, format="json")
    assert r.status_code == 400 and "listed twice" in r.json()["detail"]
    r = client.post("/api/v1/agent/heartbeat", {"inventory": "cards"}, format="json")
    assert r.status_code == 400
    assert Card.objects.count() == 1


def test_heartbeat_updates_inventory_and_needs_a_node_token() -> None:
    client, _ = joined("gpu-1", [H100])
    r = client.post(
        "/api/v1/agent/heartbeat", {"inventory": inventory([H100, H100, H100])}, format="json"
    )
    assert r.status_code == 200 and r.json()["state"] == "ready"
    assert Card.objects.count() == 3
    assert (
        agent()
        .post("/api/v1/agent/heartbeat", {"inventory": inventory()}, format="json")
        .status_code
        == 401
    )
    assert agent("llmgw_node_forged").get("/api/v1/agent/desired").status_code == 401


def test_desired_list_and_reports_for_own_replicas_only() -> None:
    a, _ = joined("a", [H100, H100])
    b, _ = joined("b", [])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    desired = a.get("/api/v1/agent/desired").json()
    (rep,) = desired["replicas"]
    assert rep["model"] == "chat" and rep["engine"] == "vllm" and rep["cards"] == [0, 1]
    assert rep["tp"] == 2 and rep["startup_timeout_s"] == 1200
    assert b.get("/api/v1/agent/desired").json()["replicas"] == []

    ok = {
        "reports": [
            {
                "replica": rep["id"],
                "state": "loading",
                "reason": "loading weights",
                "progress": 0.5,
                "port": 41000,
            }
        ]
    }
    assert a.post("/api/v1/agent/report", ok, format="json").json() == {"accepted": 1}
    r = Replica.objects.get()
    assert (r.state, r.reason, r.progress, r.port) == ("loading", "loading weights", 0.5, 41000)

    # Node b may not speak for a's replica: refused, nothing applied.
    r = b.post(
        "/api/v1/agent/report",
        {"reports": [{"replica": rep["id"], "state": "failed"}]},
        format="json",
    )
    assert r.status_code == 403
    assert Replica.objects.get().state == "loading"

    r = a.post(
        "/api/v1/agent/report",
        {"reports": [{"replica": rep["id"], "state": "exploded"}]},
        format="json",
    )
    assert r.status_code == 400 and "not one of" in r.json()["detail"]
    assert Replica.objects.get().state == "loading"


def test_multi_node_replica_gets_one_entry_per_rank() -> None:
    a, _ = joined("a", [H100] * 4)
    b, _ = joined("b", [H100] * 4)
    store(
        gpu_model(
            "big",
            profiles=[{"name": "x", "gpu_class": H100, "tp": 8, "nodes": 2, "gpus_per_node": 4}],
        )
    )
    reconciler.tick()
    ranks = sorted(c.get("/api/v1/agent/desired").json()["replicas"][0]["rank"] for c in (a, b))
    assert ranks == [0, 1]
    assert Assignment.objects.count() == 2


def test_operator_actions_and_roles(api_for: Any, operator: Any, viewer: Any) -> None:
    a, _ = joined("a", [H100, H100])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    version = a.post(
        "/api/v1/agent/heartbeat", {"inventory": inventory([H100, H100])}, format="json"
    ).json()["desired_version"]
    rid = Replica.objects.get().pk
    assert api_for(viewer).post(f"/api/v1/cluster/replicas/{rid}/restart/").status_code == 403
    r = api_for(operator).post(f"/api/v1/cluster/replicas/{rid}/restart/")
    assert r.status_code == 200 and r.json()["generation"] == 2
    # The agent is told its list changed.
    r = a.post("/api/v1/agent/heartbeat", {"inventory": inventory([H100, H100])}, format="json")
    assert r.json()["desired_version"] > version
    assert a.get("/api/v1/agent/desired").json()["replicas"][0]["generation"] == 2

    r = api_for(operator).post("/api/v1/cluster/nodes/a/drain/")
    assert r.json()["replicas_stopped"] == 1
    assert Node.objects.get(name="a").cordoned
    assert a.get("/api/v1/agent/desired").json()["replicas"] == []
    nodes = api_for(viewer).get("/api/v1/cluster/nodes/").json()["results"]
    assert nodes[0]["state"] == "cordoned"
    assert api_for(viewer).get("/api/v1/cluster/replicas/").status_code == 200
    assert api_for(viewer).post("/api/v1/cluster/nodes/a/uncordon/").status_code == 403
    actions = api_for(viewer).get("/api/v1/cluster/actions/").json()["results"]
    assert [(x["action"], x["target"], x["actor_name"]) for x in actions] == [
        ("drain", "node a", "otto"),
        ("restart", f"replica {rid} of chat", "otto"),
    ]


def test_replica_list_queries_do_not_grow_with_models(api_for: Any, viewer: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    api = api_for(viewer)
    store(*[gpu_model(f"m{i}") for i in range(3)])
    api.get("/api/v1/cluster/replicas/")
    with CaptureQueriesContext(connection) as few:
        api.get("/api/v1/cluster/replicas/")
    store(*[gpu_model(f"n{i}") for i in range(20)])
    with CaptureQueriesContext(connection) as many:
        api.get("/api/v1/cluster/replicas/")
    assert len(many) == len(few)


def test_desired_list_queries_do_not_grow_with_replicas() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    a, _ = joined("a", [H100] * 8)
    store(gpu_model("m0", profiles=[{"name": "x", "gpu_class": H100}]))
    reconciler.tick()
    a.get("/api/v1/agent/desired")
    with CaptureQueriesContext(connection) as few:
        assert len(a.get("/api/v1/agent/desired").json()["replicas"]) == 1
    store(*[gpu_model(f"m{i}", profiles=[{"name": "x", "gpu_class": H100}]) for i in range(1, 6)])
    reconciler.tick()
    with CaptureQueriesContext(connection) as many:
        assert len(a.get("/api/v1/agent/desired").json()["replicas"]) == 6
    assert len(many) == len(few)
