"""Heartbeats and desired lists' nodes done many in one statement (cluster.beatwriter),
through the real ASGI application: each agent answered as its own node, a node brought
back reaching the reconciler, and the outcome of a database that is slow or breaks
under a batch."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from django.db import connection, transaction

from cluster.choices import NodeHealth
from cluster.models import Card, Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import inventory, join_node
from tests.cluster.test_agent_api import beat
from tests.cluster.test_wake import embedded_loop, placed_on  # noqa: F401
from tests.e2e.conftest import wait_for
from tests.waiting import wait_until

H100 = "nvidia-h100-80gb"
batched = pytest.mark.django_db(transaction=True)


def at_once(calls: list[tuple[str, str, Any]]) -> list[httpx.Response]:
    """Send these (method, token, inventory) calls together, on one event loop."""
    from llmgw_admin.asgi import application

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return list(
                await asyncio.gather(
                    *(
                        c.post(
                            "/api/v1/agent/heartbeat",
                            json={"inventory": inv},
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        if method == "POST"
                        else c.get(
                            "/api/v1/agent/desired",
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        for method, token, inv in calls
                    )
                )
            )

    return asyncio.run(send())


def heard(name: str) -> tuple[Node, str]:
    """Join a node and heartbeat once through the route (which records the address its
    calls come from): its next heartbeats are stamps a batch writes."""
    _, token = join_node(name, [H100])
    assert beat(token, inventory([H100], hostname=name)).status_code == 200
    return Node.objects.get(name=name), token


def batch_waiting_on_a_lock() -> int | None:
    """The backend of the batch's statement while it waits for a row lock, else None.

    Read afresh each time: the tests look from inside the transaction that holds the lock,
    and PostgreSQL keeps a transaction's first view of ``pg_stat_activity`` until it ends
    (a look made before the batch's statement began saw none for as long as it waited)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%%json_to_recordset%%'"
        )
        row = cursor.fetchone()
    return row[0] if row else None


@batched
def test_agents_beating_at_once_are_each_answered_as_their_own_node() -> None:
    nodes = [heard(f"gpu-{i}") for i in range(4)]
    Node.objects.filter(name="gpu-2").update(health=NodeHealth.LOST, reason="not heard from")
    Node.objects.filter(name="gpu-3").update(cordoned=True, desired_version=7)
    calls = [("POST", token, inventory([H100], hostname=n.name)) for n, token in nodes]
    # An agent's heartbeat twice in one batch, and desired lists beside them.
    calls += [calls[0], ("GET", nodes[1][1], None), ("GET", nodes[3][1], None)]
    answers = at_once(calls)
    assert [r.status_code for r in answers] == [200] * len(calls)
    assert [r.json() for r in answers[:5]] == [
        {"node": "gpu-0", "state": "ready", "desired_version": 1},
        {"node": "gpu-1", "state": "ready", "desired_version": 1},
        {"node": "gpu-2", "state": "ready", "desired_version": 1},
        {"node": "gpu-3", "state": "cordoned", "desired_version": 7},
        {"node": "gpu-0", "state": "ready", "desired_version": 1},
    ]
    assert [r.json() for r in answers[5:]] == [
        {"version": 1, "replicas": []},
        {"version": 7, "replicas": []},
    ]
    back = Node.objects.get(name="gpu-2")
    assert (back.health, back.reason) == (NodeHealth.READY, "heard from again")
    for n, _ in nodes:
        assert Node.objects.get(pk=n.pk).last_heartbeat > n.last_heartbeat


@batched
def test_a_changed_inventory_beside_stamps_is_applied_and_unknown_tokens_refused() -> None:
    """The batch finds each node by its token alone, then holds it to the digest and the
    address it had: a heartbeat whose inventory changed is applied by the service, the
    unchanged beside it stamped, and a token no node holds answered by the API view."""
    (one, token_one), (two, token_two) = heard("gpu-1"), heard("gpu-2")
    calls = [
        ("POST", token_one, inventory([H100, H100], hostname="gpu-1")),  # a card more
        ("POST", token_two, inventory([H100], hostname="gpu-2")),
        ("POST", "llmgw_node_nobody", inventory([H100], hostname="gpu-3")),
        ("GET", token_one, None),
        ("GET", "llmgw_node_nobody", None),
    ]
    answers = at_once(calls)
    assert [r.status_code for r in answers] == [200, 200, 401, 200, 401], [r.text for r in answers]
    assert [r.json() for r in answers[:2]] == [
        {"node": "gpu-1", "state": "ready", "desired_version": 1},
        {"node": "gpu-2", "state": "ready", "desired_version": 1},
    ]
    assert "unknown node token" in answers[2].json()["detail"]
    assert Card.objects.filter(node=one).count() == 2
    for n in (one, two):
        assert Node.objects.get(pk=n.pk).last_heartbeat > n.last_heartbeat
    # The changed inventory is the node's now: its next heartbeat is a stamp again.
    again = beat(token_one, inventory([H100, H100], hostname="gpu-1"))
    assert again.status_code == 200 and "allow" not in again.headers


