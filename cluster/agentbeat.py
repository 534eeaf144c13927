"""An agent's heartbeat (its inventory, a lost node back ready) and the desired list it
reads (docs/agent-protocol.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from catalog import rules
from catalog.convert import CHILD_GROUPS
from cluster import wake
from cluster.address import host_port
from cluster.agentinput import (
    inventory_digest,
    read_card_use,
    read_inventory,
    sync_cards,
    whole_number,
)
from cluster.agentjoin import node_for_token
from cluster.choices import NodeHealth
from cluster.enginekeys import engine_key
from cluster.models import (
    NODE_PREFIX,
    Assignment,
    Card,
    Node,
    Replica,
    token_digest,
)
from cluster.services import refresh_replica_state
from llmgw_core import events

# The reason a lost node is shown with once its agent is heard from again.
BACK = "heard from again"


def heartbeat(node: Node, inventory: Any, address: str = "") -> Node:
    """Record a heartbeat with the node's inventory; a lost node comes back ready.

    The hot path of every agent every few seconds (bench/agents.py): an inventory whose
    digest is the stored one only stamps the heartbeat (and the free disk) in one UPDATE;
    a changed one is read, and what changed written in one transaction, the cards only
    when they differ.
    """
    digest = inventory_digest(inventory)
    if digest and digest == node.inventory_digest:
        changes: dict[str, Any] = {}
        disk = whole_number(inventory.get("disk_free_mb"), "inventory.disk_free_mb")
        if disk != node.disk_free_mb:
            changes["disk_free_mb"] = disk
        use = read_card_use(inventory)
        if use is not None and use != node.card_use:
            changes["card_use"] = use
        cards = None
    else:
        fields = read_inventory(inventory)
        cards = fields.pop("cards")
        changes = {k: v for k, v in fields.items() if getattr(node, k) != v}
    if address and address[:100] != node.address:
        # The node moved (or is heard through another route): its engines are reached there.
        changes["address"] = address[:100]
    if node.health != NodeHealth.READY:
        changes["health"] = NodeHealth.READY
        changes["reason"] = BACK if node.health == NodeHealth.LOST else ""
        wake.reconcile_soon()  # back: replicas waiting for room may fit on it
    changes["last_heartbeat"] = timezone.now()
    with transaction.atomic():
        _commit_lazily()
        Node.objects.filter(pk=node.pk).update(**changes)
        if cards is not None:
            existing = {
                c["index"]: c
                for c in Card.objects.filter(node=node).values(
                    "index", "gpu_class", "memory_mb", "power_limit_w", "uuid", "mig_of"
                )
            }
            if existing != {c["index"]: c for c in cards}:
                sync_cards(node, cards)
        if set(changes) - {"last_heartbeat", "disk_free_mb", "inventory_digest", "card_use"}:
            # What the console shows changed: the node came back, or its inventory did.
            events.changed(nodes=[node.pk])
    for key, value in changes.items():
        setattr(node, key, value)
    if "address" in changes:
        led = Assignment.objects.filter(node=node, rank=0).values_list("replica_id", flat=True)
        for r in Replica.objects.filter(pk__in=list(led)):
            refresh_replica_state(r)
    return node


def _commit_lazily() -> None:
    """Let the current transaction commit without waiting for the disk (PostgreSQL).

    For heartbeats only: a crash of the database may lose its last fraction of a second
    of them (never half of one), and the next heartbeats bring the same again. Waiting
    for the write-ahead log to be flushed cost 4 to 8 ms a heartbeat on these disks, and
    seconds while other work flushed (bench/agents.py).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


@dataclass(frozen=True)
class Beat:
    """What a heartbeat recorded, and the agent's answer (docs/agent-protocol.md)."""

    node_id: int
    node: str
    cordoned: bool
    desired_version: int
    # The node's health before this heartbeat: not "ready" means it came back.
    was: str

    def answer(self) -> dict[str, Any]:
        """Return the heartbeat's answer to the agent."""
        return {
            "node": self.node,
            "state": "cordoned" if self.cordoned else "ready",
            "desired_version": self.desired_version,
        }


def heartbeat_by_token(secret: str, inventory: Any, address: str = "") -> Beat | None:
    """Record a heartbeat from whoever holds this node token; None if it is no node's.

    ``address`` is where it came from; a node heard from another address than before
    takes step 2, which records it.

    The lean path's service (cluster.api.heartbeat):

    1. An unchanged inventory (its digest is the node's): one UPDATE, a batch of one
       (:func:`write_stamps`), which also proves the token, since it names the node by
       the token's hash (PostgreSQL; the embedded SQLite takes step 2, where the same
       digest spares the reading).
    2. Otherwise the node is found by its token and :func:`heartbeat` applies the
       inventory; a bad one raises AgentError and changes nothing.
    """
    if not secret.startswith(NODE_PREFIX):
        return None
    if connection.vendor == "postgresql":
        # A bad cards_use or free disk raises here: refused before anything is written.
        stamp = stamp_of(secret, inventory, address)
        if stamp is not None:
            beat = write_stamps([stamp]).get(0)
            if beat is not None:
                return beat
    return heartbeat_changed(secret, inventory, address)


