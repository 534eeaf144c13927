"""A node joining the cluster with a join token, being released or reclaimed, the address
its engines are reached at, and the node a node token speaks for.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from catalog.rules.names import bad_character, name_problem, shown
from cluster import wake
from cluster.address import check_allowed
from cluster.agentinput import AgentError, apply_inventory, read_inventory
from cluster.choices import NodeHealth
from cluster.desired import bump_desired
from cluster.models import (
    NODE_PREFIX,
    Assignment,
    JoinToken,
    Node,
    Replica,
    token_digest,
)
from cluster.services import log_action, refresh_replica_state
from llmgw_core import events


def released_reason(actor: str) -> str:
    """Return the reason a released node is shown with."""
    return f"released by {actor}: the next join under this name takes it"


@transaction.atomic
def join(
    token_secret: Any,
    name: Any,
    inventory: Any,
    *,
    node_token: Any = None,
    address: str = "",
) -> tuple[Node, str]:
    """Admit a node with a join token; return it and its new node token.

    A join token admits a node under a new name, or one an operator released (``release``);
    a node that has joined is joined again only with its own node token (``node_token``).
    ``address`` is where the request came from (cluster.address.peer_address): the node's
    engines are reached there, whatever the inventory's ``hostname`` says.
    """
    if not isinstance(token_secret, str) or not token_secret:
        raise AgentError("a join token is required", 401)
    token = JoinToken.objects.select_for_update().filter(digest=token_digest(token_secret)).first()
    if token is None:
        raise AgentError("unknown join token", 401)
    problem = token.problem()
    if problem:
        raise AgentError(problem, 401)
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise AgentError("name must be the node's name, 1 to 200 characters")
    if bad := bad_character(name) or next((f'"{c}"' for c in name if c in "<>\"&'`"), None):
        raise AgentError(
            f"name holds {bad}: a node's name is one line of visible text (pages, logs and "
            "metrics show it); join under a name of letters, digits and . _ -"
        )
    name = name.strip()
    if why := name_problem(name):
        raise AgentError(
            f'node name "{shown(name)}" {why} (node names follow the catalog\'s name '
            "grammar: docs/cluster.md)"
        )
    fields = read_inventory(inventory)
    node = Node.objects.select_for_update().filter(name__iexact=name).first()
    if node is not None and node.name != name:
        raise AgentError(
            f"node {node.name} is this name in another case: node names are unique without "
            f"regard to case; join as {node.name} (with its node token, or after an operator "
            "releases it) or under a new name",
            409,
        )
    if node is None:
        node = Node(name=name)
    elif node.token_digest is not None and not (
        isinstance(node_token, str) and token_digest(node_token) == node.token_digest
    ):
        raise AgentError(
            f"node {name} has already joined, and only its own agent (with its node token) "
            "joins as it again: join this machine under a new name, or have an operator "
            f"release {name} first (the console's node card, POST "
            f"/api/v1/cluster/nodes/{name}/release/, or manage.py cluster node release {name})",
            409,
        )
    secret = node.issue_token()
    node.health = NodeHealth.READY
    node.last_heartbeat = timezone.now()
    node.reason = "joined"
    node.address = address[:100]
    apply_inventory(node, fields)
    JoinToken.objects.filter(pk=token.pk).update(uses=F("uses") + 1)
    wake.reconcile_soon()  # replicas waiting for room may fit on it
    return node, secret


@transaction.atomic
def release(node: Node, actor: str) -> Node:
    """Let the next join under this node's name take it: its node token stops working.

    The agent holding the token is refused from its next call on. What the node runs
    is kept: the machine that joins under the name next is given it.
    """
    Node.objects.filter(pk=node.pk).update(
        token_digest=None,
        health=NodeHealth.NOT_READY,
        inventory_digest="",
        reason=released_reason(actor),
    )
    events.changed(nodes=[node.pk])
    node.refresh_from_db()
    return node


def reclaim(name: str, actor: str) -> bool:
    """Release the node called ``name`` for an agent of this installation that lost its
    node token (its state folder was removed); return whether there was one.

    For ``serve``'s own agents only (the local agent, the simulated nodes): whoever runs
    ``serve`` holds the database, which is an operator's say. Logged as ``actor``.
    """
    node = Node.objects.filter(name=name, token_digest__isnull=False).first()
    if node is None:
        return False
    release(node, actor)
    who = SimpleNamespace(username=actor, pk=None)
    log_action(who, "release", f"node {name}", "its agent had no node token (state removed)")
    return True


@transaction.atomic
def allow_address(node: Node, address: str) -> Node:
    """Reach this node's engines at ``address`` (empty: where its requests come from).

    Raises:
        AgentError: not an IP address or host name.
    """
    address = address.strip()
    why = check_allowed(address)
    if why:
        raise AgentError(f"address: {why}")
    Node.objects.filter(pk=node.pk).update(allowed_address=address)
    node.refresh_from_db()
    # Its replicas' endpoints, and the leader the other ranks of its multi-node ones meet.
    led = list(Assignment.objects.filter(node=node, rank=0).values_list("replica_id", flat=True))
    for r in Replica.objects.filter(pk__in=led):
        refresh_replica_state(r)
    bump_desired(
        Assignment.objects.filter(replica_id__in=led, rank__gt=0).values_list("node_id", flat=True)
    )
    events.changed(nodes=[node.pk])
    return node


def node_for_token(secret: str) -> Node | None:
    """Return the node a node token speaks for, or None."""
    if not secret.startswith(NODE_PREFIX):
        return None
    return Node.objects.filter(token_digest=token_digest(secret)).first()
