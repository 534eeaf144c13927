"""Replacing replicas without a gap: what placement sees now, and draining a node.

A roll (``cluster.services.roll``) and a drain both start a replacement for a replica
(``Replica.replaces``) and stop the old one only once the replacement is ready
(``cluster.plan.finish_rolls``, run by the reconciler). A drain first asks placement, over
the cluster as it stands, whether each replacement has room elsewhere: one that has none
would leave its model with no ready replica, and the drain is refused, naming those
models, unless it is forced.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from dataclasses import replace as replace_node
from datetime import datetime
from typing import Any

from django.db import transaction

from catalog import rules
from catalog.services import stored_specs
from cluster import placement, wake
from cluster.choices import NodeHealth, ReplicaState
from cluster.desired import bump_desired, release_assignments, stop_replicas
from cluster.models import Assignment, Card, FacilityBudget, Node, Replica
from llmgw_core import events
from llmgw_core.refused import Refused


@dataclass(slots=True)
class Held:
    """A replica's share of one node, as the snapshot read it (``Assignment``'s columns,
    with its node's name and whether the node is cordoned)."""

    node_id: int
    node: str
    cordoned: bool
    cards: tuple[int, ...]
    cpu_cores: int
    memory_mb: int
    disk_mb: int
    watts: float


@dataclass(slots=True)
class ReplicaRow:
    """A replica as the snapshot read it: the columns a tick reads, and ``held``, its
    shares of nodes in rank order (none: it waits to be placed)."""

    pk: int
    model_id: int | None
    model_name: str
    profile: str
    fingerprint: str
    desired: bool
    state: str
    reason: str
    unplaced: bool
    replaces_id: int | None
    created: datetime
    held: list[Held] = field(default_factory=list)

    @property
    def has_assignment(self) -> bool:
        """Whether it is on a node (``cluster.plan.ReplicaView.placed``)."""
        return bool(self.held)


@dataclass
class Snapshot:
    """The cluster in placement's terms, read once: ``node_pks`` by name, and
    ``replicas`` with their shares of nodes."""

    node_pks: dict[str, int]
    p_nodes: list[placement.Node]
    domains: list[placement.Domain]
    replicas: list[ReplicaRow]
    running: list[placement.Running] = field(default_factory=list)


def _class_rank(m: Any) -> int:
    return rules.class_rank(rules.effective_class(m)) if m else 1


REPLICA_COLUMNS = (
    "pk",
    "model_id",
    "model_name",
    "profile",
    "fingerprint",
    "desired",
    "state",
    "reason",
    "unplaced",
    "replaces_id",
    "created",
)


def replica_rows() -> list[ReplicaRow]:
    """Read every replica with its shares of nodes: two queries (replicas; assignments
    with their nodes' names), the columns a tick reads and no model instances."""
    rows = [ReplicaRow(*values) for values in Replica.objects.values_list(*REPLICA_COLUMNS)]
    by_pk = {r.pk: r for r in rows}
    for replica_id, *values in Assignment.objects.values_list(
        "replica_id",
        "node_id",
        "node__name",
        "node__cordoned",
        "cards",
        "cpu_cores",
        "memory_mb",
        "disk_mb",
        "watts",
    ):
        r = by_pk.get(replica_id)
        if r is not None:  # created after the replicas were read: the next tick sees it
            values[3] = tuple(values[3])
            r.held.append(Held(*values))
    return rows


