"""Issue 11 items 2-4: a node's identity, engine arguments and environment, weights sources.

The takeover is tried as it was found: over real HTTP against a real ``manage.py serve``,
with a real agent beside it that must keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cluster.models import JoinToken, Node, Replica
from tests.catalog.samples import store
from tests.cluster.helpers import inventory
from tests.e2e.conftest import Agent, ControlPlane, agents, control_plane, wait_for

# The e2e fixtures, for this module's real processes.
__all__ = ("agents", "control_plane")

H100 = "nvidia-h100-80gb"


def _operator_headers() -> dict[str, str]:
    from django.contrib.auth.models import Group, User

    from llmgw_admin.models import ApiToken

    user = User.objects.create_user("ops", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    _, secret = ApiToken.issue(user, "security")
    return {"Authorization": f"Bearer {secret}"}


def _ready(model: str) -> Replica | None:
    return Replica.objects.filter(model_name=model, desired=True, state="ready").first()


@pytest.mark.e2e
def test_a_join_token_cannot_take_over_a_node_and_the_real_agent_keeps_working(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    agent = agents("sim-1", "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    node = wait_for(lambda: Node.objects.filter(name="sim-1", health="ready").first(), 60, "sim-1")
    digest = node.token_digest
    store(
        {
            "name": "judge",
            "source": "sim/judge",
            "profiles": [{"name": "sim", "engine": "sim", "gpu_class": H100, "tp": 1}],
            "scaling": {"min": 1, "max": 1},
        }
    )
    replica = wait_for(lambda: _ready("judge"), 90, "the judge's replica ready")
    # The endpoint is where the control plane heard the agent from, not what it claims.
    assert replica.endpoint.startswith("http://127.0.0.1:"), replica.endpoint

    # A join token made for another rack, used by someone who is not sim-1's agent.
    _, other = JoinToken.issue("rack 9", max_uses=5)
    claim = inventory([H100], hostname="attacker.example")
    join = f"{control_plane.url}/api/v1/agent/join"
    r = httpx.post(join, json={"token": other, "name": "sim-1", "inventory": claim}, timeout=10)
    assert r.status_code == 409, r.text
    assert "release" in r.json()["detail"] and "node_token" not in r.json()
    # A forged node token beside it proves nothing either.
    r = httpx.post(
        join,
        json={"token": other, "name": "sim-1", "inventory": claim},
        headers={"Authorization": "Bearer llmgw_node_forged"},
        timeout=10,
    )
    assert r.status_code == 409, r.text
    node.refresh_from_db()
    assert node.token_digest == digest and node.hostname != "attacker.example"

    # A new name is what a join token is for; its claimed host name reaches nothing.
    r = httpx.post(join, json={"token": other, "name": "rogue", "inventory": claim}, timeout=10)
    assert r.status_code == 201, r.text
    rogue = Node.objects.get(name="rogue")
    assert rogue.hostname == "attacker.example" and rogue.host == "127.0.0.1"
    # ... and it cannot speak for sim-1's replica.
    r = httpx.post(
        f"{control_plane.url}/api/v1/agent/report",
        json={"reports": [{"replica": replica.pk, "state": "ready", "port": 1}]},
        headers={"Authorization": f"Bearer {r.json()['node_token']}"},
        timeout=10,
    )
    assert r.status_code == 403, r.text

    # The real agent was never locked out: it keeps heartbeating and serving.
    seen = Node.objects.get(name="sim-1").last_heartbeat
    wait_for(lambda: Node.objects.get(name="sim-1").last_heartbeat > seen, 30, "sim-1's heartbeats")
    replica.refresh_from_db()
    assert replica.state == "ready" and replica.endpoint.startswith("http://127.0.0.1:")
    answer = httpx.post(
        replica.endpoint + "/v1/chat/completions",
        json={"model": "judge", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=10,
    )
    assert answer.status_code == 200

    # Restarted, the agent is sim-1 again with the node token it kept: no join at all.
    agent.kill()
    agents("sim-1", "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    seen = Node.objects.get(name="sim-1").last_heartbeat
    wait_for(
        lambda: Node.objects.get(name="sim-1").last_heartbeat > seen, 30, "the restarted agent"
    )
    assert Node.objects.get(name="sim-1").token_digest == digest

    # An operator releases the name: the next join takes it (here the agent itself).
    ops = _operator_headers()
    r = httpx.post(
        f"{control_plane.url}/api/v1/cluster/nodes/sim-1/release/", headers=ops, timeout=10
    )
    assert r.status_code == 200, r.text
    from cluster.models import ClusterAction

    assert ClusterAction.objects.filter(
        action="release", target="node sim-1", actor_name__startswith="ops"
    ).exists()
    wait_for(
        lambda: (n := Node.objects.get(name="sim-1")).token_digest not in (None, digest)
        and n.health == "ready",
        30,
        "sim-1's agent joined again after the release",
    )
    wait_for(lambda: _ready("judge"), 60, "the judge ready again")


def test_release_and_address_need_an_operator(api_for: Any, viewer: Any, operator: Any) -> None:
    from tests.cluster.helpers import join_node

    join_node("gpu-1", [H100])
    for action, body in (("release", {}), ("address", {"address": "10.0.0.7"})):
        url = f"/api/v1/cluster/nodes/gpu-1/{action}/"
        assert api_for(viewer).post(url, body, format="json").status_code == 403
    r = api_for(operator).post(
        "/api/v1/cluster/nodes/gpu-1/address/", {"address": "not an address!"}, format="json"
    )
    assert r.status_code == 400 and "address" in r.json()["errors"]
    r = api_for(operator).post(
        "/api/v1/cluster/nodes/gpu-1/address/", {"address": "10.0.0.7"}, format="json"
    )
    assert r.status_code == 200 and r.json()["allowed_address"] == "10.0.0.7"
    assert Node.objects.get(name="gpu-1").host == "10.0.0.7"


pytestmark = pytest.mark.django_db(transaction=True)
