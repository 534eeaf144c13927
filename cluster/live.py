"""What the live console shows of the cluster, read from the database without a request.

The dashboard's first render and every push use these rows and the same fragments
(``templates/cluster/partials/``), so a pushed element is exactly what a reload would
show. Each function reads a fixed number of queries whatever the cluster's size.

The ``render_*`` functions and ``*_changed`` at the end are the cluster's renderers:
the console's live consumer (``llmgw_admin.consumer``) pushes what they return, and the
cluster's actions (``cluster.views.actions``) answer with it.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone

from catalog import rules
from catalog.models import ServedModel
from catalog.services import stored_specs
from cluster import placement
from cluster.choices import NodeHealth, ReplicaState
from cluster.models import (
    Assignment,
    Card,
    ClusterAction,
    FacilityBudget,
    ModelScale,
    Node,
    Replica,
)
from cluster.plan import ONE_AT_A_TIME

DOMAIN_LABEL = "llmgw.io/{level}"


def model_dom_id(name: str) -> str:
    """Return the stable DOM id of a model's block: readable, and unique per name."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"cluster-model-{slug}-{digest}"


# Nodes


@dataclass
class ClassUse:
    gpu_class: str
    used: int
    total: int
    mig: bool

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass
class NodeRow:
    pk: int
    name: str
    state: str
    reason: str
    simulated: bool
    labels: dict[str, str]
    cpu_used: int
    cpu_total: int
    memory_used_mb: int
    memory_total_mb: int
    disk_free_mb: int
    watts: float
    last_heartbeat: datetime | None
    classes: list[ClassUse] = field(default_factory=list)
    replicas: int = 0

    @property
    def dom_id(self) -> str:
        return f"cluster-node-{self.pk}"

    @property
    def schedulable(self) -> bool:
        return self.state == NodeHealth.READY


def cordon_reasons(names: list[str]) -> dict[str, str]:
    """Return why each cordoned node is: who cordoned or drained it last (one query).

    A node's own reason is what its agent's joins and silences left ("joined", "heard
    from again"); a cordon is an operator's, logged as a ClusterAction.
    """
    if not names:
        return {}
    out: dict[str, str] = {}
    for target, action, actor in (
        ClusterAction.objects.filter(
            target__in=[f"node {n}" for n in names], action__in=("cordon", "drain")
        )
        .order_by("-at", "-id")
        .values_list("target", "action", "actor_name")
    ):
        verb = "drained" if action == "drain" else "cordoned"
        out.setdefault(target.removeprefix("node "), f"{verb} by {actor}")
    return out


def node_rows(pks: Iterable[int] | None = None) -> list[NodeRow]:
    """Return nodes with what they hold (three queries; a fourth when one is cordoned)."""
    nodes = Node.objects.all()
    if pks is not None:
        nodes = nodes.filter(pk__in=list(pks))
    nodes_list = list(nodes)
    ids = [n.pk for n in nodes_list]
    cards: dict[int, list[tuple[int, str, int | None]]] = defaultdict(list)
    for node_id, index, gpu_class, mig_of in Card.objects.filter(node_id__in=ids).values_list(
        "node_id", "index", "gpu_class", "mig_of"
    ):
        cards[node_id].append((index, gpu_class, mig_of))
    held: dict[int, set[int]] = defaultdict(set)
    cores: dict[int, int] = defaultdict(int)
    memory: dict[int, int] = defaultdict(int)
    watts: dict[int, float] = defaultdict(float)
    replicas: dict[int, set[int]] = defaultdict(set)
    for node_id, replica_id, card_list, c, mem, w in Assignment.objects.filter(
        node_id__in=ids
    ).values_list("node_id", "replica_id", "cards", "cpu_cores", "memory_mb", "watts"):
        held[node_id].update(card_list or ())
        cores[node_id] += c
        memory[node_id] += mem
        watts[node_id] += w
        replicas[node_id].add(replica_id)
    why = cordon_reasons([n.name for n in nodes_list if n.state == "cordoned"])
    rows = []
    for n in nodes_list:
        by_class: dict[str, ClassUse] = {}
        for index, gpu_class, mig_of in sorted(cards[n.pk]):
            use = by_class.setdefault(gpu_class, ClassUse(gpu_class, 0, 0, mig_of is not None))
            use.total += 1
            if index in held[n.pk]:
                use.used += 1
        rows.append(
            NodeRow(
                pk=n.pk,
                name=n.name,
                state=n.state,
                reason=why.get(n.name, "cordoned") if n.state == "cordoned" else n.reason,
                simulated=n.simulated,
                labels=dict(n.labels or {}),
                cpu_used=cores[n.pk],
                cpu_total=n.cpu_cores,
                memory_used_mb=memory[n.pk],
                memory_total_mb=n.memory_mb,
                disk_free_mb=n.disk_free_mb,
                watts=watts[n.pk],
                last_heartbeat=n.last_heartbeat,
                classes=sorted(by_class.values(), key=lambda u: u.gpu_class),
                replicas=len(replicas[n.pk]),
            )
        )
    return rows


