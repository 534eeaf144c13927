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

from django.db.models import Exists, OuterRef
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
    """Return each facility domain's cap against what its nodes' replicas reserve (three
    queries; each node's labels read once, whatever the number of domains)."""
    budgets = list(FacilityBudget.objects.all())
    if not budgets:
        return []
    watts: dict[int, float] = defaultdict(float)
    for node_id, w in Assignment.objects.order_by().values_list("node_id", "watts"):
        watts[node_id] += w
    keys = {DOMAIN_LABEL.format(level=b.level) for b in budgets}
    # (label, domain) → its nodes' count and reserved watts.
    nodes: dict[tuple[str, str], int] = defaultdict(int)
    used: dict[tuple[str, str], float] = defaultdict(float)
    for pk, labels in Node.objects.order_by().values_list("pk", "labels"):
        for key in keys:
            value = (labels or {}).get(key)
            if value is not None:
                nodes[key, value] += 1
                used[key, value] += watts[pk]
    rows = []
    for b in budgets:
        at = (DOMAIN_LABEL.format(level=b.level), b.name)
        rows.append(PowerRow(b.level, b.name, b.cap_watts, used[at], nodes[at]))
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


def _replica_row(r: Replica) -> ReplicaRow:
    """Return a replica placed nowhere as its row (no nodes, no fingerprint to compare)."""
    return ReplicaRow(
        pk=r.pk, state=r.state, reason=r.reason, profile=r.profile, since=r.state_changed,
        progress=r.progress, nodes=[], cards=0, restarts=r.restarts, outdated=False,
        desired=r.desired, endpoint=r.endpoint, replaces=r.replaces_id,
        evicted_by=r.evicted_by,
    )  # fmt: skip


def unplaced_rows(limit: int | None = None) -> tuple[list[tuple[str, ReplicaRow]], int]:
    """Return the replicas that cannot be placed, with their model's name and the reason
    (the first ``limit`` by model and id), and how many there are (two queries)."""
    unplaced = Replica.objects.filter(state=ReplicaState.PENDING, assignments__isnull=True).exclude(
        reason=""
    )
    total = unplaced.count()
    shown = unplaced.order_by("model_name", "id")
    if limit is not None:
        shown = shown[:limit]
    return [(r.model_name, _replica_row(r)) for r in shown], total


# The dashboard at a large site's size: summary counts, what needs attention first, and a
# page of each list (nodes, models) at a time, never every block (2,000 models' and 1,000
# nodes' blocks took seconds to render).

# Blocks on one page of the dashboard's nodes and of its models.
DASHBOARD_PAGE = 50
# Unplaced replicas listed by name; the rest are counted (their models come first in the
# models' list).
UNPLACED_SHOWN = 20


@dataclass(frozen=True)
class Listing:
    """One page of a dashboard list: its number (from 1), of how many rows, and its query
    parameter (``nodes_page``, ``models_page``)."""

    param: str
    number: int
    total: int
    size: int = DASHBOARD_PAGE

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def start(self) -> int:
        return min(self.total, (self.number - 1) * self.size + 1)

    @property
    def end(self) -> int:
        return min(self.total, self.number * self.size)

    @property
    def paged(self) -> bool:
        return self.pages > 1

    @property
    def has_room(self) -> bool:
        """Whether the page shows fewer rows than it could (the last page): a row that
        appears after it was read is added to it."""
        return self.end - self.start + 1 < self.size if self.total else True

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def page_number(raw: Any) -> int:
    """Return a page number from a query string's value: 1 unless a positive number."""
    text = str(raw or "")
    return int(text) if text.isdigit() and 0 < len(text) <= 6 and int(text) > 0 else 1


def _listing(param: str, number: int, total: int) -> Listing:
    first = Listing(param, 1, total, DASHBOARD_PAGE)
    return Listing(param, min(max(1, number), first.pages), total, DASHBOARD_PAGE)


# A node's place in the dashboard's list: lost, not ready, cordoned, then ready.
_NODE_RANK = {NodeHealth.LOST: 0, NodeHealth.NOT_READY: 1, "cordoned": 2}