@batched
def test_a_node_back_in_a_batched_heartbeat_has_the_reconciler_place_on_it(
    embedded_loop: None,  # noqa: F811
) -> None:
    """The loop's interval is an hour: a replica placed within the wait was placed
    because the heartbeat that brought its node back woke the reconciler."""
    _, token = join_node("n1", [H100, H100])
    assert beat(token, inventory([H100, H100], hostname="n1")).status_code == 200
    node = Node.objects.get(name="n1")
    Node.objects.filter(pk=node.pk).update(health=NodeHealth.LOST, reason="not heard from")
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    waiting = Replica.objects.filter(model_name="chat", unplaced=True)
    wait_for(waiting.exists, 20, "the replica waiting (its only node lost)")
    assert beat(token, inventory([H100, H100], hostname="n1")).status_code == 200
    wait_for(placed_on("chat", "n1"), 20, "the replica placed on the node back")


@batched
def test_a_batch_the_database_is_too_slow_for_answers_503_and_writes_no_call_it_had_not_taken(
    settings: Any,
) -> None:
    (one, token_one), (two, token_two) = heard("gpu-1"), heard("gpu-2")
    inv_one, inv_two = inventory([H100], hostname="gpu-1"), inventory([H100], hostname="gpu-2")
    settings.LLMGW_DB_CONNECT_TIMEOUT = 0.5  # the longest a call waits for its batch
    with ThreadPoolExecutor(2) as pool, transaction.atomic():
        Node.objects.select_for_update().get(pk=one.pk)  # the database "slow" for gpu-1
        first = pool.submit(beat, token_one, inv_one)
        wait_until(batch_waiting_on_a_lock, 10, "the batch waiting on gpu-1's row")
        # Queued behind the batch under way, not taken into it.
        second = pool.submit(beat, token_two, inv_two)
        slow = [first.result(timeout=10), second.result(timeout=10)]
    for r in slow:
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "5" and "did not answer in time" in r.json()["detail"]
    # The batch taken writes gpu-1's stamp once the row is free; gpu-2's call, given up
    # before it was taken, is never written.
    wait_for(lambda: Node.objects.get(pk=one.pk).last_heartbeat > one.last_heartbeat, 10, "gpu-1")
    assert Node.objects.get(pk=two.pk).last_heartbeat == two.last_heartbeat
    r = beat(token_two, inv_two)
    assert r.status_code == 200 and "allow" not in r.headers
    assert Node.objects.get(pk=two.pk).last_heartbeat > two.last_heartbeat


@batched
def test_a_batch_whose_connection_breaks_leaves_each_call_to_the_api_view() -> None:
    node, token = heard("gpu-1")
    inv = inventory([H100], hostname="gpu-1")
    with ThreadPoolExecutor(1) as pool:
        with transaction.atomic():
            Node.objects.select_for_update().get(pk=node.pk)
            answer = pool.submit(beat, token, inv)
            pid = wait_until(batch_waiting_on_a_lock, 10, "the batch waiting on the row")
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        r = answer.result(timeout=20)
    # The API view answered it (DRF says Allow), and recorded it.
    assert r.status_code == 200 and "allow" in r.headers, r.text
    assert r.json() == {"node": "gpu-1", "state": "ready", "desired_version": 1}
    stamped = Node.objects.get(pk=node.pk).last_heartbeat
    assert stamped > node.last_heartbeat
    # The next batch takes a new connection.
    r = beat(token, inv)
    assert r.status_code == 200 and "allow" not in r.headers
    assert Node.objects.get(pk=node.pk).last_heartbeat > stamped
