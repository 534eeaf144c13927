"""The cluster's GPU classes as they stand: cards per class, how many are free, and where.

Read-only. ``gpu_classes`` reads the nodes and cards the agents reported and the cards
replicas hold; ``shortfall`` (pure) says whether a profile's cards fit on them now. Used by
the API (``GET /api/v1/cluster/gpu-classes/``) and by the catalog's model form, which
shows the classes beside each profile's ``gpu_class`` (the catalog reads them through
``catalog.inventory``, as it never imports the cluster).

Counted as placement counts them (``cluster.placement``): a card carved into MIG
instances is not a card of its own class any more, only its instances are; a card is
held while any replica's assignment names it (a stopping replica holds it until it is
gone), and a card held whole holds the instances carved out of it. Only a ready node that
is not cordoned has free cards: nothing new is placed on any other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.discovery import is_mig_class
from cluster.choices import NodeHealth
from cluster.models import Assignment, Card, Node


@dataclass(frozen=True)
class ClassInfo:
    """One GPU class of the cluster.

    ``total``: its cards (or MIG instances) on every node; ``free``: those no replica
    holds, on ready, uncordoned nodes; ``mig``: a MIG instance class; ``nodes``: the
    nodes that have it; ``best_free_on_one_node``: the most free on one such node;
    ``free_per_node``: the free count of each ready, uncordoned node that has the class,
    highest first (what a multi-node profile needs).
    """

    name: str
    total: int
    free: int
    mig: bool
    nodes: int
    best_free_on_one_node: int
    free_per_node: tuple[int, ...] = ()


def gpu_classes() -> list[ClassInfo]:
    """Return every GPU class the cluster's nodes reported, by name (three queries)."""
    schedulable = set(
        Node.objects.filter(health=NodeHealth.READY, cordoned=False).values_list("pk", flat=True)
    )
    cards = list(Card.objects.values_list("node_id", "index", "gpu_class", "mig_of"))
    held: dict[int, set[int]] = defaultdict(set)
    for node_id, indices in Assignment.objects.values_list("node_id", "cards"):
        held[node_id].update(i for i in indices or () if isinstance(i, int))
    return summarize(cards, held, schedulable)


def summarize(
    cards: Iterable[tuple[int, int, str, int | None]],
    held: Mapping[int, set[int]],
    schedulable: set[int],
) -> list[ClassInfo]:
    """Return the classes of these cards: (node, index, class, mig_of) each.

    ``held`` is each node's card indices that replicas hold; ``schedulable`` the nodes
    where a free card counts as free.
    """
    by_node: dict[int, dict[int, tuple[str, int | None]]] = defaultdict(dict)
    for node, index, cls, mig_of in cards:
        by_node[node][index] = (cls, mig_of)
    total: dict[str, int] = defaultdict(int)
    free: dict[str, dict[int, int]] = defaultdict(dict)
    where: dict[str, set[int]] = defaultdict(set)
    for node, node_cards in by_node.items():
        parents = {m for i, (_, m) in node_cards.items() if m is not None and m != i}
        taken = set(held.get(node, ()))
        # A card held whole holds what was carved out of it.
        taken |= {i for i, (_, m) in node_cards.items() if m is not None and m != i and m in taken}
        for index, (cls, _) in node_cards.items():
            if index in parents:
                continue  # carved into MIG instances: never offered whole
            total[cls] += 1
            where[cls].add(node)
            if node in schedulable:
                free[cls][node] = free[cls].get(node, 0) + (index not in taken)
    out = []
    for cls in sorted(total):
        per_node = tuple(sorted(free[cls].values(), reverse=True))
        out.append(
            ClassInfo(
                name=cls,
                total=total[cls],
                free=sum(per_node),
                mig=is_mig_class(cls),
                nodes=len(where[cls]),
                best_free_on_one_node=per_node[0] if per_node else 0,
                free_per_node=per_node,
            )
        )
    return out


def shortfall(
    classes: Mapping[str, ClassInfo], gpu_class: str, gpus_per_node: int, nodes: int
) -> str | None:
    """Return why a profile's replicas cannot be placed on the free cards now, or None.

    Only cards are counted (memory, disk, labels and power are placement's to judge),
    and only the free ones: the catalog allows any class, so a class no node has, or
    too few free cards of one, is allowed to be saved, and its replicas wait unplaced.
    """
    if not gpu_class:
        return None
    info = classes.get(gpu_class)
    if info is None:
        return f"no node has {gpu_class}: replicas will be unplaced"
    g = max(gpus_per_node, 1)
    n = max(nodes, 1)
    enough = sum(1 for f in info.free_per_node if f >= g)
    if enough >= n:
        return None
    if n == 1:
        return (
            f"no node has {g} free {gpu_class}; the best has "
            f"{info.best_free_on_one_node}: replicas will be unplaced"
        )
    if enough == 0:
        have = "no node has"
    elif enough == 1:
        have = "only 1 node has"
    else:
        have = f"only {enough} nodes have"
    return (
        f"{have} {g} free {gpu_class}; the profile needs {n} such nodes: replicas will be unplaced"
    )
