"""``place_sparing``: placing so that a patient request (a drain's, a roll's) darkens no model."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as replace_node

from cluster.placement.data import (
    DEFAULT_CPU_CORE_WATTS,
    Domain,
    Eviction,
    Node,
    PlacementProfile,
    Plan,
    Request,
    Running,
)
from cluster.placement.placing import place
from cluster.quotas import Book


@dataclass(frozen=True)
class Held:
    """A patient request kept from evicting: what it would have evicted, and why not."""

    key: str
    model: str
    # What it would evict were it not held (what a forced drain evicts for it): the
    # evictions ``place`` chose for it the first time it was held, the fewest that make
    # it room, never the sum of every room tried since.
    evictions: tuple[Eviction, ...]
    # By evicted model: why no other node could hold it (placement's reason).
    nowhere: Mapping[str, str]
    # Every last ready replica it was kept from evicting, one per room tried (its reason).
    spared: tuple[Eviction, ...] = ()

    @property
    def reason(self) -> str:
        """Return what the held request says while it waits."""
        parts = [
            f"{e.model} (#{e.running_id}; no room elsewhere: {self.nowhere[e.model]})"
            for e in self.spared or self.evictions
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
    quotas: Book | None = None,
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
                quotas,
            )
            why = None if trial.placed and not trial.evictions else _why(trial)
        nowhere_memo[(model, taken)] = why
        return why

    # Each round protects at least one more replica from one request: it ends.
    while True:
        plan = place(nodes, domains, running, reqs, cpu_core_watts, quotas)
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
                # The first room it was kept from is the one it would take: all it evicts
                # there (darkening or not). The rooms tried after it only add to the reason.
                evs = (
                    before.evictions
                    if before
                    else tuple(e for e in plan.evictions if e.for_key == r.key)
                )
                spared = (*(before.spared if before else ()), *(e for e, _ in found))
                whys = {**(before.nowhere if before else {}), **{e.model: w for e, w in found}}
                held[r.key] = Held(r.key, r.model, evs, whys, spared)
    still = {u.key for u in plan.unplaced}
    return plan, {k: h for k, h in held.items() if k in still}


def _why(plan: Plan) -> str:
    """Return why a one-request trial plan placed nothing (or evicted to place it)."""
    if plan.unplaced:
        return plan.unplaced[0].reason
    return "only by evicting other replicas"
