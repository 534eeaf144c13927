"""Placement: which nodes new replicas go on, as a function of plain data.

Architecture step 3. The reconciler hands ``place`` the nodes as they reported themselves,
the facility domains with power caps, the replicas already running and the replicas it
wants; ``place`` returns a ``Plan``: where each new replica goes, which running replicas
make way for it, and, for each that fits nowhere, why, in words an operator reads. No
Django and no I/O: the same input gives the same plan, and nothing passed in is changed.

How a request is placed:

1. Requests go in order of class (critical, standard, opportunistic), then their own
   ``priority`` (higher first), then key. Running replicas hold what they use throughout.
2. A request's profiles are tried by priority, highest first, ties in declaration order;
   the first that fits wins.
3. A node fits a profile when it is schedulable; runs the engine (a version starting with
   ``engine_version``, read by whole components: "0.1" takes 0.1.3, not 0.11.0); carries
   every ``node_selector`` label; has ``gpus_per_node`` free cards of exactly
   ``gpu_class``; has the memory (``min_memory_gb`` per node), the CPU cores
   (``cpu_cores`` per node) and, unless it holds the weights already, the disk
   (``min_disk_gb``); and every capped domain it is in (its ``llmgw.io/<level>`` labels)
   stays within its cap. A node that reports 0 memory, cores or disk is not excluded:
   unknown is not full.
4. A multi-node profile needs ``nodes`` distinct such nodes, all sharing one rack, row,
   room or site when ``keep_within`` says so (nodes without that label are passed over);
   their power is counted together. ``keep_within`` constrains multi-node profiles only:
   one node is always within one rack.
5. Among the nodes that fit, a one-node replica goes where its model has the fewest
   replicas (spread, as Kubernetes spreads a deployment's pods): on the node, then in
   its ``llmgw.io/rack``; where it must share, the placement's
   ``note`` says so. Then those holding the weights come first, then the best fit
   (the fewest free cards of the class that suffice, so large holes stay for large
   models; for a CPU profile, nodes without cards and then the fewest free cores), then
   the name.
6. Only when a request fits nowhere may it evict running replicas of a strictly lower
   class, on one node (or one set of nodes for a multi-node profile): the lowest classes
   and the fewest replicas that make room. An evicted replica is not placed again in
   the same plan; the reconciler asks for it again, and it comes back when room returns.

Cards: an index names a card or MIG instance on its node (unique per node, as the
inventory reports them). A MIG instance is its own class. A card with MIG instances
carved out of it (another card's ``mig_of``) is never offered whole, and a replica that
holds such a card whole (from before it was carved) holds its instances too.

Power: a replica draws its profile's ``power_watts``, split evenly over its nodes; when
that is 0 it is derived per node, each card at the power limit it reports plus each
reserved core at ``cpu_core_watts``. A domain with a cap of 0 or less is uncapped.

Disk: the weights are fetched once per node. Each replica on a node that does not hold
its source records the ``min_disk_gb`` it needs (``Assignment.disk_mb``); the node
reserves the largest of these once per source, while any of those replicas remains.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import replace as replace_node

from catalog.rules import (
    FACILITY_LEVELS,
    class_rank,
    cpu_only,
    effective_class,
    is_external,
    normalize,
    suggest_cores,
)
from catalog.spec import Model

DEFAULT_CPU_CORE_WATTS = 10.0
LABEL_PREFIX = "llmgw.io/"
RACK_LABEL = LABEL_PREFIX + "rack"
CLASS_NAMES = {3: "critical", 2: "standard", 1: "opportunistic"}
# How a reason starts when no node of the cluster could run the replica even were every
# node empty and taking replicas: no card of the class, no engine, too little memory...
# (an operator must change the cluster or the model; waiting will not help). The gateway
# answers such a model 503 ``model_unplaceable`` (gateway.errors).
UNPLACEABLE = "no node in this cluster can run it"

_MB_PER_GB = 1024
# A capacity a node did not report: large enough never to run out, and still an int.
_UNKNOWN = 1 << 62
_EPSILON = 1e-6


# Inputs


@dataclass(frozen=True)
class Card:
    """A GPU or MIG instance, as the inventory reports it."""

    index: int
    gpu_class: str
    memory_mb: int = 0
    power_limit_w: float = 0.0
    mig_of: int | None = None


@dataclass(frozen=True)
class Node:
    """A node as placement sees it: what it has, and whether it takes new replicas.

    ``schedulable`` is false for a cordoned, not-ready or lost node: it keeps what it
    runs and gets nothing new. ``holds`` is the weight sources it already has. A
    ``simulated`` node runs only sim profiles.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_cores: int = 0
    memory_mb: int = 0
    disk_free_mb: int = 0
    engines: Mapping[str, str] = field(default_factory=dict)
    cards: Sequence[Card] = ()
    holds: frozenset[str] | set[str] = frozenset()
    schedulable: bool = True
    simulated: bool = False


@dataclass(frozen=True)
class Domain:
    """A rack, row, room or site with a power cap; its nodes carry ``llmgw.io/<level>``."""

    level: str
    name: str
    cap_watts: float


@dataclass(frozen=True)
class Assignment:
    """A replica's share of one node: its cards and what it reserves there."""

    node: str
    cards: tuple[int, ...] = ()
    cpu_cores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    watts: float = 0.0


