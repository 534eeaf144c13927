"""What a node's page and a replica's log show, read once for the console and the API.

``node_detail`` gathers a node's cards (with the replica holding each, and what each uses
as the last heartbeat said: memory used, utilisation), the replicas it runs (its share of each: rank, cards, state, reason) and its
agent's version; ``replica_log`` a replica's engine log as each of its nodes' agents last
reported it (docs/agent-protocol.md, "report"). The log is for operators only, as the
detail of a reason is (cluster.reasons): an engine's output names paths and hosts.
"""

from __future__ import annotations

from typing import Any

from cluster import reasons
from cluster.models import Assignment, Node, Replica


def node_detail(node: Node, operator: bool) -> dict[str, Any]:
    """Return a node's cards and replicas as plain data (two queries)."""
    shares = list(
        Assignment.objects.filter(node=node)
        .select_related("replica")
        .order_by("replica__model_name", "replica_id", "rank")
    )
    held: dict[int, Assignment] = {}
    for a in shares:
        if a.replica.desired:
            for index in a.cards:
                held[index] = a
    cards = []
    # What each card uses, as the node's last heartbeat said (none: its agent did not).
    use = node.card_use or {}
    for c in sorted(node.cards.all(), key=lambda c: c.index):
        a = held.get(c.index)
        now = use.get(str(c.index)) or {}
        cards.append(
            {
                "index": c.index,
                "gpu_class": c.gpu_class,
                "memory_mb": c.memory_mb,
                "power_limit_w": c.power_limit_w,
                "uuid": c.uuid,
                "mig_of": c.mig_of,
                "memory_used_mb": now.get("memory_used_mb"),
                "utilization": now.get("utilization"),
                "replica": a.replica_id if a is not None else None,
                "model": a.replica.model_name if a is not None else None,
            }
        )
    replicas = [
        {
            "replica": a.replica_id,
            "model": a.replica.model_name,
            "profile": a.replica.profile,
            "generation": a.replica.generation,
            "desired": a.replica.desired,
            "rank": a.rank,
            "cards": list(a.cards),
            "host_memory_mb": a.memory_mb,
            "state": a.state,
            "reason": reasons.for_role(a.reason, operator),
            "port": a.port,
            "pid": a.pid,
            "restarts": a.replica.restarts,
            "reported": a.reported,
            "log_lines": len(a.log),
        }
        for a in shares
    ]
    return {"cards": cards, "replicas": replicas}


def replica_log(replica: Replica) -> list[dict[str, Any]]:
    """Return a replica's engine log on each of its nodes (rank order)."""
    return [
        {
            "node": a.node.name,
            "node_id": a.node_id,
            "rank": a.rank,
            "state": a.state,
            "reported": a.reported,
            "lines": list(a.log),
        }
        for a in replica.assignments.select_related("node").order_by("rank")
    ]
