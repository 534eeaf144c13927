"""Cluster operations: the agents' side (join, heartbeat, desired list, reports) and the
operators' (cordon, drain, restart, roll, demand). Used by the API views and commands.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from catalog import rules
from catalog.convert import CHILD_GROUPS
from catalog.models import ServedModel
from cluster import wake
from cluster.address import check_allowed, host_port
from cluster.choices import NodeHealth, ReplicaState
from cluster.enginekeys import engine_key
from cluster.models import (
    NODE_PREFIX,
    Assignment,
    Card,
    ClusterAction,
    JoinToken,
    ModelDemand,
    Node,
    Replica,
    token_digest,
)
from cluster.reasons import public as public_reason
from llmgw_core import events

STATES = {s.value for s in ReplicaState}


class AgentError(Exception):
    """A request from an agent that cannot be applied; ``status`` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# The largest values the database's columns hold.
INT32 = 2**31 - 1
INT64 = 2**63 - 1


def _whole(value: Any, where: str, hi: int = INT64, default: int | None = 0) -> Any:
    """A whole number an agent reports, from 0 to ``hi``; missing or null is ``default``.

    A float is taken whole (some tools report memory as one); anything else, or a number
    outside what the column holds, raises AgentError naming ``where``.
    """
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= hi  # NaN fails this too
    ):
        raise AgentError(f"{where} must be a whole number from 0 to {hi}, not {value!r:.40}")
    return int(value)