def node_facts() -> list[tuple[int, str, str]]:
    """Return every node's pk, name and state, those needing attention first (one query)."""
    facts = [
        (pk, name, "cordoned" if cordoned and health != NodeHealth.LOST else health)
        for pk, name, health, cordoned in Node.objects.values_list(
            "pk", "name", "health", "cordoned"
        )
    ]
    facts.sort(key=lambda f: (_NODE_RANK.get(f[2], 3), f[1]))
    return facts


def any_simulated() -> bool:
    """Whether a node of the cluster is simulated (one query)."""
    return Node.objects.filter(simulated=True).exists()


@dataclass
class NodesPage:
    rows: list[NodeRow]
    listing: Listing
    # Every node's pk when the page has room (a node that joins later is added to it).
    known: set[int] | None


def nodes_page(number: int = 1, facts: list[tuple[int, str, str]] | None = None) -> NodesPage:
    """Return one page of the dashboard's nodes, those needing attention first (five
    queries at most)."""
    facts = node_facts() if facts is None else facts
    listing = _listing("nodes_page", number, len(facts))
    pks = [pk for pk, _, _ in facts[listing.start - 1 : listing.end]] if facts else []
    by_pk = {r.pk: r for r in node_rows(pks)} if pks else {}
    known = {pk for pk, _, _ in facts} if listing.has_room else None
    return NodesPage([by_pk[pk] for pk in pks if pk in by_pk], listing, known)


@dataclass
class ModelFacts:
    """What the dashboard counts of a model's replicas, read for every model at once."""

    name: str
    ready: int = 0
    wanted: int = 0
    unplaced: int = 0
    failed: int = 0
    never: bool = False

    @property
    def rank(self) -> int:
        """Its place in the dashboard's list: those that cannot run, then those with a
        replica unplaced or failed, then those short of ready replicas, then the rest."""
        if self.never:
            return 0
        if self.unplaced or self.failed:
            return 1
        return 2 if self.ready < self.wanted else 3


def model_facts() -> list[ModelFacts]:
    """Return every model that has replicas, counted, those needing attention first (one
    query)."""
    facts: dict[str, ModelFacts] = {}
    placed = Exists(Assignment.objects.filter(replica_id=OuterRef("pk")))
    for name, state, desired, replaces, reason, on_nodes in (
        Replica.objects.annotate(placed=placed)
        .values_list("model_name", "state", "desired", "replaces_id", "reason", "placed")
    ):  # fmt: skip
        f = facts.get(name) or facts.setdefault(name, ModelFacts(name))
        unplaced = state == ReplicaState.PENDING and not on_nodes and bool(reason)
        f.unplaced += unplaced
        if desired:
            f.ready += state == ReplicaState.READY
            f.wanted += replaces is None
            f.failed += state == ReplicaState.FAILED
            f.never = f.never or (unplaced and placement.unplaceable(reason))
    out = sorted(facts.values(), key=lambda f: (f.rank, f.name))
    return out


@dataclass
class ModelsPage:
    rows: list[ModelRow]
    listing: Listing
    # Every listed model's name when the page has room (a model given replicas later is
    # added to it).
    known: set[str] | None


def models_page(number: int = 1, facts: list[ModelFacts] | None = None) -> ModelsPage:
    """Return one page of the dashboard's models, those needing attention first (a fixed
    query count)."""
    facts = model_facts() if facts is None else facts
    listing = _listing("models_page", number, len(facts))
    names = [f.name for f in facts[listing.start - 1 : listing.end]] if facts else []
    by_name = {r.name: r for r in model_rows(names)} if names else {}
    known = {f.name for f in facts} if listing.has_room else None
    return ModelsPage([by_name[n] for n in names if n in by_name], listing, known)


@dataclass
class Summary:
    """The dashboard's counts: nodes by state, models and replicas by what they need."""

    nodes: int = 0
    nodes_by_state: dict[str, int] = field(default_factory=dict)
    models: int = 0
    models_ready: int = 0
    models_short: int = 0
    models_never: int = 0
    replicas_wanted: int = 0
    replicas_ready: int = 0
    replicas_unplaced: int = 0
    replicas_failed: int = 0

    @property
    def nodes_down(self) -> int:
        return self.nodes - self.nodes_by_state.get(NodeHealth.READY, 0)


