"""Cluster operations, the operators' side: cordon, drain, stop, restart, roll, demand, the
change log, a replica's state from its ranks, and what has no room. Used by the API views,
the reconciler and commands. The agents' side is beside it: ``cluster.agentinput`` (what an
agent sends, checked), ``cluster.agentjoin`` (join, release, reclaim, address),
``cluster.agentbeat`` (heartbeat, desired list) and ``cluster.agentreport`` (state reports).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from catalog import rules
from catalog.models import ServedModel
from cluster import replace, wake
from cluster.address import host_port
from cluster.agentinput import AgentError
from cluster.choices import ReplicaState
from cluster.desired import bump_desired
from cluster.desired import stop_replicas as stop_replicas  # the reconciler's, as services'
from cluster.models import (
    Assignment,
    ClusterAction,
    ModelDemand,
    Node,
    Replica,
)
from cluster.reasons import public as public_reason
from llmgw_core import events

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
    return replace.drain(node, force)


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