def _watts(value: Any, where: str) -> float:
    """A card's power limit in watts, from 0 to a megawatt; missing or null is 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e6:
        raise AgentError(f"{where} must be a number of watts from 0 to 1000000, not {value!r:.40}")
    return float(value)


# What an inventory carries that changes while nothing about the node does: left out of
# its digest, and written by every heartbeat.
VOLATILE = ("disk_free_mb", "cards_use")


def inventory_digest(inv: Any) -> str:
    """Return the digest of an inventory as sent, its volatile values left out.

    Used by heartbeat: a node whose stored digest is this one already has the fields and
    cards this inventory gives, so they are neither read nor compared again. The digest
    is the control plane's own (canonical JSON), so any agent, old or new, benefits.
    """
    if not isinstance(inv, dict):
        return ""
    stable = {k: v for k, v in inv.items() if k not in VOLATILE}
    text = json.dumps(stable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def read_inventory(inv: Any) -> dict[str, Any]:
    """Return the node fields of an agent's inventory, or raise AgentError naming the fault.

    The inventory comes from a machine, not a person, but a bad one must still change
    nothing and say what is wrong.
    """
    if not isinstance(inv, dict):
        raise AgentError("inventory must be a JSON object (docs/agent-protocol.md)")
    cards = inv.get("cards", [])
    if not isinstance(cards, list):
        raise AgentError("inventory.cards must be a list")
    seen: set[int] = set()
    clean_cards = []
    for i, c in enumerate(cards):
        if (
            not isinstance(c, dict)
            or not isinstance(c.get("index"), int)
            or not isinstance(c.get("class"), str)
        ):
            raise AgentError(f"inventory.cards[{i}] needs an integer index and a class")
        index = _whole(c["index"], f"inventory.cards[{i}].index", INT32)
        if index in seen:
            raise AgentError(f"inventory.cards[{i}]: index {index} is listed twice")
        seen.add(index)
        clean_cards.append(
            {
                "index": index,
                "gpu_class": c["class"].strip().lower()[:100],
                "memory_mb": _whole(c.get("memory_mb"), f"inventory.cards[{i}].memory_mb"),
                "power_limit_w": _watts(
                    c.get("power_limit_w"), f"inventory.cards[{i}].power_limit_w"
                ),
                "uuid": str(c.get("uuid") or "")[:200],
                "mig_of": _whole(c.get("mig_of"), f"inventory.cards[{i}].mig_of", INT32, None),
            }
        )
    for key in ("labels", "engines"):
        value = inv.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise AgentError(f"inventory.{key} must map text to text")
    weights = inv.get("weights", [])
    if not isinstance(weights, list) or not all(isinstance(w, str) for w in weights):
        raise AgentError("inventory.weights must be a list of sources")
    use = read_card_use(inv)
    return {
        **({"card_use": use} if use is not None else {}),
        "hostname": str(inv.get("hostname") or "")[:200],
        "agent_version": str(inv.get("agent_version") or "")[:50],
        "cpu_cores": _whole(inv.get("cpu_cores"), "inventory.cpu_cores", INT32),
        "memory_mb": _whole(inv.get("memory_mb"), "inventory.memory_mb"),
        "disk_free_mb": _whole(inv.get("disk_free_mb"), "inventory.disk_free_mb"),
        "labels": inv.get("labels", {}),
        "engines": inv.get("engines", {}),
        "weights": weights,
        "simulated": bool(inv.get("simulated", False)),
        "cards": clean_cards,
        "inventory_digest": inventory_digest(inv),
    }


def read_card_use(inv: Any) -> dict[str, dict[str, int | None]] | None:
    """Return what each card uses as an inventory's ``cards_use`` says (docs/agent-protocol.md),
    by card index as text; None when it says nothing (an older agent: what was held stays).

    Each entry names a card of the inventory's ``cards`` once; ``memory_used_mb`` is a whole
    number up to that card's ``memory_mb`` and ``utilization`` a percent from 0 to 100,
    each or null (the card cannot say). Anything else raises AgentError naming the field:
    the heartbeat is refused and nothing of it is written.
    """
    if not isinstance(inv, dict) or "cards_use" not in inv:
        return None
    use = inv["cards_use"]
    if not isinstance(use, list):
        raise AgentError("inventory.cards_use must be a list (docs/agent-protocol.md)")
    sizes = {
        c["index"]: c.get("memory_mb")
        for c in inv.get("cards") or ()
        if isinstance(c, dict) and isinstance(c.get("index"), int)
    }
    out: dict[str, dict[str, int | None]] = {}
    for i, u in enumerate(use):
        where = f"inventory.cards_use[{i}]"
        if not isinstance(u, dict) or isinstance(u.get("index"), bool):
            raise AgentError(f"{where} must be an object with a card's index")
        index = u.get("index")
        if not isinstance(index, int) or index not in sizes:  # a list is no key: not a 500
            raise AgentError(
                f"{where}.index must be the index of one of inventory.cards "
                f"({', '.join(map(str, sorted(sizes))) or 'none'}), not {index!r:.40}"
            )
        if str(index) in out:
            raise AgentError(f"{where}: card {index} is listed twice")
        size = sizes[index]
        top = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else INT64
        memory = _whole(u.get("memory_used_mb"), f"{where}.memory_used_mb", top, None)
        busy = u.get("utilization")
        if busy is not None and (
            isinstance(busy, bool) or not isinstance(busy, int | float) or not 0 <= busy <= 100
        ):
            raise AgentError(
                f"{where}.utilization must be a percent from 0 to 100, not {busy!r:.40}"
            )
        out[str(index)] = {
            "memory_used_mb": memory,
            "utilization": None if busy is None else round(busy),
        }
    return out


def _apply_inventory(node: Node, fields: dict[str, Any]) -> None:
    cards = fields.pop("cards")
    for key, value in fields.items():
        setattr(node, key, value)
    node.save()
    _sync_cards(node, cards)


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
    fields = read_inventory(inventory)
    name = name.strip()
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
    _apply_inventory(node, fields)
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
        disk = _whole(inventory.get("disk_free_mb"), "inventory.disk_free_mb")
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
                _sync_cards(node, cards)
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


# One statement, one round trip, for a heartbeat whose inventory is the one last applied:
# find the node by its token and that digest, stamp it, bring it back ready if it was not,
# and answer. ``lazily`` lets the statement's transaction commit without waiting for the
# disk (as _commit_lazily does, without a round trip of its own). ``before`` locks the row
# first, so the health it reads is the latest: the reconciler may be marking the node lost
# at the same moment.
_BEAT_SQL = f"""
WITH lazily AS (
    SELECT set_config('synchronous_commit', 'off', true) AS done
), before AS (
    SELECT id, health FROM {Node._meta.db_table}
    WHERE token_digest = %(token)s AND inventory_digest = %(digest)s
        AND address = %(address)s
    FOR UPDATE
)
UPDATE {Node._meta.db_table} AS n
SET last_heartbeat = %(now)s,
    disk_free_mb = %(disk)s,
    card_use = COALESCE(%(use)s::jsonb, n.card_use),
    health = %(ready)s,
    reason = CASE
        WHEN before.health = %(ready)s THEN n.reason
        WHEN before.health = %(lost)s THEN %(back)s
        ELSE ''
    END
