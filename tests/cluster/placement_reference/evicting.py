"""Making room for a request by evicting running replicas of a strictly lower class.

On one node (or one set of nodes for a multi-node profile): the lowest classes and the
fewest replicas that make room. Victims are tried counted on the side (``_fits_without``)
and released only when chosen.
"""

from __future__ import annotations

from cluster.placement.data import Running
from tests.cluster.placement_reference.finding import find_multi
from tests.cluster.placement_reference.state import EPSILON, Hold, Need, State


def evict_for(
    state: State,
    rank: int,
    need: Need,
    elig: frozenset[int],
    protect: frozenset[int | str] = frozenset(),
) -> tuple[list[int], list[Running]] | None:
    """Find the cheapest lower-class replicas whose eviction makes room, and evict them.

    Returns the nodes to place on and the evicted, or None (nothing changed).
    """
    options: list[tuple[tuple[int, int, int, int], int, list[Running]]] = []
    holders = state.holders.get(need.src, set()) & elig if need.src else set()
    # Holders first, so the first node where one opportunistic replica makes room is
    # the best there is, and the search of a full cluster can stop there.
    for i in [*sorted(holders), *sorted(elig - holders)]:
        if need.n == 1 and not state.evictable(i, rank):
            continue
        if state.fits(i, need):
            options.append(((0, 0, i not in holders, i), i, []))
            continue
        victims = _victims(state, i, rank, need, protect)
        if victims is not None:
            top = max(v.class_rank for v in victims)
            options.append(((top, len(victims), i not in holders, i), i, victims))
            if need.n == 1 and top == 1 and len(victims) == 1:
                break
    if need.n == 1:
        for _, i, victims in sorted(options, key=lambda o: o[0]):
            for v in victims:
                state.release(v)
            # Counted without releasing anything; this checks the count held.
            if state.fits(i, need):
                return [i], victims
            for v in victims:
                state.reclaim(v)
        return None
    by_node = {i: (cost, victims) for cost, i, victims in options}
    trials = []
    for name, members in state.groups(need, sorted(by_node)).items():
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
            state.release(v)
        chosen = find_multi(state, need, elig & frozenset(cheapest))
        if chosen:
            return chosen, picked
        for v in picked:
            state.reclaim(v)
    return None


def _victims(
    state: State, i: int, rank: int, need: Need, protect: frozenset[int | str] = frozenset()
) -> list[Running] | None:
    """Return the fewest, lowest-class replicas on node i whose going makes room."""
    lower = [
        r
        for r in state.on_node[i]
        if r.class_rank < rank and r.id in state.alive and r.id not in protect
    ]
    if not lower or not _could_fit(state, i, need):
        return None
    useful = {r.id: _freed(state, i, r, need.cls) for r in lower}
    # A cheap bound first: if all of them together are not enough, no few of them are.
    mine = [h for r in lower for h in state.holds_of[r.id] if h.i == i]
    if (
        len(state.free[i].get(need.cls, ())) + sum(useful.values()) < need.g
        or state.mem[i] + sum(h.mem for h in mine) < need.mem
        or state.cores[i] + sum(h.cores for h in mine) < need.cores
    ):
        return None
    order = sorted(lower, key=lambda r: (r.class_rank, -useful[r.id], str(r.id)))
    chosen: list[Running] = []
    for r in order:
        chosen.append(r)
        if _fits_without(state, i, need, chosen):
            break
    else:
        return None
    # Keep only those needed: try sparing the higher classes first.
    for r in reversed(list(chosen)):
        rest = [v for v in chosen if v is not r]
        if rest and _fits_without(state, i, need, rest):
            chosen = rest
    return chosen


def _fits_without(state: State, i: int, need: Need, victims: list[Running]) -> bool:
    """Return whether node i would fit a replica were these replicas gone.

    Counted on the side, without releasing them: trying victims on every node of a
    full cluster by releasing and taking back would be most of a tick.
    """
    holds = [h for r in victims for h in state.holds_of[r.id]]
    here = [h for h in holds if h.i == i]
    if (
        state.mem[i] + sum(h.mem for h in here) < need.mem
        or state.cores[i] + sum(h.cores for h in here) < need.cores
    ):
        return False
    take: list[int] = []
    if need.g:
        classes, children, claims = state.card_class[i], state.children[i], state.claims[i]
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
        cards = sorted(state.free[i].get(need.cls, []) + freed)
        if len(cards) < need.g:
            return False
        take = cards[: need.g]
    if need.disk and need.src not in state.holds[i] and not _disk_without(state, i, need, here):
        return False
    if state.node_domains[i]:
        cw = state.card_watts[i]
        w = need.watts
        if w is None:
            w = sum(cw[c] for c in take) + need.cores * state.core_watts
        for d in state.node_domains[i]:
            gone = sum(h.watts for h in holds if d in state.node_domains[h.i])
            if state.used[d] - gone + w > state.cap[d] + EPSILON:
                return False
    return True


def _disk_without(state: State, i: int, need: Need, here: list[Hold]) -> bool:
    """Return whether node i would have the disk for a replica without these holds."""
    disk = state.disk[i]
    users: dict[str, int] = {}
    for h in here:
        if h.src in state.holds[i]:
            continue
        if h.src:
            users[h.src] = users.get(h.src, 0) + 1
        else:
            disk += h.disk
    fetching = state.fetching[i]
    for src, k in users.items():
        entry = fetching.get(src)
        if entry and entry[0] == k:
            disk += entry[1]
    entry = fetching.get(need.src) if need.src else None
    kept = entry[1] if entry and entry[0] > users.get(need.src, 0) else 0
    return disk >= max(need.disk - kept, 0)


def _freed(state: State, i: int, r: Running, cls: str) -> int:
    """Return how many cards of a class r holds on node i (MIG instances included)."""
    if not cls:
        return 0
    classes, children = state.card_class[i], state.children[i]
    return sum(
        classes[x] == cls and x not in children
        for h in state.holds_of[r.id]
        if h.i == i
        for c in h.cards
        for x in (c, *children.get(c, ()))
    )


def _could_fit(state: State, i: int, need: Need) -> bool:
    """Return whether node i, emptied, would be big enough."""
    n = state.nodes[i]
    if need.g and state.total[i].get(need.cls, 0) < need.g:
        return False
    if n.memory_mb > 0 and n.memory_mb < need.mem:
        return False
    return not (n.cpu_cores > 0 and n.cpu_cores < need.cores)
