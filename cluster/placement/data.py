"""Placement's inputs and outputs, plain data, and a catalog model in placement's view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from catalog.rules import (
    class_rank,
    cpu_only,
    effective_class,
    is_external,
    normalized_profiles,
)
from catalog.spec import Model

DEFAULT_CPU_CORE_WATTS = 10.0
LABEL_PREFIX = "llmgw.io/"
RACK_LABEL = LABEL_PREFIX + "rack"
CLASS_NAMES = {3: "critical", 2: "standard", 1: "opportunistic"}
# How a reason starts when no node of the cluster could run the replica even were every
# node empty and taking replicas: no card of the class, no engine, too little memory...
# (an operator must change the cluster or the model; waiting will not help). The gateway
# answers such a model 503 ``model_unplaceable`` (gateway.path.errors).
UNPLACEABLE = "no node in this cluster can run it"


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
    # rest of the model, or copying the profiles deeply, would be most of the work of
    # turning a catalog into requests.
    source, profiles = normalized_profiles(model)
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
            source=source,
        )
        for p in profiles
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


def profile_key(p: PlacementProfile) -> tuple[object, ...]:
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