FROM before, lazily
WHERE n.id = before.id AND lazily.done IS NOT NULL
RETURNING n.id, n.name, n.cordoned, n.desired_version, before.health
"""


def heartbeat_by_token(secret: str, inventory: Any, address: str = "") -> Beat | None:
    """Record a heartbeat from whoever holds this node token; None if it is no node's.

    ``address`` is where it came from; a node heard from another address than before
    takes step 2, which records it.

    The lean path's service (cluster.api.heartbeat):

    1. An unchanged inventory (its digest is the node's): one UPDATE, which also proves
       the token, since it names the node by the token's hash (PostgreSQL; the embedded
       SQLite takes step 2, where the same digest spares the reading).
    2. Otherwise the node is found by its token and :func:`heartbeat` applies the
       inventory; a bad one raises AgentError and changes nothing.
    """
    if not secret.startswith(NODE_PREFIX):
        return None
    digest = inventory_digest(inventory)
    # Checked first: a bad one refuses the heartbeat before anything is written.
    use = read_card_use(inventory) if isinstance(inventory, dict) else None
    if digest and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                _BEAT_SQL,
                {
                    "token": token_digest(secret),
                    "digest": digest,
                    "address": address[:100],
                    "now": timezone.now(),
                    "disk": _whole(inventory.get("disk_free_mb"), "inventory.disk_free_mb"),
                    "use": None if use is None else json.dumps(use),
                    "ready": NodeHealth.READY.value,
                    "lost": NodeHealth.LOST.value,
                    "back": BACK,
                },
            )
            row = cursor.fetchone()
        if row is not None:
            beat = Beat(*row)
            if beat.was != NodeHealth.READY:
                events.changed(nodes=[beat.node_id])
                wake.reconcile_soon()
            return beat
    node = node_for_token(secret)
    if node is None:
        return None
    was = node.health
    node = heartbeat(node, inventory, address)
    return Beat(node.pk, node.name, node.cordoned, node.desired_version, was)


def _sync_cards(node: Node, cards: list[dict[str, Any]]) -> None:
    existing = {c.index: c for c in Card.objects.filter(node=node)}
    for c in cards:
        current = existing.get(c["index"])
        if current is None:
            Card.objects.create(node=node, **c)
        elif any(getattr(current, k) != v for k, v in c.items()):
            Card.objects.filter(pk=current.pk).update(**c)
    gone = set(existing) - {c["index"] for c in cards}
    if gone:
        Card.objects.filter(node=node, index__in=gone).delete()


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


def read_report(i: int, rep: Any) -> tuple[dict[str, Any], str, datetime | None]:
    """Check ``reports[i]`` of an agent's report; return it clean, its state and time.

    Raises AgentError naming the field. Missing or null port, pid and restarts leave what
    is recorded; a missing time is the time it arrives.
    """
    where = f"reports[{i}]"
    if not isinstance(rep, dict):
        raise AgentError(f"{where} must be a JSON object (docs/agent-protocol.md)")
    replica = rep.get("replica")
    if isinstance(replica, bool) or not isinstance(replica, int) or not 0 < replica <= INT64:
        raise AgentError(f"{where} needs an integer replica")
    state = rep.get("state")
    if not isinstance(state, str) or state not in STATES:
        raise AgentError(f"{where}.state {state!r:.40} is not one of {', '.join(sorted(STATES))}")
    reason = rep.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise AgentError(f"{where}.reason must be text")
    progress = rep.get("progress")
    if progress is not None and (
        isinstance(progress, bool)
        or not isinstance(progress, int | float)
        or not 0 <= progress <= 1
    ):
        raise AgentError(f"{where}.progress must be a number from 0 to 1, or null")
    at = rep.get("at")
    when = None
    if at is not None:
        try:
            when = parse_datetime(at) if isinstance(at, str) else None
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise AgentError(
                f"{where}.at must be an ISO 8601 time with its offset, like {_EXAMPLE_AT}"
            )
    log_lines = rep.get("log")
    if log_lines is not None and (
        not isinstance(log_lines, list) or not all(isinstance(x, str) for x in log_lines)
    ):
        raise AgentError(f"{where}.log must be a list of text lines, or missing")
    clean = {
        "replica": replica,
        "log": None if log_lines is None else engine_log(log_lines),
        "reason": (reason or "")[:2000],
        "progress": None if progress is None else float(progress),
        "port": _whole(rep.get("port"), f"{where}.port", 65535, None),
        "pid": _whole(rep.get("pid"), f"{where}.pid", INT32, None),
        "restarts": _whole(rep.get("restarts"), f"{where}.restarts", INT32, None),
    }
    return clean, state, when


_EXAMPLE_AT = "2026-11-30T10:00:00Z"

# What is kept of an engine's log a report carries: the last lines, each cut to a length.
LOG_LINES = 40
LOG_LINE_CHARS = 300
# Any llmgw secret, masked again here (an older or altered agent may not mask it).
_SECRET = re.compile(r"llmgw_(?:engine|node|join|[a-z]+)_[A-Za-z0-9_\-]{8,}")


def engine_log(lines: list[str]) -> list[str]:
    """Return the part of a reported engine log that is kept: bounded, secrets masked."""
    return [_SECRET.sub("[secret]", line[:LOG_LINE_CHARS]) for line in lines[-LOG_LINES:]]


@transaction.atomic
def report(node: Node, reports: Any) -> int:
    """Apply an agent's state reports; refuse the whole batch if one is not its to give."""
    if not isinstance(reports, list):
        raise AgentError("reports must be a list")
    parsed = [read_report(i, rep) for i, rep in enumerate(reports)]
    ids = {rep["replica"] for rep, _, _ in parsed}
    assignments = {
        a.replica_id: a
        for a in Assignment.objects.select_for_update().filter(node=node, replica_id__in=ids)
    }
    foreign = ids - set(assignments)
    known_elsewhere = set(Replica.objects.filter(pk__in=foreign).values_list("pk", flat=True))
    if known_elsewhere:
        raise AgentError(
            f"replica {sorted(known_elsewhere)[0]} is not on node {node.name}: nothing applied",
            403,
        )
    touched: set[int] = set()
    for rep, state, at in parsed:
        a = assignments.get(rep["replica"])
        if a is None:
            # A replica deleted meanwhile: its engine is being stopped; nothing to record.
            continue
        port = rep["port"] if rep["port"] is not None else a.port
        pid = rep["pid"] if rep["pid"] is not None else a.pid
        r = a.replica
        same = (
            (a.state, a.reason, a.port, a.pid, r.progress)
            == (
                state,
                rep["reason"],
                port,
                pid,
                rep["progress"],
            )
            and rep["restarts"] in (None, r.restarts)
            and r.state == state
        )
        a.state = state
        a.reason = rep["reason"]
        a.port = port
        a.pid = pid
        a.reported = at or timezone.now()
        if rep["log"] is not None:
            a.log = rep["log"]
        if same:
            # Only the engine's log moved (a running engine's lines, every few seconds):
            # written without a save's signals, so no live event to every open dashboard.
            Assignment.objects.filter(pk=a.pk).update(reported=a.reported, log=a.log)
            continue
        a.save()
        r.progress = rep["progress"]
        if rep["restarts"] is not None:
            r.restarts = rep["restarts"]
        touched.add(r.pk)
        r.save(update_fields=["progress", "restarts"])
    for rid in touched:
        refresh_replica_state(Replica.objects.get(pk=rid))
    return len(parsed)