@dataclass
class PowerRow:
    level: str
    name: str
    cap_watts: float
    used_watts: float
    nodes: int

    @property
    def percent(self) -> int:
        return min(100, round(100 * self.used_watts / self.cap_watts)) if self.cap_watts else 0

    @property
    def over(self) -> bool:
        return self.used_watts > self.cap_watts


def power_rows() -> list[PowerRow]:
    """Return each facility domain's cap against what its nodes' replicas reserve."""
    budgets = list(FacilityBudget.objects.all())
    if not budgets:
        return []
    labels = dict(Node.objects.values_list("pk", "labels"))
    watts: dict[int, float] = defaultdict(float)
    for node_id, w in Assignment.objects.values_list("node_id", "watts"):
        watts[node_id] += w
    rows = []
    for b in budgets:
        key = DOMAIN_LABEL.format(level=b.level)
        members = [pk for pk, lab in labels.items() if (lab or {}).get(key) == b.name]
        rows.append(
            PowerRow(b.level, b.name, b.cap_watts, sum(watts[pk] for pk in members), len(members))
        )
    return rows


# Models and their replicas


@dataclass
class ReplicaRow:
    pk: int
    state: str
    reason: str
    profile: str
    since: datetime
    progress: float | None
    nodes: list[str]
    cards: int
    restarts: int
    outdated: bool
    desired: bool
    endpoint: str
    replaces: int | None
    evicted_by: str

    @property
    def dom_id(self) -> str:
        return f"cluster-replica-{self.pk}"

    @property
    def percent(self) -> int | None:
        return None if self.progress is None else max(0, min(100, round(self.progress * 100)))

    @property
    def unplaced(self) -> bool:
        return self.state == ReplicaState.PENDING and not self.nodes and bool(self.reason)

    @property
    def never(self) -> bool:
        """Whether no node of the cluster could run it even empty (placement says so)."""
        return self.unplaced and placement.unplaceable(self.reason)


@dataclass
class RollStep:
    label: str
    status: str  # done, current or todo


@dataclass
class Roll:
    new: int
    old: int
    steps: list[RollStep]
    # Set when the cluster has no room beside the old replica: the roll goes one replica
    # at a time, and says so (cluster.plan.make_room).
    note: str = ""


@dataclass
class ModelRow:
    name: str
    catalog_pk: int | None
    replicas: list[ReplicaRow]
    rolls: list[Roll]
    # Load scaling's target and why (cluster.scaling, kept as ModelScale); none while the
    # model's count is fixed (min equal to max, switched off, not asked for).
    scale_target: int | None = None
    scale_range: str = ""
    scale_reason: str = ""
    # The capacity bench's last word on it today (started, done with its figure, failed).
    bench: str = ""
    role: str = ""  # the catalog's: "guard" for a judge, which the bench does not drive

    @property
    def benchable(self) -> bool:
        """Whether the bench can drive it: a ready replica, and not a judge (the gateway
        serves judges to no client, and the bench goes through the gateway)."""
        return bool(self.ready) and self.role != "guard"

    @property
    def dom_id(self) -> str:
        return model_dom_id(self.name)

    @property
    def ready(self) -> int:
        return sum(1 for r in self.replicas if r.state == ReplicaState.READY and r.desired)

    @property
    def wanted(self) -> int:
        return sum(1 for r in self.replicas if r.desired and r.replaces is None)

    @property
    def unplaced(self) -> list[ReplicaRow]:
        return [r for r in self.replicas if r.unplaced]

    @property
    def unplaceable(self) -> str:
        """Why no node of the cluster could run the model (its reason), or ""."""
        return next((r.reason for r in self.replicas if r.desired and r.never), "")

    @property
    def outdated(self) -> int:
        return sum(1 for r in self.replicas if r.outdated and r.desired)


