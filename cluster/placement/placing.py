"""``place``: the entry point, and one request placed at a time."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from catalog.rules import FACILITY_LEVELS
from cluster.placement.data import (
    DEFAULT_CPU_CORE_WATTS,
    RACK_LABEL,
    Domain,
    Eviction,
    Node,
    Placement,
    PlacementProfile,
    Plan,
    Request,
    Running,
    Unplaced,
    class_name,
    profile_key,
)
from cluster.placement.evicting import evict_for
from cluster.placement.finding import find_again
from cluster.placement.reasons import never, why_unplaced
from cluster.placement.state import Need, State
from cluster.quotas import Book, Ledger, held_by, need_of


def place(
    nodes: Iterable[Node],
    domains: Iterable[Domain],
    running: Iterable[Running],
    requests: Iterable[Request],
    cpu_core_watts: float = DEFAULT_CPU_CORE_WATTS,
    quotas: Book | None = None,
) -> Plan:
    """Return where each request goes, what it evicts, and why the rest fit nowhere.

    With ``quotas`` (``cluster.quotas``), each replica counts against its model's owner's
    quota and its parents'; a request whose profiles would all pass one waits with the
    quota named, and evicts nothing for it.

    Raises ValueError for two nodes of one name, two running replicas of one id or two
    requests of one key.
    """
    with _no_cycle_collection():
        return _place(nodes, domains, running, requests, cpu_core_watts, quotas)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause the cycle collector while a plan is made.

    A plan allocates many small objects and frees them by reference counting, beside a
    large live heap (the nodes, the running replicas and their holds): the collector,
    triggered by the allocations, would walk that heap again and again (a sixth of the
    time of a tick at 10,000 nodes) and find nothing to free.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _place(
    nodes: Iterable[Node],
    domains: Iterable[Domain],
    running: Iterable[Running],
    requests: Iterable[Request],
    cpu_core_watts: float,
    quotas: Book | None,
) -> Plan:
    """``place``, with the cycle collector paused."""
    nodes = list(nodes)
    running = list(running)
    state = State(nodes, list(domains), cpu_core_watts)
    state.hold(running)
    ledger = None
    if quotas is not None:
        ledger = Ledger(quotas)
        ledger.classes = {(n.name, c.index): c.gpu_class for n in nodes for c in n.cards}
        for r in running:
            ledger.take(r.model, *held_by(r.assignments, ledger.classes))
    reqs = list(requests)
    if len({r.key for r in reqs}) != len(reqs):
        raise ValueError("two requests share a key")
    reqs.sort(key=lambda r: (-r.class_rank, -r.priority, r.key))
    plan = Plan()
    for req in reqs:
        place_one(state, req, plan, ledger)
    return plan


def place_one(state: State, req: Request, plan: Plan, ledger: Ledger | None = None) -> None:
    """Place one request, evicting if it must, or record why it cannot be placed."""
    if not req.profiles:
        plan.unplaced.append(Unplaced(req.key, req.model, "has no profiles to place"))
        return
    profiles = sorted(req.profiles, key=lambda p: -p.priority)
    if ledger is not None:
        # Only the profiles within the owner's quotas (and its parents') are tried.
        whys = [ledger.refusal(req.model, *_need(p)) for p in profiles]
        if all(whys):
            plan.unplaced.append(Unplaced(req.key, req.model, str(whys[0])))
            return
        profiles = [p for p, why in zip(profiles, whys, strict=True) if why is None]
    known = [_known(state, p) for p in profiles]
    tries = [(p, need, elig) for p, need, elig, _ in known]
    memo_key = (req.class_rank, req.protect, *(k for *_, k in known))
    fetched = sum(state.fetched.get(p.source, 0) for p in profiles)
    memo = state.failed.get(memo_key)
    if memo is not None and memo[:2] == (state.epoch, fetched):
        reason = memo[3] if memo[2] == state.commits else why_unplaced(state, req, tries)
        state.failed[memo_key] = (state.epoch, fetched, state.commits, reason)
        plan.unplaced.append(Unplaced(req.key, req.model, reason, never(state, req) or ""))
        return
    for p, need, elig in tries:
        if need.level and need.level not in FACILITY_LEVELS:
            continue
        if need.g == 0 and p.gpus_per_node > 0:
            continue
        chosen = find_again(state, need, elig, req.model)
        if chosen:
            _record(state, req, p, need, chosen, plan)
            if ledger is not None:
                ledger.take(req.model, *_need(p))
            return
    for p, need, elig in tries:
        if (need.level and need.level not in FACILITY_LEVELS) or (
            need.g == 0 and p.gpus_per_node > 0
        ):
            continue
        found = evict_for(state, req.class_rank, need, elig, req.protect)
        if found:
            chosen, victims = found
            where = ", ".join(state.nodes[i].name for i in chosen)
            for v in victims:
                if ledger is not None:
                    ledger.give_back(v.model, *held_by(v.assignments, ledger.classes))
                del state.alive[v.id]
                state.count_model(v.model, {h.i for h in state.holds_of[v.id]}, -1)
                for i in {h.i for h in state.holds_of[v.id]}:
                    state.count_rank(i, v.class_rank, -1)
                plan.evictions.append(
                    Eviction(
                        v.id,
                        v.model,
                        req.key,
                        f"evicted for {req.model} ({class_name(req.class_rank)}), "
                        f"which needs its room on {where}",
                    )
                )
            state.epoch += 1
            _record(state, req, p, need, chosen, plan)
            if ledger is not None:
                ledger.take(req.model, *_need(p))
            return
    reason = why_unplaced(state, req, tries)
    state.failed[memo_key] = (state.epoch, fetched, state.commits, reason)
    plan.unplaced.append(Unplaced(req.key, req.model, reason, never(state, req) or ""))


def _known(
    state: State, p: PlacementProfile
) -> tuple[PlacementProfile, Need, frozenset[int], tuple[object, ...]]:
    """Return a profile with its need, eligible nodes and key, worked out once per
    profile object (a model's requests share theirs)."""
    found = state.profiles.get(id(p))
    if found is None or found[0] is not p:
        found = state.profiles[id(p)] = (p, state.need(p), state.eligible(p), profile_key(p))
    return found


def _need(p: PlacementProfile) -> tuple[str, int]:
    """What one replica of ``p`` counts against its owner's quotas."""
    return need_of(p.gpu_class, p.gpus_per_node, p.nodes, p.cpu_cores)


def _record(
    state: State, req: Request, p: PlacementProfile, need: Need, chosen: list[int], plan: Plan
) -> None:
    """Commit a request's replica to the chosen nodes and add it to the plan."""
    score = state.spread(req.model, chosen[0]) if len(chosen) == 1 else ()
    note = ""
    if score and score[0]:
        note = (
            f"beside another replica of {req.model} on {state.nodes[chosen[0]].name}: "
            "no other node has room for it"
        )
    elif score and score[1]:
        note = (
            f"in rack {state.labels[chosen[0]][RACK_LABEL]} beside another replica of "
            f"{req.model}: no node in another rack has room for it"
        )
    assignments = state.commit(need, chosen)
    state.count_model(req.model, chosen, 1)
    plan.placed.append(Placement(req.key, req.model, p.name, p.source, assignments, note))