# How a multi-node replica's state is read from its ranks: the worst rank decides.
_SEVERITY = ["ready", "stopped", "stopping", "loading", "starting", "pending", "failed"]


def refresh_replica_state(r: Replica) -> None:
    """Set a replica's state from its assignments' (the worst rank's), with the reason."""
    ranks = list(r.assignments.select_related("node"))
    if not ranks:
        return
    worst = max(ranks, key=lambda a: _SEVERITY.index(a.state) if a.state in _SEVERITY else 0)
    # A replica's reason is shown to everyone: what failed, not an agent's detail.
    reason = public_reason(worst.reason)
    if len(ranks) > 1 and worst.reason:
        reason = f"{worst.node.name} (rank {worst.rank}): {reason}"
    leader = next((a for a in ranks if a.rank == 0), ranks[0])
    r.port = leader.port
    # Where the control plane sees the node, never what its inventory claims (cluster.address).
    r.endpoint = f"http://{host_port(leader.node.host, leader.port)}" if leader.port else ""
    if r.drain_until is not None and worst.state == ReplicaState.READY:
        # Draining: it still serves its requests in flight, but it is on its way out.
        worst_state, reason = ReplicaState.STOPPING, r.reason
    else:
        worst_state = worst.state
    r.set_state(worst_state, reason)
    if not r.desired and all(a.state == ReplicaState.STOPPED for a in ranks):
        # Stopped where it was asked to stop: nothing is left to track.
        r.delete()
        return
    r.save()