def snapshot(specs: dict[str, Any], unschedulable: frozenset[int] = frozenset()) -> Snapshot:
    """Read nodes, budgets and replicas as placement sees them: one query per table
    (nodes, cards, budgets, replicas, assignments), only the columns placement reads.

    ``specs`` are the catalog's normalized models by name; nodes whose pk is in
    ``unschedulable`` are taken as cordoned (a drain asking what would happen).
    """
    cards: dict[int, list[placement.Card]] = defaultdict(list)
    for node_id, *values in Card.objects.values_list(
        "node_id", "index", "gpu_class", "memory_mb", "power_limit_w", "mig_of"
    ):
        cards[node_id].append(placement.Card(*values))
    node_pks: dict[str, int] = {}
    p_nodes = []
    for pk, name, labels, cores, memory, disk, engines, weights, health, cordoned, simulated in (
        Node.objects.values_list(
            "pk", "name", "labels", "cpu_cores", "memory_mb", "disk_free_mb", "engines",
            "weights", "health", "cordoned", "simulated",
        )
    ):  # fmt: skip
        node_pks[name] = pk
        p_nodes.append(
            placement.Node(
                name=name,
                labels=labels,
                cpu_cores=cores,
                memory_mb=memory,
                disk_free_mb=disk,
                engines=engines,
                cards=tuple(cards.get(pk, ())),
                holds=frozenset(weights),
                schedulable=(
                    health == NodeHealth.READY and not cordoned and pk not in unschedulable
                ),
                simulated=simulated,
            )  # fmt: skip
        )
    domains = [
        placement.Domain(*values)
        for values in FacilityBudget.objects.values_list("level", "name", "cap_watts")
    ]
    replicas = replica_rows()
    running = []
    for r in replicas:
        if not r.held:
            continue
        m = specs.get(r.model_name)
        running.append(
            placement.Running(
                id=r.pk,
                model=r.model_name,
                profile=r.profile,
                class_rank=_class_rank(m),
                assignments=tuple(
                    placement.Assignment(
                        node=a.node,
                        cards=a.cards,
                        cpu_cores=a.cpu_cores,
                        memory_mb=a.memory_mb,
                        disk_mb=a.disk_mb,
                        watts=a.watts,
                    )
                    for a in r.held
                ),
                source=m.source if m else "",
            )  # fmt: skip
        )
    return Snapshot(node_pks, p_nodes, domains, replicas, running)


def running_of(pl: placement.Placement, rank: int) -> placement.Running:
    """Return a placement just made as a running replica (for a second look at the room)."""
    return placement.Running(pl.key, pl.model, pl.profile, rank, pl.assignments, pl.source)


class DrainRefused(Refused):
    """A drain that would leave models with no ready replica; ``models`` names them."""

    status = 409

    def __init__(self, node: str, models: dict[str, str]) -> None:
        self.node = node
        self.models = models
        names = ", ".join(sorted(models))
        why = "; ".join(f"{m}: {models[m]}" for m in sorted(models))
        super().__init__(
            f"draining {node} would leave {names} with no ready replica, as there is no room "
            f"elsewhere ({why}). Nothing was changed: free room, or drain with force to stop "
            "them anyway."
        )


@dataclass
class Drained:
    """What a drain did: replacements started elsewhere, and replicas stopped at once."""

    replacing: dict[int, int] = field(default_factory=dict)  # old -> new
    stopped: list[int] = field(default_factory=list)
    dark: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        text = (
            f"{len(self.replacing)} replaced elsewhere before stopping, {len(self.stopped)} stopped"
        )
        if self.dark:
            text += f" (forced: {', '.join(self.dark)} left with no ready replica)"
        return text


@transaction.atomic
def drain(node: Node, force: bool = False) -> Drained:
    """Cordon a node and move its replicas off it, each replaced before it stops.

    Each desired replica on the node gets a replacement (placed elsewhere by the
    reconciler; the old one stops once it is ready). A replica whose replacement has no
    room elsewhere is stopped at once, if its model keeps a ready replica on another
    node; if it would be the model's last, the drain is refused (``DrainRefused``, nothing
    changed) unless ``force``.
    """
    Node.objects.select_for_update().filter(pk=node.pk).first()
    here = list(
        Replica.objects.filter(assignments__node=node, desired=True).distinct().order_by("pk")
    )
    done = Drained()
    if not here:
        Node.objects.filter(pk=node.pk).update(cordoned=True)
        events.changed(nodes=[node.pk])
        return done
    specs = {m.name: rules.normalize(m) for m in stored_specs()}
    snap = snapshot(specs, unschedulable=frozenset({node.pk}))
    plan = _plan_drain(here, specs, snap)
    dark = _darkened(here, snap, plan)
    if dark and not force:
        raise DrainRefused(node.name, dark)
    Node.objects.filter(pk=node.pk).update(cordoned=True)
    events.changed(nodes=[node.pk])
    served = {r.pk: r.model_id for r in here}
    evict_now = [e for h in plan.held.values() for e in h.evictions]
    if evict_now:
        _evict(evict_now, node.name)
    for r in plan.movers:
        if r.pk not in plan.room and str(r.pk) not in plan.held:
            continue
        new = Replica.objects.create(
            model_id=served[r.pk],
            model_name=r.model_name,
            replaces=r,
            reason=f"replacing #{r.pk} from drained node {node.name}",
        )
        done.replacing[r.pk] = new.pk
    stop_now = [r.pk for r in plan.stuck]
    if stop_now:
        stop_replicas(stop_now, f"node {node.name} drained (no room elsewhere)")
    done.stopped = stop_now
    done.dark = sorted(dark)
    events.changed(models=[r.model_name for r in here])
    wake.reconcile_soon()  # the replacements are placed elsewhere
    return done