def heartbeat_changed(secret: str, inventory: Any, address: str = "") -> Beat | None:
    """Step 2 of :func:`heartbeat_by_token`: find the node by its token and apply the
    inventory (a bad one raises AgentError and changes nothing); None if it is no node's."""
    node = node_for_token(secret)
    if node is None:
        return None
    was = node.health
    node = heartbeat(node, inventory, address)
    return Beat(node.pk, node.name, node.cordoned, node.desired_version, was)


@dataclass(frozen=True)
class Stamp:
    """One heartbeat of an unchanged inventory, read and checked, waiting to be written
    with others (cluster.beatwriter): what :data:`_BEATS_SQL` matches and writes."""

    token: str  # the node token's digest
    digest: str  # the inventory's (cluster.agentinput.inventory_digest)
    address: str  # where it came from, cut to the column
    disk: int
    use: dict[str, Any] | None  # cards_use as read; None keeps what was held


# Many heartbeats of unchanged inventories in one statement, one round trip: find each
# node by its token and that digest, stamp it, bring it back ready if it was not, and
# answer. ``lazily`` lets the statement's transaction commit without waiting for the disk
# (as _commit_lazily does, without a round trip of its own). A row matches a node by its
# token's hash, its digest and its address, so one that does not (a changed inventory, a
# new address, no node's token) is left out of the answer and takes heartbeat_changed.
# ``before`` locks the rows, in the nodes' order (so two processes' batches never wait on
# each other in a cycle), and reads their health under the lock, so it is the latest: the
# reconciler may be marking a node lost at the same moment. Each node is found through
# its token's index (``found``, a lookup a row), and locked through the primary key's:
# joined to the JSON rows, whose count the planner guesses at 100, the node table was
# read whole every batch (2.6 ms of PostgreSQL's CPU for a batch of one at 5,000 nodes,
# 0.6 ms this way).
_BEATS_SQL = f"""
WITH lazily AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), v AS (
    SELECT * FROM json_to_recordset(%(rows)s::json)
        AS v(k int, token text, digest text, address text, disk bigint, use jsonb)
), found AS (
    SELECT f.id, v.k, v.digest, v.address, v.disk, v.use FROM v CROSS JOIN LATERAL (
        SELECT id FROM {Node._meta.db_table} WHERE token_digest = v.token LIMIT 1
    ) AS f
), before AS (
    SELECT n.id, n.health, found.k, found.disk, found.use FROM {Node._meta.db_table} AS n
    JOIN found ON found.id = n.id
    WHERE n.id = ANY(ARRAY(SELECT id FROM found))
        AND n.inventory_digest = found.digest AND n.address = found.address
    ORDER BY n.id
    FOR UPDATE OF n
)
UPDATE {Node._meta.db_table} AS n
SET last_heartbeat = %(now)s,
    disk_free_mb = before.disk,
    card_use = COALESCE(before.use, n.card_use),
    health = %(ready)s,
    reason = CASE
        WHEN before.health = %(ready)s THEN n.reason
        WHEN before.health = %(lost)s THEN %(back)s
        ELSE ''
    END
FROM before, lazily
WHERE n.id = before.id AND lazily.done IS NOT NULL
RETURNING before.k, n.id, n.name, n.cordoned, n.desired_version, before.health
"""


def write_stamps(stamps: list[Stamp]) -> dict[int, Beat]:
    """Write these heartbeats in one statement (PostgreSQL); return each written one's
    Beat by its place in ``stamps``. One missing was not written: its node is found
    otherwise (heartbeat_changed). A node brought back ready is told to the consoles and
    wakes the reconciler, as heartbeat_by_token does. Each token must appear once.
    """
    if not stamps:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _BEATS_SQL,
            {
                # One parameter, read by the server: cheaper here than an array each.
                "rows": json.dumps(
                    [
                        {
                            "k": k,
                            "token": s.token,
                            "digest": s.digest,
                            "address": s.address,
                            "disk": s.disk,
                            "use": s.use,
                        }
                        for k, s in enumerate(stamps)
                    ],
                    separators=(",", ":"),
                ),
                "now": timezone.now(),
                "ready": NodeHealth.READY.value,
                "lost": NodeHealth.LOST.value,
                "back": BACK,
            },
        )
        rows = cursor.fetchall()
    beats = {row[0]: Beat(*row[1:]) for row in rows}
    back = [b.node_id for b in beats.values() if b.was != NodeHealth.READY]
    if back:
        events.changed(nodes=back)
        wake.reconcile_soon()
    return beats