def bump_desired(node_ids: Iterable[int]) -> None:
    """Tell these nodes' agents their desired list changed (read again at once)."""
    ids = list(set(node_ids))
    if ids:
        Node.objects.filter(pk__in=ids).update(desired_version=F("desired_version") + 1)


@transaction.atomic
def set_cordon(node: Node, cordoned: bool) -> Node:
    """Cordon a node (keeps what it runs, gets nothing new) or uncordon it."""
    Node.objects.filter(pk=node.pk).update(cordoned=cordoned)
    events.changed(nodes=[node.pk])
    if not cordoned:
        wake.reconcile_soon()  # replicas waiting for room may fit on it again
    node.refresh_from_db()
    return node


def drain(node: Node, force: bool = False) -> Any:
    """Cordon a node and move its replicas off it, each replaced before it stops.

    Refused (``cluster.replace.DrainRefused``, nothing changed) when a model would be left
    with no ready replica, unless ``force``; see ``cluster.replace.drain``.
    """
    from cluster import replace

    return replace.drain(node, force)


def stop_replicas(
    ids: Iterable[int], reason: str, drain_s: float = 0.0, now: datetime | None = None
) -> None:
    """Mark replicas to be stopped; unplaced ones are simply removed.

    With ``drain_s``, a ready replica drains first: it leaves every gateway's table now
    (``desired`` false: the gateways read again on the change) while its engine runs on
    (its node's desired list keeps it until ``drain_until``), so the requests in flight
    finish; then ``end_drains`` takes it off the list and its agent stops the engine.
    """
    ids = list(ids)
    Replica.objects.filter(pk__in=ids, assignments__isnull=True).delete()
    nodes = set(Assignment.objects.filter(replica_id__in=ids).values_list("node_id", flat=True))
    until = (now or timezone.now()) + timedelta(seconds=drain_s) if drain_s > 0 else None
    for r in Replica.objects.filter(pk__in=ids):
        if until is not None and r.desired and r.state == ReplicaState.READY:
            r.drain_until = until
            reason = f"draining, then stopping: {reason}"
        r.desired = False
        r.set_state(ReplicaState.STOPPING, reason)
        r.save()
    bump_desired(nodes)


def end_drains(now: datetime | None = None) -> list[int]:
    """Stop the engines of the draining replicas whose grace is over; return them.

    Run by the reconciler each tick: they leave their nodes' desired lists (which keep
    every replica with a ``drain_until``) and their agents stop the engines."""
    done = list(
        Replica.objects.filter(drain_until__lte=now or timezone.now()).values_list("pk", flat=True)
    )
    if done:
        Replica.objects.filter(pk__in=done).update(drain_until=None)
        bump_desired(
            Assignment.objects.filter(replica_id__in=done).values_list("node_id", flat=True)
        )
    return done


