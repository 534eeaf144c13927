"""A node's identity is its node token; its engines are reached where the control plane sees
it (cluster.address), never where its inventory says."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import override_settings
from rest_framework.test import APIClient

from cluster import reconciler
from cluster.address import check_allowed, host_port, peer_address
from cluster.models import ClusterAction, JoinToken, Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import inventory

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"


def join(name: str, *, addr: str = "10.0.0.5", node_token: str = "", **headers: str) -> object:
    _, secret = JoinToken.issue(f"for {name}")
    client = APIClient(REMOTE_ADDR=addr)
    if node_token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {node_token}")
    return client.post(
        "/api/v1/agent/join",
        {
            "token": secret,
            "name": name,
            "inventory": inventory([H100, H100], hostname="evil.example"),
        },
        format="json",
        **headers,
    )


def agent(token: str, addr: str = "10.0.0.5") -> APIClient:
    c = APIClient(REMOTE_ADDR=addr)
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def ready_replica(client: APIClient) -> Replica:
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    (rep,) = client.get("/api/v1/agent/desired").json()["replicas"]
    body = {"reports": [{"replica": rep["id"], "state": "ready", "port": 41000}]}
    assert client.post("/api/v1/agent/report", body, format="json").status_code == 200
    return Replica.objects.get()


def test_a_second_join_under_a_name_is_refused_and_changes_nothing() -> None:
    first = join("gpu-1")
    assert first.status_code == 201
    digest = Node.objects.get().token_digest
    again = join("gpu-1", addr="10.6.6.6")
    assert again.status_code == 409
    assert "release gpu-1" in again.json()["detail"]
    node = Node.objects.get()
    assert node.token_digest == digest and node.address == "10.0.0.5"
    assert agent(first.json()["node_token"]).get("/api/v1/agent/desired").status_code == 200


def test_the_node_s_own_token_joins_it_again() -> None:
    token = join("gpu-1").json()["node_token"]
    again = join("gpu-1", node_token=token)
    assert again.status_code == 201
    assert agent(token).get("/api/v1/agent/desired").status_code == 401
    assert agent(again.json()["node_token"]).get("/api/v1/agent/desired").status_code == 200


def test_a_released_name_is_taken_by_the_next_join() -> None:
    old = join("gpu-1").json()["node_token"]
    out = io.StringIO()
    call_command("cluster", "node", "release", "gpu-1", stdout=out)
    assert "released" in out.getvalue()
    assert ClusterAction.objects.filter(action="release", target="node gpu-1").exists()
    assert Node.objects.get().state == "not_ready"
    assert agent(old).get("/api/v1/agent/desired").status_code == 401
    assert join("gpu-1").status_code == 201
    assert join("gpu-1").status_code == 409


def test_the_endpoint_is_the_seen_address_not_the_claimed_host_name() -> None:
    token = join("gpu-1").json()["node_token"]
    r = ready_replica(agent(token))
    assert Node.objects.get().hostname == "evil.example"
    assert r.endpoint == "http://10.0.0.5:41000"


def test_forwarded_for_is_honoured_only_from_a_trusted_proxy() -> None:
    spoof = {"HTTP_X_FORWARDED_FOR": "10.9.9.9"}
    assert join("a", addr="10.0.0.5", **spoof).status_code == 201
    assert Node.objects.get(name="a").address == "10.0.0.5"
    with override_settings(LLMGW_TRUSTED_PROXIES=["10.0.0.2"]):
        forwarded = {"HTTP_X_FORWARDED_FOR": "1.2.3.4, 10.0.0.8"}
        assert join("b", addr="10.0.0.2", **forwarded).status_code == 201
    assert Node.objects.get(name="b").address == "10.0.0.8"


def test_a_heartbeat_from_elsewhere_moves_the_endpoint_and_an_allowed_address_wins() -> None:
    token = join("gpu-1").json()["node_token"]
    ready_replica(agent(token))
    beat = agent(token, addr="10.0.0.6").post(
        "/api/v1/agent/heartbeat", {"inventory": inventory([H100, H100])}, format="json"
    )
    assert beat.status_code == 200
    assert Replica.objects.get().endpoint == "http://10.0.0.6:41000"
    out = io.StringIO()
    call_command("cluster", "node", "address", "gpu-1", "gpu-1.internal", stdout=out)
    assert Replica.objects.get().endpoint == "http://gpu-1.internal:41000"
    call_command("cluster", "node", "address", "gpu-1", stdout=out)
    assert Replica.objects.get().endpoint == "http://10.0.0.6:41000"


def test_address_helpers() -> None:
    assert peer_address("::ffff:10.0.0.1".replace("::ffff:", ""), "1.1.1.1") == "10.0.0.1"
    assert peer_address("10.0.0.2", "1.1.1.1, 10.0.0.3", ["10.0.0.2", "10.0.0.3"]) == "1.1.1.1"
    assert host_port("fd00::1", 8000) == "[fd00::1]:8000"
    assert check_allowed("10.0.0.7") is None and check_allowed("gpu-7.internal") is None
    assert check_allowed("http://x/") and check_allowed("a b")


def test_the_admin_releases_a_node_for_an_operator_only(
    client_for: object, viewer: object, operator: object
) -> None:
    token = join("gpu-1").json()["node_token"]
    node = Node.objects.get()
    post = {"action": "release", "_selected_action": [node.pk]}
    r = client_for(viewer).post("/admin/cluster/node/", post)  # type: ignore[operator]
    assert r.status_code == 403
    assert agent(token).get("/api/v1/agent/desired").status_code == 200
    r = client_for(operator).post("/admin/cluster/node/", post)  # type: ignore[operator]
    assert r.status_code == 302
    assert agent(token).get("/api/v1/agent/desired").status_code == 401
    assert ClusterAction.objects.filter(action="release", actor_name__endswith="(admin)").exists()
    page = client_for(viewer).get(f"/admin/cluster/node/{node.pk}/change/")  # type: ignore[operator]
    assert page.status_code == 200


def test_the_console_releases_a_node_for_an_operator_only(
    client_for: object, viewer: object, operator: object
) -> None:
    token = join("gpu-1").json()["node_token"]
    url = f"/cluster/nodes/{Node.objects.get().pk}/release/"
    assert client_for(viewer).post(url).status_code == 403  # type: ignore[operator]
    r = client_for(operator).post(url)  # type: ignore[operator]
    assert r.status_code == 200 and "released by" in r.content.decode()
    assert agent(token).get("/api/v1/agent/desired").status_code == 401
    assert ClusterAction.objects.filter(action="release", actor_name__endswith="(console)").exists()