def stamp_of(secret: str, inventory: Any, address: str) -> Stamp | None:
    """Read a heartbeat for :func:`write_stamps`: None when it is not one a batch can
    write (no node token's form, an inventory with no digest); a bad ``cards_use`` or
    ``disk_free_mb`` raises AgentError (the heartbeat is refused, nothing written)."""
    if not secret.startswith(NODE_PREFIX) or not isinstance(inventory, dict):
        return None
    digest = inventory_digest(inventory)
    if not digest:
        return None
    use = read_card_use(inventory)
    disk = whole_number(inventory.get("disk_free_mb"), "inventory.disk_free_mb")
    return Stamp(token_digest(secret), digest, address[:100], disk, use)


# The nodes of many node tokens' hashes in one statement, each with its desired list's
# version and whether anything is assigned to it (a node with nothing has the empty list).
# Each found through its token's index, as _BEATS_SQL's ``found`` is.
_NODES_SQL = f"""
SELECT t.k, n.id, n.desired_version,
    EXISTS (SELECT 1 FROM {Assignment._meta.db_table} AS a WHERE a.node_id = n.id)
FROM json_to_recordset(%(rows)s::json) AS t(k int, token text) CROSS JOIN LATERAL (
    SELECT id, desired_version FROM {Node._meta.db_table} WHERE token_digest = t.token LIMIT 1
) AS n
"""


def nodes_by_token(digests: list[str]) -> dict[int, tuple[int, int, bool]]:
    """Return, by its place in ``digests`` (node tokens' hashes), each known token's node
    id, desired list's version and whether anything is assigned to it (PostgreSQL)."""
    if not digests:
        return {}
    with connection.cursor() as cursor:
        rows = [{"k": k, "token": t} for k, t in enumerate(digests)]
        cursor.execute(_NODES_SQL, {"rows": json.dumps(rows, separators=(",", ":"))})
        return {k: (pk, version, assigned) for k, pk, version, assigned in cursor.fetchall()}


def desired_list(node: Node) -> dict[str, Any]:
    """Return the replicas this node should run now (docs/agent-protocol.md)."""
    assignments = (
        # A draining replica's engine runs on until its requests in flight are done.
        Assignment.objects.filter(
            Q(replica__desired=True) | Q(replica__drain_until__isnull=False), node=node
        )
        .select_related("replica", "replica__model")
        # The models' rows in a fixed few queries, however many replicas the node runs.
        .prefetch_related(*(f"replica__model__{group}" for group in CHILD_GROUPS))
        .order_by("replica_id", "rank")
    )
    replicas = []
    leaders = _leaders(a.replica_id for a in assignments)
    for a in assignments:
        r = a.replica
        served = r.model
        if served is None:
            continue
        m = served.to_spec()
        profile = rules.profile_by_name(m, r.profile)
        if profile is None:
            continue
        origin = m.origin
        sha = origin.files[0].sha256 if origin and len(origin.files) == 1 else None
        replicas.append(
            {
                "id": r.pk,
                "generation": r.generation,
                "model": m.name,
                "profile": profile.name,
                "fingerprint": r.fingerprint,
                "engine": profile.engine,
                "engine_version": profile.engine_version,
                "source": m.source,
                "served_name": m.name,
                "args": list(profile.args),
                "env": dict(profile.env),
                "tp": profile.tp,
                "pp": profile.pp,
                "gpus_per_node": profile.gpus_per_node,
                "nodes": profile.nodes,
                "rank": a.rank,
                "leader": leaders.get(r.pk) if a.rank > 0 else None,
                "cards": list(a.cards),
                "cpu_cores": a.cpu_cores,
                "adapters": [
                    {"name": ad.name, "source": ad.source, "scale": rules.effective_scale(ad)}
                    for ad in m.adapters
                ],
                "max_loaded_adapters": m.max_loaded_adapters,
                "rerank": m.capabilities.rerank,
                "trust_remote_code": m.trust_remote_code,
                "kv_events": profile.kv_events,
                "startup_timeout_s": profile.startup_timeout / 1e9,
                "sha256": sha or None,
                "context_length": m.context_length,
                "guard": (
                    {"format": m.guard.format, "categories": list(m.guard.categories)}
                    if m.guard
                    else None
                ),
                # What its engine asks of every caller (cluster.enginekeys): told to this
                # node only, over its node token's channel.
                "engine_key": engine_key(r.pk),
            }
        )
    return {"version": node.desired_version, "replicas": replicas}


def _leaders(replica_ids: Iterable[int]) -> dict[int, str]:
    ids = set(replica_ids)
    out: dict[int, str] = {}
    if not ids:
        # A node running nothing: spare building a query that would fetch nothing.
        return out
    for a in Assignment.objects.filter(replica_id__in=ids, rank=0).select_related("node"):
        out[a.replica_id] = host_port(a.node.host, a.port)
    return out