@dataclass
class _DrainPlan:
    """Where a drained node's replicas would go: ``movers`` get a replacement (``room``:
    placed; ``held``: waiting, patient, for room another model's last replica holds);
    ``stuck`` have no room and stop now (``why``: placement's reason)."""

    replaced: set[int]
    movers: list[Replica]
    room: set[int]
    stuck: list[Replica]
    held: dict[str, placement.Held]
    why: dict[int, str]


def _plan_drain(here: list[Replica], specs: dict[str, Any], snap: Any) -> _DrainPlan:
    """Place replacements for the replicas ``here`` as the reconciler will, off the node."""
    replaced = {r.replaces_id for r in snap.replicas if r.desired and r.replaces_id is not None}
    movers = [r for r in here if r.pk not in replaced and r.model_name in specs]
    requests = [
        placement.Request(
            str(r.pk),
            r.model_name,
            tuple(placement.profiles_from_spec(specs[r.model_name])),
            _class_rank(specs[r.model_name]),
        )
        for r in movers
    ]
    ready: dict[str, set[int]] = defaultdict(set)
    for r in snap.replicas:
        if r.desired and r.state == ReplicaState.READY:
            ready[r.model_name].add(r.pk)
    # A ready replica's replacement makes before it breaks: it evicts no model's last
    # ready replica that no other node could hold (as the reconciler will place it).
    patient = [str(r.pk) for r in movers if r.state == ReplicaState.READY]
    profiles = {name: tuple(placement.profiles_from_spec(m)) for name, m in specs.items()}
    stuck_ready: set[int] = set()
    for _ in range(3):
        # A replica here that cannot be replaced stops now: it no longer serves its model.
        serving = {m: ids - stuck_ready for m, ids in ready.items()}
        result, held = placement.place_sparing(
            snap.p_nodes, snap.domains, snap.running, requests, serving, patient, profiles
        )
        room = {int(p.key) for p in result.placed}
        stuck = [
            r for r in here if r.pk not in replaced and r.pk not in room and str(r.pk) not in held
        ]
        now_stuck = {r.pk for r in stuck if r.state == ReplicaState.READY}
        if now_stuck <= stuck_ready:
            break
        stuck_ready |= now_stuck
    why = {int(u.key): u.told for u in result.unplaced}
    return _DrainPlan(replaced, movers, room, stuck, held, why)


def _darkened(here: list[Replica], snap: Any, plan: _DrainPlan) -> dict[str, str]:
    """Return the models the drain would leave with no ready replica, and why."""
    here_ids = {r.pk for r in here}
    room, replaced, stuck, held, why = plan.room, plan.replaced, plan.stuck, plan.held, plan.why
    ready_elsewhere: dict[str, int] = defaultdict(int)
    for r in snap.replicas:
        if r.desired and r.state == ReplicaState.READY and r.pk not in here_ids:
            ready_elsewhere[r.model_name] += 1
    ready_here: dict[str, int] = defaultdict(int)
    for r in here:
        if r.state == ReplicaState.READY:
            ready_here[r.model_name] += 1
    # A model goes dark when its ready replicas are all here and none of them can be
    # replaced: one replaced elsewhere keeps serving until its replacement is ready.
    kept = {r.model_name for r in here if r.pk in room or r.pk in replaced}
    dark = {
        r.model_name: why.get(r.pk, "not in the catalog")
        for r in stuck
        if ready_here[r.model_name]
        and not ready_elsewhere[r.model_name]
        and r.model_name not in kept
    }
    # And when a replacement's only room is another model's last ready replica, which no
    # other node could hold: that model goes dark once the replacement evicts it.
    by_pk = {r.pk: r for r in here}
    for key, h in held.items():
        old = by_pk[int(key)]
        darkening = {e.running_id for e in h.spared}
        for e in h.evictions:
            if e.running_id in darkening and e.model in h.nowhere:
                dark.setdefault(
                    e.model,
                    f"its last ready replica #{e.running_id} holds the only room for the "
                    f"replacement of {old.model_name} #{old.pk}, and no other node could hold "
                    f"{e.model} ({h.nowhere[e.model]})",
                )
    return dark