def _fingerprints(names: set[str] | None) -> dict[str, dict[str, str]]:
    return {
        m.name: {p.name: rules.fingerprint(p) for p in rules.normalize(m).profiles}
        for m in stored_specs(names=names)
    }


def _roll_steps(new: ReplicaRow, old: ReplicaRow | None) -> list[RollStep]:
    placed = bool(new.nodes)
    ready = new.state == ReplicaState.READY
    loaded = ready or new.state in (ReplicaState.LOADING, ReplicaState.STARTING)
    old_gone = old is None or not old.desired
    marks = [placed, loaded, ready, old_gone]
    labels = [
        f"new replica #{new.pk} placed" + (f" on {', '.join(new.nodes)}" if placed else ""),
        f"#{new.pk} starting",
        f"#{new.pk} ready",
        f"old replica #{new.replaces} stopped",
    ]
    steps = []
    current_found = False
    for label, done in zip(labels, marks, strict=True):
        if done:
            steps.append(RollStep(label, "done"))
        elif not current_found:
            steps.append(RollStep(label, "current"))
            current_found = True
        else:
            steps.append(RollStep(label, "todo"))
    return steps


def model_rows(names: Iterable[str] | None = None) -> list[ModelRow]:
    """Return models that have replicas, with each replica's state (a fixed query count)."""
    wanted = set(names) if names is not None else None
    qs = Replica.objects.all()
    if wanted is not None:
        qs = qs.filter(model_name__in=wanted)
    replicas = list(qs.order_by("model_name", "id"))
    if not replicas:
        return []
    present = {r.model_name for r in replicas}
    prints = _fingerprints(present)
    where: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for replica_id, node_name, card_list in (
        Assignment.objects.filter(replica_id__in=[r.pk for r in replicas])
        .order_by("replica_id", "rank")
        .values_list("replica_id", "node__name", "cards")
    ):
        where[replica_id].append((node_name, len(card_list or ())))
    catalog, roles = {}, {}
    for name, pk, role in ServedModel.objects.filter(name__in=present).values_list(
        "name", "pk", "role"
    ):
        catalog[name], roles[name] = pk, role
    by_model: dict[str, list[ReplicaRow]] = defaultdict(list)
    for r in replicas:
        current = prints.get(r.model_name, {}).get(r.profile)
        by_model[r.model_name].append(
            ReplicaRow(
                pk=r.pk,
                state=r.state,
                reason=r.reason,
                profile=r.profile,
                since=r.state_changed,
                progress=r.progress,
                nodes=[n for n, _ in where[r.pk]],
                cards=sum(c for _, c in where[r.pk]),
                restarts=r.restarts,
                outdated=bool(r.fingerprint) and current is not None and current != r.fingerprint,
                desired=r.desired,
                endpoint=r.endpoint,
                replaces=r.replaces_id,
                evicted_by=r.evicted_by,
            )
        )
    rows = []
    for name in sorted(by_model):
        reps = by_model[name]
        by_pk = {r.pk: r for r in reps}
        rolls = [
            Roll(
                r.pk,
                r.replaces,
                _roll_steps(r, by_pk.get(r.replaces)),
                r.reason if r.reason.startswith(ONE_AT_A_TIME) else "",
            )
            for r in reps
            if r.replaces is not None
        ]
        rows.append(ModelRow(name, catalog.get(name), reps, rolls, role=roles.get(name, "")))
    for scale in ModelScale.objects.filter(model_name__in=[r.name for r in rows]):
        row = next(r for r in rows if r.name == scale.model_name)
        row.scale_target = scale.target
        row.scale_range = f"{scale.lo}–{scale.hi}"
        row.scale_reason = scale.shown
    by_name = {r.name: r for r in rows}
    for action, target, detail in (
        ClusterAction.objects.filter(action__in=BENCH_ACTIONS, at__gte=timezone.now()
                                     - timedelta(days=1)).order_by("-at", "-id")
        .values_list("action", "target", "detail")[:200]
    ):  # fmt: skip
        name = target.removeprefix("model ").split(" profile ")[0]
        row = by_name.get(name)
        if row is not None and not row.bench:
            row.bench = f"{action}: {detail.splitlines()[0] if detail else ''}"
    return rows


