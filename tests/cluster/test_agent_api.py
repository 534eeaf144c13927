"""The agents' API over HTTP: join, heartbeat, desired list, reports; each agent only
speaks for its own node; bad input changes nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from cluster import agentbeat, agentinput, agentreport, reconciler, services
from cluster.choices import NodeHealth
from cluster.models import Assignment, Card, JoinToken, Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import inventory, join_node
from tests.redisserver import url as redis_url

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


# Heartbeats and desired lists as the web process serves them: the lean ASGI route in
# front of Django (cluster/api/lean.py), through the real ASGI application. Its database
# work runs on a pool thread, so these tests commit (transaction=True).

lean = pytest.mark.django_db(transaction=True)
A100 = "nvidia-a100-80gb"


def over_asgi(
    method: str,
    path: str,
    *,
    token: str | None = None,
    json: Any = None,
    content: bytes | None = None,
    host: str = "localhost",
    content_type: str = "application/json",
) -> httpx.Response:
    """Send one request to llmgw_admin.asgi.application, as the web server hands it over."""
    from llmgw_admin.asgi import application

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if content is not None:
        headers["Content-Type"] = content_type

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as c:
            return await c.request(method, path, json=json, content=content, headers=headers)

    return asyncio.run(send())


def beat(token: str | None, inv: Any = None, **kwargs: Any) -> httpx.Response:
    body = {"inventory": inv} if inv is not None else kwargs.pop("json", None)
    return over_asgi("POST", "/api/v1/agent/heartbeat", token=token, json=body, **kwargs)


@lean
def test_lean_heartbeat_answers_and_stamps_the_node() -> None:
    node, token = join_node("gpu-1", [H100, H100])
    joined_at = node.last_heartbeat
    r = beat(token, inventory([H100, H100], hostname="gpu-1", disk_free_mb=512))
    assert r.status_code == 200, r.text
    # Django's stack did not answer it (DRF would add Allow and Vary).
    assert "allow" not in r.headers and r.headers["content-type"] == "application/json"
    assert r.json() == {"node": "gpu-1", "state": "ready", "desired_version": 1}
    n = Node.objects.get()
    assert n.last_heartbeat > joined_at
    # The free disk is written by every heartbeat, though it is left out of the digest.
    assert n.disk_free_mb == 512
    services.set_cordon(n, True)
    services.bump_desired([n.pk])
    r = beat(token, inventory([H100, H100], hostname="gpu-1"))
    assert r.json() == {"node": "gpu-1", "state": "cordoned", "desired_version": 2}


@lean
def test_lean_heartbeat_brings_a_lost_node_back_ready_with_its_reason() -> None:
    node, token = join_node("gpu-1", [H100])
    Node.objects.filter(pk=node.pk).update(
        health=NodeHealth.LOST, reason="not heard from for more than 30 s"
    )
    assert beat(token, inventory([H100], hostname="gpu-1")).status_code == 200
    n = Node.objects.get()
    assert (n.state, n.reason) == ("ready", "heard from again")
    Node.objects.filter(pk=node.pk).update(health=NodeHealth.NOT_READY, reason="starting")
    beat(token, inventory([H100], hostname="gpu-1"))
    n = Node.objects.get()
    assert (n.state, n.reason) == ("ready", "")


@lean
def test_lean_heartbeat_tells_consoles_when_a_node_comes_back_and_only_then(
    settings: Any,
) -> None:
    import uuid

    from channels.layers import channel_layers, get_channel_layer

    from llmgw_core.events import BY_TOPIC

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [redis_url(0)],
                "prefix": f"llmgw-test-{uuid.uuid4().hex[:8]}",
            },
        }
    }
    channel_layers.backends.clear()
    node, token = join_node("gpu-1", [H100])
    Node.objects.filter(pk=node.pk).update(health=NodeHealth.LOST, reason="not heard from")
    same = inventory([H100], hostname="gpu-1")
    from llmgw_admin.asgi import application

    async def listen() -> list[Any]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(BY_TOPIC["nodes"].group, channel)
        heard = []
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            for _ in range(2):
                r = await c.post(
                    "/api/v1/agent/heartbeat",
                    json={"inventory": same},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert r.status_code == 200
                try:
                    # Long enough for the first; the second should bring nothing.
                    wait = 1 if heard else 5
                    heard.append(await asyncio.wait_for(layer.receive(channel), wait))
                except TimeoutError:
                    heard.append(None)
        await layer.flush()
        return heard

    try:
        came_back, ordinary = asyncio.run(listen())
    finally:
        channel_layers.backends.clear()
    assert came_back is not None and came_back["pks"] == [node.pk]
    assert ordinary is None


@lean
def test_lean_heartbeat_stores_a_changed_inventory() -> None:
    _, token = join_node("gpu-1", [H100, H100])
    changed = inventory(
        [H100, A100, A100],
        hostname="gpu-1b",
        engines={"vllm": "0.12.0"},
        labels={"llmgw.io/rack": "r7"},
        memory_mb=512_000,
        weights=["org/chat"],
    )
    assert beat(token, changed).status_code == 200
    n = Node.objects.get()
    assert (n.hostname, n.engines, n.labels, n.memory_mb, n.weights) == (
        "gpu-1b",
        {"vllm": "0.12.0"},
        {"llmgw.io/rack": "r7"},
        512_000,
        ["org/chat"],
    )
    assert list(Card.objects.values_list("index", "gpu_class")) == [(0, H100), (1, A100), (2, A100)]
    # And back: the stored digest follows what was applied, so an old inventory is applied
    # again rather than skipped.
    assert beat(token, inventory([H100, H100], hostname="gpu-1")).status_code == 200
    assert Card.objects.count() == 2 and Node.objects.get().hostname == "gpu-1"


@lean
def test_lean_heartbeat_speaks_only_for_the_tokens_node() -> None:
    a, token_a = join_node("a", [H100])
    b, _ = join_node("b", [H100])
    # a's agent sending b's inventory still only touches a: the token names the node.
    r = beat(token_a, inventory([A100, A100], hostname="b"))
    assert r.json()["node"] == "a"
    b_after = Node.objects.get(name="b")
    assert b_after.last_heartbeat == b.last_heartbeat and b_after.hostname == "b"
    assert list(Card.objects.filter(node=b_after).values_list("gpu_class", flat=True)) == [H100]
    assert list(Card.objects.filter(node__name="a").values_list("gpu_class", flat=True)) == [
        A100,
        A100,
    ]


@lean
def test_lean_heartbeat_refusals_are_the_api_s_and_change_nothing() -> None:
    node, token = join_node("gpu-1", [H100])
    good = inventory([H100], hostname="gpu-1")

    r = beat(None, good)
    assert r.status_code == 401 and "send the node token" in r.json()["detail"]
    assert r.headers["www-authenticate"] == 'Bearer realm="agent"'
    r = beat("llmgw_node_forged", good)
    assert r.status_code == 401 and "unknown node token" in r.json()["detail"]
    r = beat(token[:-1], good)
    assert r.status_code == 401

    twice = inventory([H100, H100], hostname="gpu-1")
    twice["cards"][1]["index"] = 0
    r = beat(token, twice)
    assert r.status_code == 400 and "listed twice" in r.json()["detail"]
    r = beat(token, json={"inventory": "cards"})
    assert r.status_code == 400 and "JSON object" in r.json()["detail"]
    r = over_asgi("POST", "/api/v1/agent/heartbeat", token=token, content=b"{not json")
    assert r.status_code == 400 and "JSON parse error" in r.json()["detail"]
    r = over_asgi(
        "POST",
        "/api/v1/agent/heartbeat",
        token=token,
        content=json.dumps({"inventory": good}).encode(),
        content_type="text/plain",
    )
    assert r.status_code == 415
    assert over_asgi("GET", "/api/v1/agent/heartbeat", token=token).status_code == 405
    # A host the deployment does not serve is refused by Django, as for any page.
    assert beat(token, good, host="evil.example").status_code == 400

    n = Node.objects.get()
    assert n.last_heartbeat == node.last_heartbeat
    assert list(Card.objects.values_list("index", "gpu_class")) == [(0, H100)]


@lean
def test_lean_desired_list_is_the_api_s_and_only_the_token_s_node() -> None:
    _, token_a = join_node("a", [H100, H100])
    _, token_b = join_node("b", [])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    r = over_asgi("GET", "/api/v1/agent/desired", token=token_a)
    assert r.status_code == 200 and "allow" not in r.headers
    assert r.json() == agent(token_a).get("/api/v1/agent/desired").json()
    (rep,) = r.json()["replicas"]
    assert (rep["model"], rep["cards"]) == ("chat", [0, 1])
    assert over_asgi("GET", "/api/v1/agent/desired", token=token_b).json()["replicas"] == []
    r = over_asgi("GET", "/api/v1/agent/desired", token="llmgw_node_forged")
    assert r.status_code == 401 and "unknown node token" in r.json()["detail"]
    r = over_asgi("GET", "/api/v1/agent/desired")
    assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="agent"'
    assert over_asgi("POST", "/api/v1/agent/desired", token=token_a).status_code == 405


def test_unchanged_inventory_costs_one_query_and_a_changed_one_is_read() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _, token = join_node("gpu-1", [H100])
    same = inventory([H100], hostname="gpu-1")
    with CaptureQueriesContext(connection) as q:
        assert agentbeat.heartbeat_by_token(token, {**same, "disk_free_mb": 7}) is not None
    assert len(q) == 1
    assert Node.objects.get().disk_free_mb == 7
    with CaptureQueriesContext(connection) as q:
        agentbeat.heartbeat_by_token(token, inventory([H100, H100], hostname="gpu-1"))
    assert len(q) > 1 and Card.objects.count() == 2
    assert agentbeat.heartbeat_by_token("llmgw_node_nobody", same) is None
    with pytest.raises(agentinput.AgentError, match="must be a list"):
        agentbeat.heartbeat_by_token(token, {**same, "cards": "many"})


def test_inventory_digest_ignores_order_and_free_disk_only() -> None:
    inv = inventory([H100, A100], hostname="gpu-1")
    digest = agentinput.inventory_digest(inv)
    assert agentinput.inventory_digest(dict(reversed(list(inv.items())))) == digest
    assert agentinput.inventory_digest({**inv, "disk_free_mb": 1}) == digest
    for change in (
        {"cards": inv["cards"][:1]},
        {"engines": {"vllm": "0.12.0"}},
        {"labels": {"llmgw.io/rack": "r1"}},
        {"weights": ["org/chat"]},
        {"memory_mb": 1},
        {"cpu_cores": 1},
        {"simulated": True},
    ):
        assert agentinput.inventory_digest({**inv, **change}) != digest, change
    assert agentinput.inventory_digest("cards") == ""


@lean
def test_lean_heartbeat_refuses_what_the_columns_cannot_hold_and_changes_nothing() -> None:
    node, token = join_node("gpu-1", [H100])
    good = inventory([H100], hostname="gpu-1", disk_free_mb=512)
    assert beat(token, good).status_code == 200
    # The same inventory (the one-statement path) with a free disk no column holds.
    r = beat(token, {**good, "disk_free_mb": 10**30})
    assert r.status_code == 400
    assert "inventory.disk_free_mb must be a whole number from 0 to" in r.json()["detail"]
    changed = inventory([H100], hostname="gpu-1", cpu_cores=2**40)
    r = beat(token, changed)
    assert r.status_code == 400 and "inventory.cpu_cores" in r.json()["detail"]
    watts = inventory([H100], hostname="gpu-1")
    watts["cards"][0]["power_limit_w"] = "700 W"
    r = beat(token, watts)
    assert r.status_code == 400 and "inventory.cards[0].power_limit_w" in r.json()["detail"]
    r = over_asgi("POST", "/api/v1/agent/heartbeat", token=token, content=b"[" * 5000)
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"]
    n = Node.objects.get(pk=node.pk)
    assert (n.disk_free_mb, n.cpu_cores) == (512, good["cpu_cores"])


def test_a_report_with_a_bad_field_is_refused_whole_naming_it() -> None:
    client, _ = joined("gpu-1", [H100, H100])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    replica = Replica.objects.get(model_name="chat")
    ok = {"replica": replica.pk, "state": "loading", "reason": "", "at": "2026-11-30T10:00:00Z"}
    cases = [
        ({"state": ["ready"]}, "reports[1].state ['ready'] is not one of"),
        ({"port": 70000}, "reports[1].port must be a whole number from 0 to 65535"),
        ({"pid": 2**40}, "reports[1].pid must be a whole number"),
        ({"restarts": -1}, "reports[1].restarts must be a whole number"),
        ({"progress": 1.5}, "reports[1].progress must be a number from 0 to 1"),
        ({"at": "2026-13-45T00:00:00Z"}, "reports[1].at must be an ISO 8601 time"),
        ({"at": "2026-11-30T10:00:00"}, "reports[1].at must be an ISO 8601 time"),
        ({"reason": {"text": "x"}}, "reports[1].reason must be text"),
        ({"replica": 2**70}, "reports[1] needs an integer replica"),
    ]
    for change, says in cases:
        body = {"reports": [{**ok, "state": "starting"}, {**ok, **change}]}
        r = client.post("/api/v1/agent/report", body, format="json")
        assert r.status_code == 400, (change, r.content)
        assert says in r.json()["detail"], (change, r.json())
        # The first report, good on its own, was not applied either.
        assert Assignment.objects.get(replica=replica).state != "starting"
    r = client.post("/api/v1/agent/report", {"reports": [ok]}, format="json")
    assert r.status_code == 200 and Assignment.objects.get(replica=replica).state == "loading"


def test_a_reported_engine_log_is_kept_bounded_masked_and_shown_to_operators_only(
    api_for: Any, operator: Any, viewer: Any
) -> None:
    client, _ = joined("gpu-1", [H100, H100])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    rid = Replica.objects.get(model_name="chat").pk
    leaked = "llmgw_engine_" + "k" * 43
    lines = [f"line {i}" for i in range(100)] + [f"Traceback: key {leaked}", "x" * 5000]
    body = {"reports": [{"replica": rid, "state": "failed", "reason": "exited", "log": lines}]}
    assert client.post("/api/v1/agent/report", body, format="json").status_code == 200
    kept = Assignment.objects.get(replica_id=rid).log
    assert len(kept) == agentreport.LOG_LINES and kept[-3] == "line 99"
    assert kept[-2] == "Traceback: key [secret]" and len(kept[-1]) == agentreport.LOG_LINE_CHARS

    r = api_for(operator).get(f"/api/v1/cluster/replicas/{rid}/log/")
    assert r.status_code == 200, r.content
    (on,) = r.json()["nodes"]
    assert (on["node"], on["rank"], on["state"], on["lines"]) == ("gpu-1", 0, "failed", kept)
    assert leaked not in r.content.decode()
    refused = api_for(viewer).get(f"/api/v1/cluster/replicas/{rid}/log/")
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]

    # A report without a log keeps the one held; a bad log refuses the report whole.
    body = {"reports": [{"replica": rid, "state": "starting", "reason": "again"}]}
    assert client.post("/api/v1/agent/report", body, format="json").status_code == 200
    assert Assignment.objects.get(replica_id=rid).log == kept
    for bad in ("one line", [1, 2], [["x"]]):
        body = {"reports": [{"replica": rid, "state": "ready", "reason": "", "log": bad}]}
        r = client.post("/api/v1/agent/report", body, format="json")
        assert r.status_code == 400 and "reports[0].log must be a list" in r.json()["detail"]
    assert Assignment.objects.get(replica_id=rid).state == "starting"


def test_a_nodes_detail_has_its_cards_replicas_and_agent_version(
    api_for: Any, operator: Any, viewer: Any
) -> None:
    client, _ = joined("gpu-1", [H100, H100, H100])
    inv = {**inventory([H100, H100, H100], hostname="gpu-1"), "agent_version": "0.9.1"}
    client.post("/api/v1/agent/heartbeat", {"inventory": inv}, format="json")
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    rid = Replica.objects.get(model_name="chat").pk
    Assignment.objects.filter(replica_id=rid).update(reason="exited\n-- /secret/path refused")
    r = api_for(viewer).get("/api/v1/cluster/nodes/gpu-1/")
    assert r.status_code == 200, r.content
    node = r.json()
    assert node["agent_version"] == "0.9.1"
    assert [(c["index"], c["gpu_class"], c["replica"], c["model"]) for c in node["cards"]] == [
        (0, H100, rid, "chat"),
        (1, H100, rid, "chat"),
        (2, H100, None, None),
    ]
    (rep,) = node["replicas"]
    assert (rep["replica"], rep["model"], rep["rank"], rep["cards"]) == (rid, "chat", 0, [0, 1])
    assert rep["reason"] == "exited"  # the detail is an operator's
    op = api_for(operator).get("/api/v1/cluster/nodes/gpu-1/").json()
    assert op["replicas"][0]["reason"] == "exited\n-- /secret/path refused"
    # The list keeps its shape (no replicas there).
    listed = api_for(viewer).get("/api/v1/cluster/nodes/").json()["results"][0]
    assert "replicas" not in listed and listed["cards"][0]["index"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_report_that_moves_only_the_engines_log_tells_no_console(settings: Any) -> None:
    """A running engine's lines come every few seconds: kept, but no live event (every
    open dashboard would render its model). A change of state still tells them."""
    import uuid

    from channels.layers import channel_layers, get_channel_layer

    from llmgw_core.events import BY_TOPIC

    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [redis_url(0)],
                "prefix": f"llmgw-test-{uuid.uuid4().hex[:8]}",
            },
        }
    }
    channel_layers.backends.clear()
    client, _ = joined("gpu-1", [H100, H100])
    other, _ = join_node("gpu-2", [])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    rid = Replica.objects.get(model_name="chat").pk
    node_id = Node.objects.get(name="gpu-1").pk
    ready = {"replica": rid, "state": "ready", "reason": "up", "port": 41000, "pid": 7}
    assert (
        client.post("/api/v1/agent/report", {"reports": [ready]}, format="json").status_code == 200
    )

    async def listen() -> list[Any]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(BY_TOPIC["nodes"].group, channel)
        from asgiref.sync import sync_to_async

        def log_only_then_another_node() -> None:
            body = {"reports": [{**ready, "log": ["a new line"]}]}
            assert client.post("/api/v1/agent/report", body, format="json").status_code == 200
            Node.objects.get(pk=other.pk).save()  # a change consoles hear: the marker

        await sync_to_async(log_only_then_another_node)()
        first = await asyncio.wait_for(layer.receive(channel), 30)
        await layer.flush()
        return [first]

    try:
        (first,) = asyncio.run(listen())
    finally:
        channel_layers.backends.clear()
    assert first["pks"] == [other.pk], first  # nothing was published for gpu-1 before it
    a = Assignment.objects.get(replica_id=rid)
    assert a.log == ["a new line"] and a.state == "ready"
    assert node_id != other.pk