def _replace_elsewhere(
    m: Any, snap: Snapshot, v: Replica, wanted: placement.Placement, for_key: str
) -> int | None:
    """Start a replacement for ``v`` (its model ``m``) where it has room without evicting,
    off the nodes ``wanted`` is to take; return its pk, or None when there is no room."""
    taken = {a.node for a in wanted.assignments}
    request = placement.Request(
        "spare", m.name, tuple(placement.profiles_from_spec(m)), _class_rank(m)
    )
    nodes = [replace_node(pn, schedulable=False) if pn.name in taken else pn for pn in snap.p_nodes]
    trial = placement.place(nodes, snap.domains, snap.running, [request])
    if not trial.placed or trial.evictions:
        return None
    new_pk = Replica.objects.create(
        model_id=v.model_id,
        model_name=v.model_name,
        replaces_id=v.pk,
        reason=f"replacing #{v.pk} elsewhere: its room is wanted by {for_key}",
    ).pk
    events.changed(models=[v.model_name])
    wake.reconcile_soon()  # placed at the next tick
    return new_pk


def _evict(evictions: list[placement.Eviction], node: str) -> None:
    """Evict now what a forced drain's replacements need: their room frees for them."""
    for e in evictions:
        victims = list(Assignment.objects.filter(replica_id=int(e.running_id)))
        release_assignments(
            victims,
            f"evicted for the replacement of a replica on drained node {node} (forced "
            f"drain): {e.model} has no ready replica until room returns",
        )
        Replica.objects.filter(pk=int(e.running_id)).update(evicted_by=e.for_key)
        bump_desired(a.node_id for a in victims)
        events.changed(replicas=[int(e.running_id)], models=[e.model])


def spare_evicted(
    specs: dict[str, Any], snap: Snapshot, plan: placement.Plan
) -> tuple[placement.Plan, dict[int, str]]:
    """Keep an eviction from leaving the evicted model with no ready replica.

    For each replica placement would evict that is its model's last ready one: if it has
    room elsewhere, a replacement is started there (as a drain does) and the request that
    wanted its room waits, placed once the replacement is ready and the old one stopped;
    if it has none, it is evicted and its reason says its model has no ready replica
    until room returns. Return the plan to apply (without the requests that wait, and
    without what was placed on their nodes) and the reasons of the requests that wait.
    """
    if not plan.evictions:
        return plan, {}
    by_pk = {r.pk: r for r in snap.replicas}
    replaced = {r.replaces_id: r.pk for r in snap.replicas if r.desired and r.replaces_id}
    victims = {int(e.running_id) for e in plan.evictions}
    ready: dict[str, set[int]] = defaultdict(set)
    for r in snap.replicas:
        if r.desired and r.state == ReplicaState.READY:
            ready[r.model_name].add(r.pk)
    placed = {p.key: p for p in plan.placed}
    waits: dict[str, str] = {}
    evictions = []
    for e in plan.evictions:
        v = by_pk.get(int(e.running_id))
        last = (
            v is not None
            and v.desired
            and v.state == ReplicaState.READY
            and not (ready[v.model_name] - victims)
        )
        if not last:
            evictions.append(e)
            continue
        assert v is not None
        wanted = placed.get(e.for_key)
        new_pk = replaced.get(v.pk)
        if new_pk is None and v.model_name in specs and wanted is not None:
            new_pk = _replace_elsewhere(specs[v.model_name], snap, v, wanted, e.for_key)
        if new_pk is not None:
            waits[e.for_key] = (
                f"waiting for #{new_pk} to be ready on another node before evicting "
                f"#{v.pk}, the last ready replica of {v.model_name}"
            )
            continue
        evictions.append(
            placement.Eviction(
                e.running_id,
                e.model,
                e.for_key,
                f"{e.reason}; no room elsewhere: {v.model_name} has no ready replica "
                "until room returns",
            )
        )
    if not waits:
        return placement.Plan(plan.placed, evictions, plan.unplaced), {}
    # What waits keeps its victims; nothing else goes on the nodes it was to take.
    held = {a.node for key in waits if key in placed for a in placed[key].assignments}
    keep = [
        p for p in plan.placed if p.key not in waits and not {a.node for a in p.assignments} & held
    ]
    kept_keys = {p.key for p in keep}
    evictions = [e for e in evictions if e.for_key in kept_keys]
    dropped = [p for p in plan.placed if p.key not in kept_keys and p.key not in waits]
    reasons = {int(k): why for k, why in waits.items()}
    for p in dropped:
        reasons[int(p.key)] = "waiting for room a replacement elsewhere is making"
    return placement.Plan(keep, evictions, plan.unplaced), reasons