@transaction.atomic
def restart_replica(replica: Replica) -> Replica:
    """Restart a replica: its agent sees a higher generation and restarts the engine.

    The engine starts again from the profile as it is now (the desired list carries the
    current definition), so the replica's fingerprint becomes the current one: it no
    longer shows as running an old definition.
    """
    fields: dict[str, Any] = {"generation": F("generation") + 1}
    served = ServedModel.objects.filter(name=replica.model_name).first()
    m = rules.normalize(served.to_spec()) if served else None
    profile = rules.profile_by_name(m, replica.profile) if m else None
    if profile is not None:
        fields["fingerprint"] = rules.fingerprint(profile)
    Replica.objects.filter(pk=replica.pk).update(**fields)
    events.changed(models=[replica.model_name])
    replica.refresh_from_db()
    bump_desired(replica.assignments.values_list("node_id", flat=True))
    return replica


@transaction.atomic
def roll(model_name: str, *, every: bool = False) -> list[int]:
    """Start a replacement for each replica running an old definition of its profile.

    The replacement is placed by the reconciler; once it is ready the old one is stopped
    (cluster.reconciler), so the model never has fewer ready replicas than before.
    ``every`` replaces every replica, whatever its definition: the model's weights
    changed (an update's promote or rollback, ``updates.run``), which no profile shows.
    """
    served = ServedModel.objects.filter(name=model_name).first()
    if served is None:
        raise AgentError(f"model {model_name!r} is not in the catalog", 404)
    m = rules.normalize(served.to_spec())
    current = {p.name: rules.fingerprint(p) for p in m.profiles}
    started = []
    for r in Replica.objects.filter(model_name=model_name, desired=True):
        if (current.get(r.profile) == r.fingerprint and not every) or r.replaces_id is not None:
            continue
        if Replica.objects.filter(replaces=r, desired=True).exists():
            continue
        new = Replica.objects.create(
            model=served, model_name=model_name, replaces=r, reason=f"rolling: replaces #{r.pk}"
        )
        started.append(new.pk)
    if started:
        wake.reconcile_soon()
    return started


def demand(model_name: str, at: datetime | None = None) -> ModelDemand:
    """Record that a model was asked for (an on-demand model is started for it)."""
    if not ServedModel.objects.filter(name=model_name).exists():
        raise AgentError(f"model {model_name!r} is not in the catalog", 404)
    obj, _ = ModelDemand.objects.update_or_create(
        model_name=model_name, defaults={"last_demand": at or timezone.now()}
    )
    if not Replica.objects.filter(model_name=model_name, desired=True).exists():
        wake.reconcile_soon()  # scaled to zero: start it now, not at the next tick
    return obj


def log_action(user: Any, action: str, target: str, detail: str = "", via: str = "") -> None:
    """Record an operator's action on the cluster with who did it."""
    name = getattr(user, "username", "") or "system"
    ClusterAction.objects.create(
        actor=user if getattr(user, "pk", None) else None,
        actor_name=f"{name} ({via})" if via else name,
        action=action,
        target=target,
        detail=detail,
    )


def outdated(replica: Replica, current: dict[str, str]) -> bool:
    """Return whether a replica runs an old definition of its profile."""
    want = current.get(replica.profile)
    return bool(replica.fingerprint) and want is not None and want != replica.fingerprint


__all__ = ("AgentError", "Q")


def no_room(models: Iterable[str] | None = None) -> dict[str, str]:
    """The models placement found no room for, with why: a wanted replica it tried to
    place and could not (``Replica.unplaced``), and none of the model's wanted replicas
    on a node (one there is starting and will be ready). Not a replica waiting for its
    first try, nor one released to be placed again. The gateway answers such a model at
    once, and the console's chat says so."""
    wanted = Replica.objects.filter(desired=True)
    if models is not None:
        wanted = wanted.filter(model_name__in=list(models))
    placed = set(wanted.filter(assignments__isnull=False).values_list("model_name", flat=True))
    found: dict[str, str] = {}
    for name, why in (
        wanted.filter(unplaced=True, state=ReplicaState.PENDING)
        .order_by("id").values_list("model_name", "reason")
    ):  # fmt: skip
        if name not in placed:
            found.setdefault(name, why)
    return found