def summary(
    nodes: list[tuple[int, str, str]] | None = None, models: list[ModelFacts] | None = None
) -> Summary:
    """Return the dashboard's counts from the nodes' and models' facts (two queries, none
    when handed them)."""
    nodes = node_facts() if nodes is None else nodes
    models = model_facts() if models is None else models
    s = Summary(nodes=len(nodes), models=len(models))
    for _, _, state in nodes:
        s.nodes_by_state[state] = s.nodes_by_state.get(state, 0) + 1
    for f in models:
        s.models_ready += f.wanted > 0 and f.ready >= f.wanted
        s.models_short += f.ready < f.wanted
        s.models_never += f.never
        s.replicas_wanted += f.wanted
        s.replicas_ready += min(f.ready, f.wanted)
        s.replicas_unplaced += f.unplaced
        s.replicas_failed += f.failed
    return s


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


def unplaced_context() -> dict[str, Any]:
    rows, total = unplaced_rows(UNPLACED_SHOWN)
    return {"unplaced": rows, "unplaced_total": total, "unplaced_more": total - len(rows)}


def render_unplaced() -> str:
    return render_to_string("cluster/partials/unplaced.html", unplaced_context())


def render_summary(s: Summary | None = None) -> str:
    return render_to_string("cluster/partials/summary.html", {"summary": s or summary()})


@dataclass
class Pages:
    """The dashboard's page numbers, as its address and its live socket carry them."""

    nodes: int = 1
    models: int = 1

    @classmethod
    def of(cls, query: Any) -> Pages:
        """Read them from a query string (a QueryDict, or parse_qs's dict of lists)."""

        def one(key: str) -> Any:
            value = query.get(key)
            return value[-1] if isinstance(value, list) and value else value

        return cls(page_number(one("nodes_page")), page_number(one("models_page")))

    @property
    def query(self) -> str:
        return f"nodes_page={self.nodes}&models_page={self.models}"

    @property
    def nodes_keep(self) -> str:
        """What a link to another page of nodes keeps: the models' page."""
        return f"models_page={self.models}"

    @property
    def models_keep(self) -> str:
        return f"nodes_page={self.nodes}"


def render_nodes(can_act: bool, pages: Pages | None = None) -> tuple[str, NodesPage]:
    """Return the nodes' section (a page of them) and the power, as the dashboard renders
    them, with the page shown."""
    pages = pages or Pages()
    page = nodes_page(pages.nodes)
    nodes = render_to_string(
        "cluster/partials/nodes.html",
        {"nodes": page.rows, "nodes_listing": page.listing, "pages": pages, "can_act": can_act},
    )
    return nodes + "\n" + render_power(), page


def render_models(can_act: bool, pages: Pages | None = None) -> tuple[str, ModelsPage]:
    """Return the models' section (a page of them), the unplaced replicas and the summary,
    as the dashboard renders them, with the page shown."""
    pages = pages or Pages()
    facts = model_facts()
    page = models_page(pages.models, facts)
    models = render_to_string(
        "cluster/partials/models.html",
        {"models": page.rows, "models_listing": page.listing, "pages": pages,
         "can_act": can_act},
    )  # fmt: skip
    return "\n".join((models, render_unplaced(), render_summary(summary(None, facts)))), page


def render_model_block(can_act: bool, model: str) -> str:
    """Return one model's block, as its page renders it."""
    return render_model(model_row(model), can_act, model)


def nodes_changed(pks: list[int], can_act: bool) -> dict[Any, str | None]:
    """Return each node's fragment by pk (None: gone), the power's under "power" and the
    summary's under "summary"."""
    rows = {r.pk: r for r in node_rows(pks)} if pks else {}
    out: dict[Any, str | None] = {
        pk: render_node(rows[pk], can_act) if pk in rows else None for pk in pks
    }
    out["power"] = render_power()
    out["summary"] = render_summary()
    return out


def models_changed(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """Return each model's fragment by name (None: no replicas left), the unplaced
    replicas' under ``("unplaced",)`` and the summary's under ``("summary",)``."""
    rows = {r.name: r for r in model_rows(names)} if names else {}
    out: dict[Any, str | None] = {
        n: render_model(rows[n], can_act) if n in rows else None for n in names
    }
    out[("unplaced",)] = render_unplaced()
    out[("summary",)] = render_summary()
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