# The cluster actions a bench run logs (cluster.benchrun).
BENCH_ACTIONS = ("bench", "bench done", "bench failed")


def model_row(name: str) -> ModelRow | None:
    rows = model_rows([name])
    return rows[0] if rows else None


def unplaced_rows() -> list[tuple[str, ReplicaRow]]:
    """Return every replica that cannot be placed, with its model's name and the reason."""
    rows = model_rows(
        Replica.objects.filter(state=ReplicaState.PENDING, assignments__isnull=True)
        .exclude(reason="")
        .values_list("model_name", flat=True)
        .distinct()
    )
    return [(m.name, r) for m in rows for r in m.unplaced]


# Fragments, rendered without a request: the same templates the pages include.


def render_node(row: NodeRow, can_act: bool) -> str:
    return render_to_string("cluster/partials/node.html", {"node": row, "can_act": can_act})


def render_model(row: ModelRow | None, can_act: bool, name: str = "") -> str:
    return render_to_string(
        "cluster/partials/model.html",
        {"m": row, "can_act": can_act, "dom_id": model_dom_id(name)},
    )


def render_power() -> str:
    return render_to_string("cluster/partials/power.html", {"power": power_rows()})


def render_unplaced() -> str:
    return render_to_string("cluster/partials/unplaced.html", {"unplaced": unplaced_rows()})


def render_nodes(can_act: bool) -> str:
    """Return the nodes' list and the power, as the dashboard renders them."""
    nodes = render_to_string(
        "cluster/partials/nodes.html", {"nodes": node_rows(), "can_act": can_act}
    )
    return nodes + "\n" + render_power()


def render_models(can_act: bool, model: str | None = None) -> str:
    """Return the models' list and the unplaced replicas, as the dashboard renders them;
    with ``model``, that model's block alone (its page)."""
    if model is not None:
        return render_model(model_row(model), can_act, model)
    models = render_to_string(
        "cluster/partials/models.html", {"models": model_rows(), "can_act": can_act}
    )
    return models + "\n" + render_unplaced()


def nodes_changed(pks: list[int], can_act: bool) -> dict[Any, str | None]:
    """Return each node's fragment by pk (None: gone) and the power's, under "power"."""
    rows = {r.pk: r for r in node_rows(pks)}
    out: dict[Any, str | None] = {
        pk: render_node(rows[pk], can_act) if pk in rows else None for pk in pks
    }
    out["power"] = render_power()
    return out


def models_changed(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """Return each model's fragment by name (None: no replicas left) and the unplaced
    replicas', under ``("unplaced",)``."""
    rows = {r.name: r for r in model_rows(names)}
    out: dict[Any, str | None] = {
        n: render_model(rows[n], can_act) if n in rows else None for n in names
    }
    out[("unplaced",)] = render_unplaced()
    return out


# The catalog list's ready column: ready/total replicas per model, by name.


@dataclass(frozen=True)
class Readiness:
    """A model's replicas as the catalog list counts them: those serving, of those wanted.

    ``total`` is the replicas the reconciler wants now (a roll's replacement not counted
    twice); ``ready`` those of them answering, at most ``total``, as the dashboard's
    "1 of 1 ready" counts them (``ModelRow.ready`` and ``ModelRow.wanted``).
    """

    name: str
    ready: int
    total: int

    @property
    def dom_id(self) -> str:
        return "catalog-ready-" + model_dom_id(self.name).removeprefix("cluster-model-")


def readiness(names: Iterable[str]) -> dict[str, Readiness]:
    """Return each named model's readiness (one query; a model with no replica: 0/0)."""
    wanted = list(dict.fromkeys(names))
    ready: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for name, state, replaces in Replica.objects.filter(
        model_name__in=wanted, desired=True
    ).values_list("model_name", "state", "replaces_id"):
        ready[name] += state == ReplicaState.READY
        total[name] += replaces is None
    return {n: Readiness(n, min(ready[n], total[n]), total[n]) for n in wanted}


def render_ready(row: Readiness) -> str:
    return render_to_string("cluster/partials/ready.html", {"r": row})


def ready_changed(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """Return each model's ready cell by name (the catalog list's live view)."""
    return {n: render_ready(r) for n, r in readiness(names).items()}