@dataclass(frozen=True)
class Running:
    """A replica that exists: it holds its assignments until it is stopped or evicted.

    ``disk_mb`` of an assignment is the space its fetch of ``source`` needs there (as
    placed); it is ignored on a node that already holds the source, whose reported free
    space has counted the weights already.
    """

    id: int | str
    model: str
    profile: str
    class_rank: int
    assignments: tuple[Assignment, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class PlacementProfile:
    """A catalog profile in placement's view (the reference's placement.Profile).

    A profile with a ``gpu_class`` needs ``gpus_per_node`` cards of it on each node
    (0 is read as 1); one without needs none.
    """

    name: str
    engine: str = "vllm"
    engine_version: str = ""
    gpu_class: str = ""
    gpus_per_node: int = 0
    nodes: int = 1
    priority: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    min_memory_gb: int = 0
    min_disk_gb: int = 0
    cpu_cores: int = 0
    power_watts: float = 0.0
    keep_within: str = ""
    source: str = ""


@dataclass(frozen=True)
class Request:
    """A replica wanted: its model's profiles, class rank and a stable key.

    ``priority`` orders requests within a class, higher first: the reconciler can rank a
    model's first replica above another model's third.
    """

    key: str
    model: str
    profiles: tuple[PlacementProfile, ...]
    class_rank: int = 2
    priority: int = 0
    # Running replicas this request may not evict (``place_sparing``: each the last
    # ready replica of a model no other node could hold).
    protect: frozenset[int | str] = frozenset()


# Output


@dataclass(frozen=True)
class Placement:
    """Where a requested replica goes: one assignment per node, rank 0 first."""

    key: str
    model: str
    profile: str
    source: str
    assignments: tuple[Assignment, ...]
    # Set where it could not be spread: it shares a node (or rack...) with another
    # replica of its model because no other has room; in words for the replica's reason.
    note: str = ""


@dataclass(frozen=True)
class Eviction:
    """A running replica stopped to make room for a request of a higher class."""

    running_id: int | str
    model: str
    for_key: str
    reason: str


@dataclass(frozen=True)
class Unplaced:
    """A requested replica that fits nowhere, and why."""

    key: str
    model: str
    reason: str
    # Set when no node could run it even were every node empty and taking replicas:
    # why (an operator must change the cluster or the model; waiting will not help).
    never: str = ""

    @property
    def told(self) -> str:
        """Return the reason as the replica shows it: ``UNPLACEABLE`` first if never."""
        return f"{UNPLACEABLE}: {self.never}" if self.never else self.reason


def unplaceable(reason: str) -> bool:
    """Return whether a reason says no node of the cluster could ever run the replica."""
    return reason.startswith(UNPLACEABLE)


@dataclass
class Plan:
    """What a tick should do: place these, evict those, and say why the rest wait."""

    placed: list[Placement] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    unplaced: list[Unplaced] = field(default_factory=list)


# From the catalog


def profiles_from_spec(model: Model) -> list[PlacementProfile]:
    """Return a catalog model's profiles in placement's view, in declaration order.

    The model is normalized first (a copy; the argument is left alone). An external
    model is served elsewhere and has none.
    """
    if is_external(model):
        return []
    # Only the profiles and the source matter here: normalizing (which copies) the
    # rest of the model would be most of the work of a tick.
    m = normalize(Model(name=model.name, source=model.source, profiles=model.profiles))
    return [
        PlacementProfile(
            name=p.name,
            engine=p.engine,
            engine_version=p.engine_version,
            gpu_class=p.gpu_class,
            gpus_per_node=0 if cpu_only(p) else p.gpus_per_node,
            nodes=p.nodes,
            priority=p.priority,
            node_selector=dict(p.node_selector),
            min_memory_gb=p.min_memory_gb,
            min_disk_gb=p.min_disk_gb,
            cpu_cores=p.cpu_cores,
            power_watts=p.power_watts,
            keep_within=p.keep_within.strip().lower(),
            # The source, so placement prefers nodes holding the weights.
            source=m.source,
        )
        for p in m.profiles
    ]


def requests_from_spec(model: Model, count: int, start: int = 0) -> list[Request]:
    """Return requests for replicas ``start`` to ``start + count - 1`` of a catalog model.

    Keyed ``<model>/<n>``, at the model's effective class. Replica n has priority -n, so
    within a class every model gets its first replica before any gets its second. The
    model is converted once, not once per replica.
    """
    profiles = tuple(profiles_from_spec(model))
    rank = class_rank(effective_class(model))
    return [
        Request(f"{model.name}/{n}", model.name, profiles, rank, priority=-n)
        for n in range(start, start + count)
    ]


def class_name(rank: int) -> str:
    """Return the class a rank stands for."""
    return CLASS_NAMES.get(rank, "opportunistic")


# Entry point


def place(
    nodes: Iterable[Node],
    domains: Iterable[Domain],
    running: Iterable[Running],
    requests: Iterable[Request],
    cpu_core_watts: float = DEFAULT_CPU_CORE_WATTS,
) -> Plan:
    """Return where each request goes, what it evicts, and why the rest fit nowhere.

    Raises ValueError for two nodes of one name, two running replicas of one id or two
    requests of one key.
    """
    state = _State(list(nodes), list(domains), cpu_core_watts)
    state.hold(list(running))
    reqs = list(requests)
    if len({r.key for r in reqs}) != len(reqs):
        raise ValueError("two requests share a key")
    reqs.sort(key=lambda r: (-r.class_rank, -r.priority, r.key))
    plan = Plan()
    for req in reqs:
        state.place_one(req, plan)
    return plan


@dataclass(frozen=True)
class Held:
    """A patient request kept from evicting: what it would have evicted, and why not."""

    key: str
    model: str
    evictions: tuple[Eviction, ...]
    # By evicted model: why no other node could hold it (placement's reason).
    nowhere: Mapping[str, str]

    @property
    def reason(self) -> str:
        """Return what the held request says while it waits."""
        parts = [
            f"{e.model} (#{e.running_id}; no room elsewhere: {self.nowhere[e.model]})"
            for e in self.evictions
            if e.model in self.nowhere
        ]
        return (
            "waiting for room: the only room for it holds the last ready replica of "
            + "; ".join(parts)
            + ", which it does not evict while the replica it replaces still serves"
        )


def place_sparing(
    nodes: Sequence[Node],
    domains: Sequence[Domain],
    running: Sequence[Running],
    requests: Sequence[Request],
    ready: Mapping[str, Iterable[int | str]],
    patient: Iterable[str],
    profiles: Mapping[str, tuple[PlacementProfile, ...]],
    cpu_core_watts: float = DEFAULT_CPU_CORE_WATTS,
) -> tuple[Plan, dict[str, Held]]:
    """Place as ``place`` does, but a patient request never darkens another model.

    A patient request (``patient``: keys of replacements whose replica still serves, a
    drain's or a roll's) makes before it breaks: it may not evict a model's last ready
    replica (``ready``: each model's ready running ids; a model is dark when the plan
    evicts all of them) where no other node could hold that model (``profiles`` give its
    profiles; "could hold" is a placement beside everything running, off the nodes the
    request takes, with no eviction). Such replicas are protected from that request and
    the whole plan is made again, so the request takes other room, evicting others, or
    waits. Return the plan and, by key, each request held that way (unplaced now), with
    the evictions it would have made.
    """
    waiting = set(patient)
    ready_of = {m: frozenset(ids) for m, ids in ready.items()}
    by_id = {r.id: r for r in running}
    reqs = list(requests)
    held: dict[str, Held] = {}
    nowhere_memo: dict[tuple[str, frozenset[str]], str | None] = {}

    def nowhere(model: str, rank: int, taken: frozenset[str]) -> str | None:
        """Return why no node off ``taken`` could hold a model, or None when one could."""
        memo = nowhere_memo.get((model, taken), "")
        if memo != "":
            return memo
        if not profiles.get(model):
            why: str | None = "not in the catalog"
        else:
            off = [replace_node(n, schedulable=False) if n.name in taken else n for n in nodes]
            trial = place(
                off,
                domains,
                running,
                [Request("spare", model, profiles[model], rank)],
                cpu_core_watts,
            )
            why = None if trial.placed and not trial.evictions else _why(trial)
        nowhere_memo[(model, taken)] = why
        return why

    # Each round protects at least one more replica from one request: it ends.
    while True:
        plan = place(nodes, domains, running, reqs, cpu_core_watts)
        gone = {e.running_id for e in plan.evictions}
        placed = {p.key: p for p in plan.placed}
        darkening: dict[str, list[tuple[Eviction, str]]] = {}
        for e in plan.evictions:
            v = by_id.get(e.running_id)
            if e.for_key not in waiting or v is None or e.for_key not in placed:
                continue
            mine = ready_of.get(v.model, frozenset())
            if v.id not in mine or not mine <= gone:
                continue
            taken = frozenset(a.node for a in placed[e.for_key].assignments)
            why = nowhere(v.model, v.class_rank, taken)
            if why is not None:
                darkening.setdefault(e.for_key, []).append((e, why))
        if not darkening:
            break
        for i, r in enumerate(reqs):
            found = darkening.get(r.key)
            if found:
                reqs[i] = replace_node(r, protect=r.protect | {e.running_id for e, _ in found})
                before = held.get(r.key)
                evs = (*(before.evictions if before else ()), *(e for e, _ in found))
                whys = {**(before.nowhere if before else {}), **{e.model: w for e, w in found}}
                held[r.key] = Held(r.key, r.model, evs, whys)
    still = {u.key for u in plan.unplaced}
    return plan, {k: h for k, h in held.items() if k in still}


def _why(plan: Plan) -> str:
    """Return why a one-request trial plan placed nothing (or evicted to place it)."""
    if plan.unplaced:
        return plan.unplaced[0].reason
    return "only by evicting other replicas"


@dataclass(frozen=True)
class _Need:
    """What one node must give a profile's replica."""

    cls: str
    g: int
    n: int
    mem: int
    cores: int
    disk: int
    watts: float | None  # per node; None derives it from the cards and cores
    src: str
    level: str


@dataclass
class _Hold:
    """A replica's resources on one node, in the state's terms."""

    i: int
    cards: tuple[int, ...]
    cores: int
    mem: int
    disk: int
    watts: float
    src: str


class _Buckets:
    """Node indexes grouped by a fit key, each group in name order.

    Iterating from a key walks the nodes in (key, name) order, so the first that fits
    is the best fit without sorting the cluster for every request.
    """

    def __init__(self) -> None:
        """Start with no nodes."""
        self.groups: dict[int, list[int]] = {}
        self.keys: list[int] = []

    def add(self, key: int, i: int) -> None:
        """Put node i in the group of a key."""
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = [i]
            bisect.insort(self.keys, key)
        else:
            bisect.insort(group, i)

    def remove(self, key: int, i: int) -> None:
        """Take node i out of the group of a key."""
        group = self.groups[key]
        del group[bisect.bisect_left(group, i)]
        if not group:
            del self.groups[key]
            del self.keys[bisect.bisect_left(self.keys, key)]

    def move(self, old: int, new: int, i: int) -> None:
        """Move node i from one key's group to another's."""
        if old != new:
            self.remove(old, i)
            self.add(new, i)

    def from_key(self, key: int) -> Iterator[int]:
        """Yield the nodes of every key from this one up, in (key, name) order."""
        for k in self.keys[bisect.bisect_left(self.keys, key) :]:
            yield from self.groups[k]


def _version_matches(version: str, prefix: str) -> bool:
    """Return whether an installed version starts with a prefix, by whole components."""
    if not prefix:
        return True
    if not version.startswith(prefix):
        return False
    # Whole components: "0.1" is not a prefix of 0.11.0.
    rest = version[len(prefix) :]
    return not (rest and rest[0].isdigit() and prefix[-1].isdigit())


def _gb(mb: int) -> str:
    """Return megabytes as gigabytes, as a person reads them."""
    v = mb / _MB_PER_GB
    return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"


def _w(watts: float) -> str:
    """Return watts as a person reads them."""
    return f"{watts:.0f}" if abs(watts - round(watts)) < 0.05 else f"{watts:.1f}"


def _with_cards(need: _Need) -> str:
    """Return which nodes a reason speaks of: " with L4 cards", " with 2 L4" (or none)."""
    if not need.g:
        return ""
    return f" with {need.cls} cards" if need.g == 1 else f" with {need.g} {need.cls}"


def _selector_text(sel: Mapping[str, str]) -> str:
    """Return a node selector as written in a reason: a=b,c=d."""
    return ",".join(f"{k}={sel[k]}" for k in sorted(sel))


class _State:
    """The cluster as it stands while a plan is made: what is free on each node."""

    def __init__(self, nodes: list[Node], domains: list[Domain], cpu_core_watts: float) -> None:
        """Index the nodes, their cards and domains, with nothing yet held."""
        nodes = sorted(nodes, key=lambda n: n.name)
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError("two nodes share a name")
        self.nodes = nodes
        self.index = {name: i for i, name in enumerate(names)}
        self.core_watts = cpu_core_watts
        self.mem = [n.memory_mb if n.memory_mb > 0 else _UNKNOWN for n in nodes]
        self.cores = [n.cpu_cores if n.cpu_cores > 0 else _UNKNOWN for n in nodes]
        self.disk = [n.disk_free_mb if n.disk_free_mb > 0 else _UNKNOWN for n in nodes]
        self.holds = [frozenset(n.holds) for n in nodes]
        self.labels = [n.labels for n in nodes]
        self.holders: dict[str, set[int]] = {}
        # Downloads reserved per node: source -> [replicas using it, MB reserved].
        self.fetching: list[dict[str, list[int]]] = [{} for _ in nodes]
        self.card_class: list[dict[int, str]] = []
        self.card_watts: list[dict[int, float]] = []
        self.children: list[dict[int, list[int]]] = []
        self.claims: list[dict[int, int]] = []
        self.free: list[dict[str, list[int]]] = []
        self.total: list[dict[str, int]] = []
        self.class_buckets: dict[str, _Buckets] = {}
        self.cpu_buckets = _Buckets()
        for i, n in enumerate(nodes):
            for src in n.holds:
                self.holders.setdefault(src, set()).add(i)
            self._index_cards(i, n)
        self.has_cards = [bool(t) for t in self.total]
        for i, n in enumerate(nodes):
            if not n.schedulable:
                continue
            self.cpu_buckets.add(self._cpu_key(i), i)
            for cls, count in self.total[i].items():
                self.class_buckets.setdefault(cls, _Buckets()).add(count, i)
        self._index_domains(domains)
        self.domains = domains
        self.empty: _State | None = None
        self.never_memo: dict[tuple[object, ...], str | None] = {}
        self.on_node: list[list[Running]] = [[] for _ in nodes]
        # Replicas of each model per node index: placement spreads them (``spread``).
        self.model_on: dict[str, dict[int, int]] = {}
        # Live running replicas per node, by class rank: who could make way there.
        self.ranks_on: list[dict[int, int]] = [{} for _ in nodes]
        self.holds_of: dict[int | str, list[_Hold]] = {}
        self.alive: dict[int | str, Running] = {}
        self.eligible_cache: dict[tuple[object, ...], frozenset[int]] = {}
        self.label_index: dict[str, dict[str, list[int]]] = {}
        # Placements only take capacity, so a request that failed keeps failing until
        # an eviction gives some back (``epoch`` counts them), or a placement starts
        # fetching its weights somewhere (``fetched``, per source), after which that
        # node needs no disk for them. ``commits`` only dates the reason's figures.
        self.epoch = 0
        self.commits = 0
        self.fetched: dict[str, int] = {}
        self.failed: dict[tuple[object, ...], tuple[int, int, int, str]] = {}

    def _index_cards(self, i: int, n: Node) -> None:
        """Record node i's cards: classes, power limits, MIG parents and what is free."""
        classes = {c.index: c.gpu_class for c in n.cards}
        children: dict[int, list[int]] = {}
        for c in n.cards:
            if c.mig_of is not None and c.mig_of != c.index:
                children.setdefault(c.mig_of, []).append(c.index)
        free: dict[str, list[int]] = {}
        for idx in sorted(classes):
            if idx not in children:
                free.setdefault(classes[idx], []).append(idx)
        self.card_class.append(classes)
        self.card_watts.append({c.index: max(c.power_limit_w, 0.0) for c in n.cards})
        self.children.append(children)
        self.claims.append(dict.fromkeys(classes, 0))
        self.free.append(free)
        self.total.append({cls: len(idx) for cls, idx in free.items()})

    def _index_domains(self, domains: list[Domain]) -> None:
        """Record the capped domains and which of them each node is in."""
        caps: dict[tuple[str, str], float] = {}
        for d in domains:
            if d.cap_watts > 0:
                key = (d.level.strip().lower(), d.name)
                # Two caps on one domain: the stricter holds.
                caps[key] = min(caps.get(key, d.cap_watts), d.cap_watts)
        self.domain_names = sorted(caps)
        ids = {key: j for j, key in enumerate(self.domain_names)}
        self.cap = [caps[key] for key in self.domain_names]
        self.used = [0.0] * len(self.cap)
        self.node_domains: list[tuple[int, ...]] = []
        for n in self.nodes:
            mine = []
            for level in FACILITY_LEVELS:
                name = n.labels.get(LABEL_PREFIX + level)
                if name is not None and (level, name) in ids:
                    mine.append(ids[(level, name)])
            self.node_domains.append(tuple(mine))

    def _cpu_key(self, i: int) -> int:
        """Return node i's place in the best-fit order of CPU profiles."""
        # Nodes without cards first, keeping GPU nodes' hosts for GPU replicas; then
        # the fewest free cores, keeping large holes for large CPU replicas.
        cores = min(max(self.cores[i], 0), 1 << 40)
        return (1 << 41 if self.has_cards[i] else 0) + cores

    # Holding and releasing

    def hold(self, running: list[Running]) -> None:
        """Count running replicas against their nodes."""
        for r in sorted(running, key=lambda r: str(r.id)):
            if r.id in self.alive:
                raise ValueError(f"two running replicas share the id {r.id}")
            self.alive[r.id] = r
            holds = []
            for a in r.assignments:
                i = self.index.get(a.node)
                if i is None:
                    continue  # a node that is gone holds nothing
                cards = tuple(c for c in a.cards if c in self.card_class[i])
                holds.append(
                    _Hold(i, cards, a.cpu_cores, a.memory_mb, a.disk_mb, a.watts, r.source)
                )
                if not self.on_node[i] or self.on_node[i][-1] is not r:
                    self.on_node[i].append(r)
                    ranks = self.ranks_on[i]
                    ranks[r.class_rank] = ranks.get(r.class_rank, 0) + 1
            self.holds_of[r.id] = holds
            self._apply(holds, 1)
            self.count_model(r.model, {h.i for h in holds}, 1)

    def _apply(self, holds: list[_Hold], sign: int) -> None:
        """Take (sign 1) or give back (sign -1) what these holds use."""
        for h in holds:
            i = h.i
            for c in h.cards:
                self._claim(i, c, sign)
                for child in self.children[i].get(c, ()):
                    self._claim(i, child, sign)
            if h.cores:
                old = self._cpu_key(i)
                self.cores[i] -= sign * h.cores
                if self.nodes[i].schedulable:
                    self.cpu_buckets.move(old, self._cpu_key(i), i)
            self.mem[i] -= sign * h.mem
            self._fetch(i, h, sign)
            for d in self.node_domains[i]:
                self.used[d] += sign * h.watts

    def _fetch(self, i: int, h: _Hold, sign: int) -> None:
        """Reserve or release a hold's disk for fetching its weights to node i."""
        if h.src in self.holds[i]:
            return
        if not h.src:
            self.disk[i] -= sign * h.disk
            return
        entry = self.fetching[i].get(h.src)
        if sign > 0:
            if entry is None:
                entry = self.fetching[i][h.src] = [0, 0]
            entry[0] += 1
            if h.disk > entry[1]:
                self.disk[i] -= h.disk - entry[1]
                entry[1] = h.disk
        elif entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                self.disk[i] += entry[1]
                del self.fetching[i][h.src]

    def _claim(self, i: int, c: int, sign: int) -> None:
        """Count a claim on card c of node i (or drop one), keeping the free lists."""
        claims = self.claims[i]
        before = claims[c]
        claims[c] = before + sign
        if c in self.children[i]:
            return  # never offered whole
        cls = self.card_class[i][c]
        free = self.free[i].setdefault(cls, [])
        count = len(free)
        if sign > 0 and before == 0:
            del free[bisect.bisect_left(free, c)]
        elif sign < 0 and before == 1:
            bisect.insort(free, c)
        else:
            return
        if self.nodes[i].schedulable:
            self.class_buckets[cls].move(count, len(free), i)

    # Fitting

    def need(self, p: PlacementProfile) -> _Need:
        """Return what each node of a replica of profile p must give."""
        n = max(p.nodes, 1)
        g = max(p.gpus_per_node, 1) if p.gpu_class else 0
        return _Need(
            cls=p.gpu_class,
            g=g,
            n=n,
            mem=max(p.min_memory_gb, 0) * _MB_PER_GB,
            cores=max(p.cpu_cores, 0),
            disk=max(p.min_disk_gb, 0) * _MB_PER_GB,
            watts=p.power_watts / n if p.power_watts > 0 else None,
            src=p.source,
            level=p.keep_within.strip().lower() if n > 1 else "",
        )

    def eligible(self, p: PlacementProfile) -> frozenset[int]:
        """Return the schedulable nodes whose engine, labels and kind suit p."""
        sel = tuple(sorted(p.node_selector.items()))
        key = (p.engine, p.engine_version, sel)
        found = self.eligible_cache.get(key)
        if found is None:
            found = frozenset(i for i in range(len(self.nodes)) if self._static_ok(i, p))
            self.eligible_cache[key] = found
        return found

    def _static_ok(self, i: int, p: PlacementProfile) -> bool:
        """Return whether node i suits p whatever is free on it."""
        n = self.nodes[i]
        if not n.schedulable:
            return False
        if p.engine == "sim":
            # The sim engine is built into every agent; it may run on any card.
            version = n.engines.get("sim", "")
        else:
            if n.simulated or p.engine not in n.engines:
                return False
            version = n.engines[p.engine]
        if not _version_matches(version, p.engine_version):
            return False
        labels = n.labels
        return all(labels.get(k) == v for k, v in p.node_selector.items())

    def cards_for(self, i: int, need: _Need) -> list[int]:
        """Return the cards a replica would take on node i: the lowest free of its class."""
        return self.free[i].get(need.cls, [])[: need.g] if need.g else []

    def watts(self, i: int, need: _Need) -> float:
        """Return what a replica's share on node i draws."""
        if need.watts is not None:
            return need.watts
        cw = self.card_watts[i]
        return sum(cw[c] for c in self.cards_for(i, need)) + need.cores * self.core_watts

    def disk_needed(self, i: int, need: _Need) -> int:
        """Return the disk still to reserve on node i for a replica's weights."""
        if not need.disk or need.src in self.holds[i]:
            return 0
        entry = self.fetching[i].get(need.src) if need.src else None
        return max(need.disk - entry[1], 0) if entry else need.disk

    def fits(self, i: int, need: _Need) -> bool:
        """Return whether node i has room for one node's share of a replica."""
        if need.g and len(self.free[i].get(need.cls, ())) < need.g:
            return False
        if self.mem[i] < need.mem or self.cores[i] < need.cores:
            return False
        if need.disk and self.disk[i] < self.disk_needed(i, need):
            return False
        domains = self.node_domains[i]
        if domains:
            w = self.watts(i, need)
            used, cap = self.used, self.cap
            for d in domains:
                if used[d] + w > cap[d] + _EPSILON:
                    return False
        return True

    def fit_key(self, i: int, need: _Need) -> int:
        """Return node i's place in the best-fit order (lower is tighter)."""
        return len(self.free[i].get(need.cls, ())) if need.g else self._cpu_key(i)

    def _walk(self, need: _Need) -> Iterator[int]:
        """Yield schedulable nodes that may have room, best fit first."""
        if not need.g:
            return self.cpu_buckets.from_key(0)
        buckets = self.class_buckets.get(need.cls)
        return buckets.from_key(need.g) if buckets else iter(())

    def find(self, need: _Need, elig: frozenset[int], model: str = "") -> list[int]:
        """Return the best nodes for a replica, or [] when none fit.

        A one-node replica goes where its model has the fewest replicas: on the node,
        then in its rack (``spread``); then on a node holding the weights, then the best
        fit.
        """
        if need.n > 1:
            return self._find_multi(need, elig)
        holders = self.holders.get(need.src) if need.src else None
        mine = self.model_on.get(model) if model else None
        if not mine:
            if holders:
                best = min(
                    ((self.fit_key(i, need), i) for i in holders & elig if self.fits(i, need)),
                    default=None,
                )
                if best is not None:
                    return [best[1]]
            for i in self._walk(need):
                if i in elig and self.fits(i, need):
                    return [i]
            return []
        found: tuple[tuple[int, int], int, int] | None = None
        if holders:
            for _, i in sorted(
                (self.fit_key(i, need), i) for i in holders & elig if self.fits(i, need)
            ):
                score = self.spread(model, i)
                if not any(score):
                    return [i]
                if found is None or (score, 0) < found[:2]:
                    found = (score, 0, i)
        for i in self._walk(need):
            if i in elig and self.fits(i, need):
                score = self.spread(model, i)
                if not any(score):
                    return [i]
                if found is None or (score, 1) < found[:2]:
                    found = (score, 1, i)
        return [found[2]] if found else []

    def spread(self, model: str, i: int) -> tuple[int, int]:
        """Return how many replicas of a model node i would share with: on the node, then
        in its rack (where it carries ``llmgw.io/rack``)."""
        mine = self.model_on.get(model, {})
        rack = self.labels[i].get(RACK_LABEL)
        shared = sum(k for j, k in mine.items() if self.labels[j].get(RACK_LABEL) == rack)
        return (mine.get(i, 0), shared if rack else 0)

    def count_model(self, model: str, nodes: Iterable[int], sign: int) -> None:
        """Count a replica of a model on these nodes (sign 1), or stop counting it (-1)."""
        mine = self.model_on.setdefault(model, {})
        for i in set(nodes):
            mine[i] = mine.get(i, 0) + sign
            if mine[i] <= 0:
                del mine[i]

    def _find_multi(self, need: _Need, elig: frozenset[int]) -> list[int]:
        """Return ``need.n`` nodes for a multi-node replica, or [].

        Groups holding the weights are tried first, whole; then the nodes are walked in
        best-fit order, and the first group to gather enough of them (with power for
        all) wins, which keeps the smallest holes in use.
        """
        label = LABEL_PREFIX + need.level if need.level else ""
        labels = self.labels
        holders = self.holders.get(need.src, set()) & elig if need.src else set()
        if label:
            names = sorted(
                {labels[i][label] for i in holders if labels[i].get(label) and self.fits(i, need)}
            )
            best: tuple[tuple[int, int, str], list[int]] | None = None
            for name in names:
                members = [
                    i for i in self._members(label, name) if i in elig and self.fits(i, need)
                ]
                chosen, _ = self._choose(need, members)
                if chosen:
                    held = sum(need.src in self.holds[i] for i in chosen)
                    score = (-held, sum(self.fit_key(i, need) for i in chosen), name)
                    if best is None or score < best[0]:
                        best = (score, chosen)
            if best:
                return best[1]
            found: dict[str, list[int]] = {}
        else:
            # One group, the holders in it from the start: _choose puts them first.
            found = {"": sorted(i for i in holders if self.fits(i, need))}
        for i in self._walk(need):
            if i not in elig or i in holders or not self.fits(i, need):
                continue
            name = labels[i].get(label) if label else ""
            if name is None or (label and not name):
                continue
            members = found.setdefault(name, [])
            members.append(i)
            if len(members) >= need.n:
                chosen, _ = self._choose(need, members)
                if chosen:
                    return chosen
        members = found.get("", [])
        if not label and len(members) >= need.n:
            return self._choose(need, members)[0]
        return []

    def _members(self, label: str, name: str) -> list[int]:
        """Return the nodes labelled name (rack r1, say), in name order."""
        index = self.label_index.get(label)
        if index is None:
            index = self.label_index[label] = {}
            for i, n in enumerate(self.nodes):
                value = n.labels.get(label)
                if value:
                    index.setdefault(value, []).append(i)
        return index.get(name, [])

    def _groups(self, need: _Need, nodes: list[int]) -> dict[str, list[int]]:
        """Return nodes grouped by their keep_within domain (one group without it)."""
        if not need.level:
            return {"": nodes}
        label = LABEL_PREFIX + need.level
        groups: dict[str, list[int]] = {}
        for i in nodes:
            value = self.nodes[i].labels.get(label)
            if value:
                groups.setdefault(value, []).append(i)
        return groups

    def _choose(self, need: _Need, members: list[int]) -> tuple[list[int], str]:
        """Pick ``need.n`` nodes from members, counting their power together.

        Returns the nodes, or [] and the power cap that stopped it.
        """
        order = sorted(
            members, key=lambda i: (need.src not in self.holds[i], self.fit_key(i, need), i)
        )
        extra: dict[int, float] = {}
        chosen: list[int] = []
        blocked = ""
        for i in order:
            w = self.watts(i, need)
            over = [
                d
                for d in self.node_domains[i]
                if self.used[d] + extra.get(d, 0.0) + w > self.cap[d] + _EPSILON
            ]
            if over:
                d = over[0]
                blocked = blocked or self._power_text(d, self.used[d] + extra.get(d, 0.0), w)
                continue
            chosen.append(i)
            for d in self.node_domains[i]:
                extra[d] = extra.get(d, 0.0) + w
            if len(chosen) == need.n:
                return chosen, ""
        return [], blocked

    def _power_text(self, d: int, used: float, needs: float) -> str:
        """Return the reason a domain's power cap gives."""
        level, name = self.domain_names[d]
        return (
            f"power cap of {level} {name} ({_w(self.cap[d])} W) would be exceeded: "
            f"{_w(used)} W used, needs {_w(needs)} W"
        )

    def commit(self, need: _Need, chosen: list[int]) -> tuple[Assignment, ...]:
        """Take the chosen nodes' room for a replica; return its assignments."""
        self.commits += 1
        if need.src:
            self.fetched[need.src] = self.fetched.get(need.src, 0) + 1
        out = []
        holds = []
        for i in chosen:
            cards = tuple(self.cards_for(i, need))
            w = self.watts(i, need)
            # The whole need, even when another replica's fetch already reserved part:
            # the reservation is the largest of those fetching the source, kept while
            # any of them remains.
            disk = need.disk if need.src not in self.holds[i] else 0
            holds.append(_Hold(i, cards, need.cores, need.mem, disk, w, need.src))
            out.append(Assignment(self.nodes[i].name, cards, need.cores, need.mem, disk, w))
            # Apply node by node: the next node's derived watts read its own cards.
            self._apply([holds[-1]], 1)
        return tuple(out)

    # Evicting

    def evict_for(
        self,
        rank: int,
        need: _Need,
        elig: frozenset[int],
        protect: frozenset[int | str] = frozenset(),
    ) -> tuple[list[int], list[Running]] | None:
        """Find the cheapest lower-class replicas whose eviction makes room, and evict them.

        Returns the nodes to place on and the evicted, or None (nothing changed).
        """
        options: list[tuple[tuple[int, int, int, int], int, list[Running]]] = []
        holders = self.holders.get(need.src, set()) & elig if need.src else set()
        # Holders first, so the first node where one opportunistic replica makes room is
        # the best there is, and the search of a full cluster can stop there.
        for i in [*sorted(holders), *sorted(elig - holders)]:
            if need.n == 1 and not self._evictable(i, rank):
                continue
            if self.fits(i, need):
                options.append(((0, 0, i not in holders, i), i, []))
                continue
            victims = self._victims(i, rank, need, protect)
            if victims is not None:
                top = max(v.class_rank for v in victims)
                options.append(((top, len(victims), i not in holders, i), i, victims))
                if need.n == 1 and top == 1 and len(victims) == 1:
                    break
        if need.n == 1:
            for _, i, victims in sorted(options, key=lambda o: o[0]):
                for v in victims:
                    self._release(v)
                # Counted without releasing anything; this checks the count held.
                if self.fits(i, need):
                    return [i], victims
                for v in victims:
                    self._reclaim(v)
            return None
        by_node = {i: (cost, victims) for cost, i, victims in options}
        trials = []
        for name, members in self._groups(need, sorted(by_node)).items():
            if len(members) < need.n:
                continue
            cheapest = sorted(members, key=lambda i: by_node[i][0])[: need.n]
            victims = {}
            for i in cheapest:
                for v in by_node[i][1]:
                    victims[v.id] = v
            if not victims:
                continue  # it would have fit without evicting; power stopped it
            picked = [victims[k] for k in sorted(victims, key=str)]
            cost = (max(v.class_rank for v in picked), len(picked), name)
            trials.append((cost, cheapest, picked))
        for _, cheapest, picked in sorted(trials, key=lambda t: t[0]):
            for v in picked:
                self._release(v)
            chosen = self._find_multi(need, elig & frozenset(cheapest))
            if chosen:
                return chosen, picked
            for v in picked:
                self._reclaim(v)
        return None

    def _evictable(self, i: int, rank: int) -> bool:
        """Return whether node i runs a live replica of a class below rank."""
        return any(count for r, count in self.ranks_on[i].items() if r < rank)

    def _victims(
        self, i: int, rank: int, need: _Need, protect: frozenset[int | str] = frozenset()
    ) -> list[Running] | None:
        """Return the fewest, lowest-class replicas on node i whose going makes room."""
        lower = [
            r
            for r in self.on_node[i]
            if r.class_rank < rank and r.id in self.alive and r.id not in protect
        ]
        if not lower or not self._could_fit(i, need):
            return None
        useful = {r.id: self._freed(i, r, need.cls) for r in lower}
        # A cheap bound first: if all of them together are not enough, no few of them are.
        mine = [h for r in lower for h in self.holds_of[r.id] if h.i == i]
        if (
            len(self.free[i].get(need.cls, ())) + sum(useful.values()) < need.g
            or self.mem[i] + sum(h.mem for h in mine) < need.mem
            or self.cores[i] + sum(h.cores for h in mine) < need.cores
        ):
            return None
        order = sorted(lower, key=lambda r: (r.class_rank, -useful[r.id], str(r.id)))
        chosen: list[Running] = []
        for r in order:
            chosen.append(r)
            if self._fits_without(i, need, chosen):
                break
        else:
            return None
        # Keep only those needed: try sparing the higher classes first.
        for r in reversed(list(chosen)):
            rest = [v for v in chosen if v is not r]
            if rest and self._fits_without(i, need, rest):
                chosen = rest
        return chosen

    def _fits_without(self, i: int, need: _Need, victims: list[Running]) -> bool:
        """Return whether node i would fit a replica were these replicas gone.

        Counted on the side, without releasing them: trying victims on every node of a
        full cluster by releasing and taking back would be most of a tick.
        """
        holds = [h for r in victims for h in self.holds_of[r.id]]
        here = [h for h in holds if h.i == i]
        if (
            self.mem[i] + sum(h.mem for h in here) < need.mem
            or self.cores[i] + sum(h.cores for h in here) < need.cores
        ):
            return False
        take: list[int] = []
        if need.g:
            classes, children, claims = self.card_class[i], self.children[i], self.claims[i]
            dropped: dict[int, int] = {}
            for h in here:
                for c in h.cards:
                    for x in (c, *children.get(c, ())):
                        dropped[x] = dropped.get(x, 0) + 1
            freed = [
                x
                for x, k in dropped.items()
                if claims[x] == k and x not in children and classes[x] == need.cls
            ]
            cards = sorted(self.free[i].get(need.cls, []) + freed)
            if len(cards) < need.g:
                return False
            take = cards[: need.g]
        if need.disk and need.src not in self.holds[i] and not self._disk_without(i, need, here):
            return False
        if self.node_domains[i]:
            cw = self.card_watts[i]
            w = need.watts
            if w is None:
                w = sum(cw[c] for c in take) + need.cores * self.core_watts
            for d in self.node_domains[i]:
                gone = sum(h.watts for h in holds if d in self.node_domains[h.i])
                if self.used[d] - gone + w > self.cap[d] + _EPSILON:
                    return False
        return True

    def _disk_without(self, i: int, need: _Need, here: list[_Hold]) -> bool:
        """Return whether node i would have the disk for a replica without these holds."""
        disk = self.disk[i]
        users: dict[str, int] = {}
        for h in here:
            if h.src in self.holds[i]:
                continue
            if h.src:
                users[h.src] = users.get(h.src, 0) + 1
            else:
                disk += h.disk
        fetching = self.fetching[i]
        for src, k in users.items():
            entry = fetching.get(src)
            if entry and entry[0] == k:
                disk += entry[1]
        entry = fetching.get(need.src) if need.src else None
        kept = entry[1] if entry and entry[0] > users.get(need.src, 0) else 0
        return disk >= max(need.disk - kept, 0)

    def _freed(self, i: int, r: Running, cls: str) -> int:
        """Return how many cards of a class r holds on node i (MIG instances included)."""
        if not cls:
            return 0
        classes, children = self.card_class[i], self.children[i]
        return sum(
            classes[x] == cls and x not in children
            for h in self.holds_of[r.id]
            if h.i == i
            for c in h.cards
            for x in (c, *children.get(c, ()))
        )

    def _could_fit(self, i: int, need: _Need) -> bool:
        """Return whether node i, emptied, would be big enough."""
        n = self.nodes[i]
        if need.g and self.total[i].get(need.cls, 0) < need.g:
            return False
        if n.memory_mb > 0 and n.memory_mb < need.mem:
            return False
        return not (n.cpu_cores > 0 and n.cpu_cores < need.cores)

    def _release(self, r: Running) -> None:
        """Give back what a running replica holds."""
        self._apply(self.holds_of[r.id], -1)

    def _reclaim(self, r: Running) -> None:
        """Take again what a released running replica held."""
        self._apply(self.holds_of[r.id], 1)

    # One request

    def place_one(self, req: Request, plan: Plan) -> None:
        """Place one request, evicting if it must, or record why it cannot be placed."""
        if not req.profiles:
            plan.unplaced.append(Unplaced(req.key, req.model, "has no profiles to place"))
            return
        profiles = sorted(req.profiles, key=lambda p: -p.priority)
        tries = [(p, self.need(p), self.eligible(p)) for p in profiles]
        memo_key = (req.class_rank, req.protect, *(_profile_key(p) for p in profiles))
        fetched = sum(self.fetched.get(p.source, 0) for p in profiles)
        memo = self.failed.get(memo_key)
        if memo is not None and memo[:2] == (self.epoch, fetched):
            reason = memo[3] if memo[2] == self.commits else self._reason(req, tries)
            self.failed[memo_key] = (self.epoch, fetched, self.commits, reason)
            plan.unplaced.append(Unplaced(req.key, req.model, reason, self._never(req) or ""))
            return
        for p, need, elig in tries:
            if need.level and need.level not in FACILITY_LEVELS:
                continue
            if need.g == 0 and p.gpus_per_node > 0:
                continue
            chosen = self.find(need, elig, req.model)
            if chosen:
                self._record(req, p, need, chosen, plan)
                return
        for p, need, elig in tries:
            if (need.level and need.level not in FACILITY_LEVELS) or (
                need.g == 0 and p.gpus_per_node > 0
            ):
                continue
            found = self.evict_for(req.class_rank, need, elig, req.protect)
            if found:
                chosen, victims = found
                where = ", ".join(self.nodes[i].name for i in chosen)
                for v in victims:
                    del self.alive[v.id]
                    self.count_model(v.model, {h.i for h in self.holds_of[v.id]}, -1)
                    for i in {h.i for h in self.holds_of[v.id]}:
                        self.ranks_on[i][v.class_rank] -= 1
                    plan.evictions.append(
                        Eviction(
                            v.id,
                            v.model,
                            req.key,
                            f"evicted for {req.model} ({class_name(req.class_rank)}), "
                            f"which needs its room on {where}",
                        )
                    )
                self.epoch += 1
                self._record(req, p, need, chosen, plan)
                return
        reason = self._reason(req, tries)
        self.failed[memo_key] = (self.epoch, fetched, self.commits, reason)
        plan.unplaced.append(Unplaced(req.key, req.model, reason, self._never(req) or ""))

    def _record(
        self, req: Request, p: PlacementProfile, need: _Need, chosen: list[int], plan: Plan
    ) -> None:
        """Commit a request's replica to the chosen nodes and add it to the plan."""
        score = self.spread(req.model, chosen[0]) if len(chosen) == 1 else ()
        note = ""
        if score and score[0]:
            note = (
                f"beside another replica of {req.model} on {self.nodes[chosen[0]].name}: "
                "no other node has room for it"
            )
        elif score and score[1]:
            note = (
                f"in rack {self.labels[chosen[0]][RACK_LABEL]} beside another replica of "
                f"{req.model}: no node in another rack has room for it"
            )
        assignments = self.commit(need, chosen)
        self.count_model(req.model, chosen, 1)
        plan.placed.append(Placement(req.key, req.model, p.name, p.source, assignments, note))

    # Reasons

    def _reason(
        self, req: Request, tries: list[tuple[PlacementProfile, _Need, frozenset[int]]]
    ) -> str:
        """Return why a request fits nowhere: each profile's closest miss, in order tried."""
        parts = [(p, self.diagnose(p, need)) for p, need, _ in tries]
        if len(parts) == 1:
            text = parts[0][1]
        else:
            text = ". ".join(f'profile "{p.name}": {why}' for p, why in parts)
        lower = any(self._evictable(i, req.class_rank) for _, _, elig in tries for i in elig)
        if lower:
            text += " (evicting lower-class replicas would not make room)"
        return text

    def _never(self, req: Request) -> str | None:
        """Return why no node could run req even were all of them empty and taking
        replicas, or None when one could (or the cluster has no node yet to judge by).

        Counted on the cluster as built: every card, the whole memory and cores, every
        power cap with nothing drawing; not the disk, which is free or not as weights come
        and go.
        """
        if not self.nodes:
            return None
        key = tuple(_profile_key(p) for p in req.profiles)
        if key in self.never_memo:
            return self.never_memo[key]
        if self.empty is None:
            self.empty = _State(
                [
                    replace_node(n, schedulable=True, disk_free_mb=0, holds=frozenset())
                    for n in self.nodes
                ],
                self.domains,
                self.core_watts,
            )
        empty = self.empty
        profiles = sorted(req.profiles, key=lambda p: -p.priority)
        tries = [(p, empty.need(p), empty.eligible(p)) for p in profiles]
        why: str | None = None
        if not any(
            not (need.level and need.level not in FACILITY_LEVELS)
            and not (need.g == 0 and p.gpus_per_node > 0)
            and empty.find(need, elig)
            for p, need, elig in tries
        ):
            parts = [(p, empty.diagnose(p, need)) for p, need, _ in tries]
            why = (
                parts[0][1]
                if len(parts) == 1
                else ". ".join(f'profile "{p.name}": {w}' for p, w in parts)
            )
        self.never_memo[key] = why
        return why

    def diagnose(self, p: PlacementProfile, need: _Need) -> str:
        """Return why no node (or set of nodes) fits p, naming the constraint that bound.

        Each node is checked against every condition (``_misses``). A condition binds
        when the nodes that miss only it, with those that miss nothing, would be enough:
        the first such condition, in the order of ``_CONDITIONS``, is told, with the best
        of those nodes. Where no single condition would be enough (nodes that miss
        several), the conditions are walked in turn and the first that leaves too few
        nodes is told (``_staged``).
        """
        if need.level and need.level not in FACILITY_LEVELS:
            return self._staged(p, need)
        if need.g == 0 and p.gpus_per_node > 0:
            return self._staged(p, need)
        nn = need.n
        misses = [self._misses(i, p, need) for i in range(len(self.nodes))]
        fit = [i for i, m in enumerate(misses) if not m]
        if len(fit) >= nn:
            # Enough nodes each fit: what binds is how they group (keep_within, power).
            return self._staged(p, need)
        # The cards first: a reason never says no node has them where some node has,
        # so the nodes that have them are the ones whose miss is told.
        pool = list(range(len(self.nodes)))
        if need.g:
            has = [i for i in pool if self.total[i].get(need.cls, 0) > 0]
            if len(has) >= nn:
                pool = has
            enough = [i for i in pool if self.total[i].get(need.cls, 0) >= need.g]
            if len(enough) >= nn:
                pool = enough
        for cond in _CONDITIONS:
            only = [i for i in pool if misses[i] == (cond,)]
            if only and len(fit) + len(only) >= nn:
                return self._bound(cond, p, need, only, len(fit))
        return self._staged(p, need)

    def _misses(self, i: int, p: PlacementProfile, need: _Need) -> tuple[str, ...]:
        """Return the conditions node i misses for p, one per kind, in ``_CONDITIONS`` order.

        Conditions of one kind are a chain: a node without the engine is not also said
        to lack its version, one without cards of the class not also to lack free ones.
        """
        n = self.nodes[i]
        out = set()
        if not n.schedulable:
            out.add("ready")
        if p.engine != "sim" and n.simulated:
            out.add("real")
        elif p.engine != "sim" and p.engine not in n.engines:
            out.add("engine")
        elif not _version_matches(n.engines.get(p.engine, ""), p.engine_version):
            out.add("version")
        if not all(n.labels.get(k) == v for k, v in p.node_selector.items()):
            out.add("selector")
        if need.level and not n.labels.get(LABEL_PREFIX + need.level):
            out.add("label")
        if need.g:
            total = self.total[i].get(need.cls, 0)
            if total == 0:
                out.add("class")
            elif total < need.g:
                out.add("count")
            elif len(self.free[i].get(need.cls, ())) < need.g:
                out.add("free")
        if self.mem[i] < need.mem:
            out.add("memory")
        if self.cores[i] < need.cores:
            out.add("cores")
        if need.disk and self.disk[i] < self.disk_needed(i, need):
            out.add("disk")
        if self.node_domains[i]:
            w = self.watts(i, need)
            if any(self.used[d] + w - self.cap[d] > _EPSILON for d in self.node_domains[i]):
                out.add("power")
        return tuple(c for c in _CONDITIONS if c in out)

    def _bound(self, cond: str, p: PlacementProfile, need: _Need, only: list[int], fit: int) -> str:
        """Return the reason a binding condition gives, over the nodes that miss only it."""
        nn = need.n
        nodes = self.nodes
        names = ", ".join(nodes[i].name for i in only[:3]) + (", …" if len(only) > 3 else "")
        q = _with_cards(need)
        what = f"{need.g} free {need.cls}" if need.g else "room for it"

        def short(each: str) -> str:
            return f"needs {nn} nodes each with {each}; found {fit}"

        if cond == "ready":
            if not any(n.schedulable for n in nodes):
                return "no node is ready for new replicas"
            where = f"only nodes that take no new replicas (cordoned, not ready or lost) have {what}: {names}"
            return where if nn == 1 else f"{short(what)} ({where})"
        if cond == "real":
            text = (
                f"only simulated nodes have {what} ({names}), "
                f"and they run only sim profiles, not {p.engine}"
            )
            return text if nn == 1 else f"{short('real cards')}: {text}"
        if cond == "class":
            return f"no node has {need.cls} cards" if nn == 1 or not fit else short(need.cls)
        if cond == "count":
            if nn == 1:
                most = max(t.get(need.cls, 0) for t in self.total)
                return f"needs {need.g} {need.cls} on one node; the largest node has {most}"
            return short(f"{need.g} {need.cls}")
        if cond == "engine":
            if nn > 1:
                return short(f"engine {p.engine}")
            return self._no_node(need, f"no node{q} has engine {p.engine}", only,
                                 f"engine {p.engine}", self._has_engine(p))  # fmt: skip
        if cond == "version":
            versions = sorted({nodes[i].engines.get(p.engine, "") for i in only} - {""})
            found = f" (found {', '.join(versions[:3])})" if versions else ""
            if nn == 1:
                return self._no_node(
                    need, f"no node{q} has engine {p.engine} {p.engine_version}{found}", only,
                    f"engine {p.engine} {p.engine_version}{found}", self._has_version(p),
                )  # fmt: skip
            return short(f"engine {p.engine} {p.engine_version}")
        if cond == "selector":
            sel = _selector_text(p.node_selector)
            if nn > 1:
                return short(f"node_selector {sel}")
            return self._no_node(need, f"no node{q} matches node_selector {sel}", only,
                                 f"node_selector {sel}", self._has_labels(p))  # fmt: skip
        if cond == "label":
            label = LABEL_PREFIX + need.level
            return f"keep_within {need.level}: {short(f'a {label} label')}"
        if cond == "free":
            if nn == 1:
                best = max(len(self.free[i].get(need.cls, ())) for i in only)
                return f"needs {need.g} free {need.cls} on one node; the best node has {best}"
            return short(what)
        stage = {
            "memory": self._memory_stage,
            "cores": self._cores_stage,
            "disk": self._disk_stage,
            "power": self._power_stage,
        }[cond]
        _, text, each = stage(only, need)
        return text if nn == 1 else short(each)

    def _staged(self, p: PlacementProfile, need: _Need) -> str:
        """Return why no node fits p: the stage where the last nodes fell out.

        Walks the nodes through each condition in turn; the first condition that leaves
        too few nodes is the closest miss, told with the best node it dropped.
        """
        if need.level and need.level not in FACILITY_LEVELS:
            return f'keep_within "{p.keep_within}" is not one of {", ".join(FACILITY_LEVELS)}'
        if need.g == 0 and p.gpus_per_node > 0:
            return (
                f"names no gpu_class but asks for {p.gpus_per_node} GPUs per node; "
                "only a llamacpp profile runs without a GPU"
            )
        nn = need.n
        nodes = self.nodes
        what = f"{need.g} free {need.cls}" if need.g else "room for it"

        def short(found: int, each: str) -> str:
            """Return the reason for too few nodes of a multi-node profile."""
            return f"needs {nn} nodes each with {each}; found {found}"

        c = [i for i in range(len(nodes)) if nodes[i].schedulable]
        if len(c) < nn:
            return (
                "no node is ready for new replicas"
                if not c
                else f"needs {nn} ready nodes; found {len(c)}"
            )
        if p.engine != "sim":
            real = [i for i in c if not nodes[i].simulated]
            if len(real) < nn:
                return (
                    f"only simulated nodes are ready, and they run only sim profiles, "
                    f"not {p.engine}"
                    if not real
                    else short(len(real), "real cards")
                )
            c = real
        q = ""
        if need.g:
            kept = [i for i in c if self.total[i].get(need.cls, 0) > 0]
            if len(kept) < nn:
                return self._class_missing(p, need, c, kept)
            c = kept
            kept = [i for i in c if self.total[i][need.cls] >= need.g]
            if len(kept) < nn:
                return self._class_missing(p, need, c, kept, need.g)
            # A node with fewer cards of the class than a replica needs never fits it.
            c = kept
            q = _with_cards(need)
        has = self._has_engine(p)
        kept = [i for i in c if has(i)]
        if len(kept) < nn:
            if nn == 1 or not kept:
                return self._no_node(
                    need, f"no node{q} has engine {p.engine}", c, f"engine {p.engine}", has
                )
            return short(len(kept), f"engine {p.engine}")
        c = kept
        has = self._has_version(p)
        kept = [i for i in c if has(i)]
        if len(kept) < nn:
            versions = sorted({nodes[i].engines.get(p.engine, "") for i in c} - {""})
            found = f" (found {', '.join(versions[:3])})" if versions else ""
            if nn == 1 or not kept:
                what = f"engine {p.engine} {p.engine_version}{found}"
                return self._no_node(need, f"no node{q} has {what}", c, what, has)
            return short(len(kept), f"engine {p.engine} {p.engine_version}")
        c = kept
        kept = [i for i in c if self._static_ok(i, p)]
        if len(kept) < nn:
            sel = _selector_text(p.node_selector)
            if nn == 1 or not kept:
                return self._no_node(need, f"no node{q} matches node_selector {sel}", c,
                                     f"node_selector {sel}", self._has_labels(p))  # fmt: skip
            return short(len(kept), f"node_selector {sel}")
        c = kept
        if need.level:
            label = LABEL_PREFIX + need.level
            kept = [i for i in c if nodes[i].labels.get(label)]
            if len(kept) < nn:
                return f"keep_within {need.level}: {short(len(kept), f'a {label} label')}"
            c = kept
        # Capacity, as it stands now.
        if need.g:
            kept = [i for i in c if len(self.free[i].get(need.cls, ())) >= need.g]
            if len(kept) < nn:
                best = max(len(self.free[i].get(need.cls, ())) for i in c)
                if nn == 1:
                    return f"needs {need.g} free {need.cls} on one node; the best node has {best}"
                return short(len(kept), what)
            c = kept
        for stage in (self._memory_stage, self._cores_stage, self._disk_stage, self._power_stage):
            kept, text, each = stage(c, need)
            if len(kept) < nn:
                return text if nn == 1 else short(len(kept), each)
            c = kept
        groups = self._groups(need, c)
        big = {name: m for name, m in groups.items() if len(m) >= nn}
        if not big:
            most = max((len(m) for m in groups.values()), default=0)
            return (
                f"keep_within {need.level}: no {need.level} has {nn} nodes with {what}; "
                f"the best has {most}"
            )
        for name in sorted(big):
            chosen, blocked = self._choose(need, big[name])
            if not chosen and blocked:
                return blocked
        return "no node fits"

    def _has_engine(self, p: PlacementProfile) -> Callable[[int], bool]:
        return lambda i: p.engine == "sim" or p.engine in self.nodes[i].engines

    def _has_version(self, p: PlacementProfile) -> Callable[[int], bool]:
        return lambda i: _version_matches(self.nodes[i].engines.get(p.engine, ""), p.engine_version)

    def _has_labels(self, p: PlacementProfile) -> Callable[[int], bool]:
        sel = p.node_selector
        return lambda i: all(self.nodes[i].labels.get(k) == v for k, v in sel.items())

    def _no_node(
        self, need: _Need, claim: str, closest: list[int], what: str, has: Callable[[int], bool]
    ) -> str:
        """Return ``claim`` ("no node with L4 cards has engine vllm") where it is true of
        every node of the cluster (with the cards, if any), else what the closest nodes
        lack, naming them: a node that has it may miss something else, or be cordoned."""
        pool = [
            i
            for i in range(len(self.nodes))
            if not need.g or self.total[i].get(need.cls, 0) >= need.g
        ]
        if not any(has(i) for i in pool):
            return claim
        lacking = [i for i in closest if not has(i)] or closest
        names = ", ".join(self.nodes[i].name for i in lacking[:3])
        names += ", …" if len(lacking) > 3 else ""
        return f"the nodes closest to fit ({names}) lack {what}"

    def _class_missing(
        self, p: PlacementProfile, need: _Need, c: list[int], kept: list[int], g: int = 1
    ) -> str:
        """Return the reason for too few nodes with g cards of the class among c (the
        ready nodes that may run p), true of the whole cluster: nodes c left out (not
        ready, simulated) may have them."""
        nn = need.n
        what = f"{g} {need.cls}" if g > 1 else need.cls
        if kept:
            return f"needs {nn} nodes each with {what}; found {len(kept)}"
        has = [i for i in range(len(self.nodes)) if self.total[i].get(need.cls, 0) >= g]
        if not has:
            if g == 1:
                return f"no node has {need.cls} cards"
            most = max(self.total[i].get(need.cls, 0) for i in range(len(self.nodes)))
            if nn == 1:
                return f"needs {g} {need.cls} on one node; the largest node has {most}"
            return f"needs {nn} nodes each with {what}; found 0"
        cards = f"{need.cls} cards" if g == 1 else f"{g} {need.cls} on one node"
        names = ", ".join(self.nodes[i].name for i in has[:3]) + (", …" if len(has) > 3 else "")
        ready = [i for i in has if self.nodes[i].schedulable]
        if not ready:
            return (
                "only nodes that take no new replicas (cordoned, not ready or lost) have "
                f"{cards}: {names}"
            )
        return (
            f"only simulated nodes have {cards} ({names}), and they run only sim "
            f"profiles, not {p.engine}"
        )

    def _memory_stage(self, c: list[int], need: _Need) -> tuple[list[int], str, str]:
        """Keep the nodes with the memory; say why the others miss."""
        kept = [i for i in c if self.mem[i] >= need.mem]
        each = f"{_gb(need.mem)} GB memory free"
        if len(kept) == len(c):
            return kept, "", each
        largest = max(self.nodes[i].memory_mb for i in c)
        if 0 < largest < need.mem:
            text = f"needs {_gb(need.mem)} GB memory; the largest node has {_gb(largest)} GB"
            return kept, text, each
        roomiest = max(max(self.mem[i], 0) for i in c)
        text = f"needs {_gb(need.mem)} GB memory; the roomiest node has {_gb(roomiest)} GB free"
        return kept, text, each

    def _cores_stage(self, c: list[int], need: _Need) -> tuple[list[int], str, str]:
        """Keep the nodes with the cores; say why the others miss."""
        kept = [i for i in c if self.cores[i] >= need.cores]
        each = f"{need.cores} free CPU cores"
        if len(kept) == len(c):
            return kept, "", each
        counts = [self.nodes[i].cpu_cores for i in c]
        largest = max(counts)
        if 0 < largest < need.cores:
            hint = suggest_cores(counts)
            text = (
                f"needs {need.cores} CPU cores; the largest node has {largest} "
                f"(cpu_cores {hint}, half the smallest node, would suit these nodes)"
            )
            return kept, text, each
        best = max(max(self.cores[i], 0) for i in c)
        return kept, f"needs {need.cores} free CPU cores; the best node has {best} free", each

    def _disk_stage(self, c: list[int], need: _Need) -> tuple[list[int], str, str]:
        """Keep the nodes with the disk; say why the others miss."""
        kept = [i for i in c if self.disk[i] >= self.disk_needed(i, need)]
        each = f"{_gb(need.disk)} GB disk free or the weights"
        if len(kept) == len(c):
            return kept, "", each
        roomiest = max(max(self.disk[i], 0) for i in c)
        text = (
            f"needs {_gb(need.disk)} GB disk for the weights; "
            f"the roomiest node has {_gb(roomiest)} GB free"
        )
        return kept, text, each

    def _power_stage(self, c: list[int], need: _Need) -> tuple[list[int], str, str]:
        """Keep the nodes within their power caps; name the closest miss."""
        kept = []
        closest: tuple[float, str] | None = None
        for i in c:
            w = self.watts(i, need)
            over = [(self.used[d] + w - self.cap[d], d) for d in self.node_domains[i]]
            worst = max(over, default=(0.0, -1))
            if worst[0] <= _EPSILON:
                kept.append(i)
            elif closest is None or worst[0] < closest[0]:
                d = worst[1]
                closest = (worst[0], self._power_text(d, self.used[d], w))
        text = closest[1] if closest else ""
        return kept, text, f"power under its caps ({text})"


# What a node may miss for a profile, in the order a reason names them when several
# bind: whether it takes new replicas, the cards (class, how many, free), the engine and
# its version, the node selector, the keep_within label, what is free now (memory,
# cores, disk, power), and last that it is simulated, which no operator can change: a
# real node that lacks only llama-server is told before simulated nodes with room.
_CONDITIONS = (
    "ready",
    "class",
    "count",
    "engine",
    "version",
    "selector",
    "label",
    "free",
    "memory",
    "cores",
    "disk",
    "power",
    "real",
)


def _profile_key(p: PlacementProfile) -> tuple[object, ...]:
    """Return what a profile asks of placement, hashable (for remembering failures)."""
    return (
        p.name,
        p.engine,
        p.engine_version,
        p.gpu_class,
        p.gpus_per_node,
        p.nodes,
        tuple(sorted(p.node_selector.items())),
        p.min_memory_gb,
        p.min_disk_gb,
        p.cpu_cores,
        p.power_watts,
        p.keep_within,
        p.source,
    )
