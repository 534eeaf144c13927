"""Making room for a request by evicting running replicas of a strictly lower class.

On one node (or one set of nodes for a multi-node profile): the lowest classes and the
fewest replicas that make room. Victims are tried counted on the side (``_fits_without``)
and released only when chosen.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterator

from cluster.placement.data import LABEL_PREFIX, Running
from cluster.placement.finding import find_multi
from cluster.placement.state import EPSILON, Buckets, Hold, Need, State


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
    holders = state.holders.get(need.src, set()) & elig if need.src else set()
    # Only the nodes running a lower class can make room for a one-node replica (the
    # index of who runs which class finds them); a multi-node one may also use nodes
    # that fit as they are.
    # The weights count only for the disk: without it, one trial serves every source.
    shape = state.shape(need)
    # Kept per shape and protected replicas, for every class alike: a node's trial holds
    # for each class that finds the same replicas below it there (``_victims``).
    memo = state.victims_memo.setdefault((shape, protect), {})
    # A node too small even emptied is passed over (``_could``, known per shape).
    could = _could(state, need)
    key = (shape, rank, protect, elig)
    costs = state.options.get(key)
    since: tuple[int, frozenset[int]] | None = None
    if costs is not None:
        # Every node's room was counted for this shape before: count it again only
        # where it changed since.
        dirty = state.dirty_since(costs.pos) & elig
        since = (costs.pos, dirty)
        fresh = dirty & could
        if need.n == 1:
            fresh = state.evictable_among(fresh, rank)
        for i in (dirty - fresh) & costs.table.keys():
            costs.drop(i)
        for i in fresh:
            option = _option(state, i, rank, need, protect, memo)
            if option is None:
                costs.drop(i)
            else:
                costs.put(i, option)
        costs.pos = len(state.changed)
    if need.n == 1:
        if costs is not None:
            # The cheapest first, from the index of costs: the holders of the weights
            # come first among those of the cheapest cost.
            best = costs.cheapest(holders)
            if best is None:
                return None
            table = costs
            rest: Callable[[], list[Ranked]] = lambda: table.options(holders)  # noqa: E731
        else:
            found = _walk(state, rank, need, elig, protect, memo, could, holders, key)
            if found is None:
                return None
            best, rest = found
        # It holds but where the count did not, and then the rest are tried in order.
        for v in best[2]:
            state.release(v)
        if state.fits(best[1], need):
            return [best[1]], best[2]
        for v in best[2]:
            state.reclaim(v)
        for _, i, victims in sorted(rest(), key=lambda o: o[0]):
            for v in victims:
                state.release(v)
            # Counted without releasing anything; this checks the count held.
            if state.fits(i, need):
                return [i], victims
            for v in victims:
                state.reclaim(v)
        return None
    if costs is None:
        # A multi-node replica's trial counts every node.
        pool = elig & could
        costs = Costs(len(state.changed))
        for i in itertools.chain(sorted(holders & pool), _ascending(pool - holders)):
            option = _option(state, i, rank, need, protect, memo)
            if option is not None:
                costs.put(i, option)
        state.options[key] = costs
    # The cheapest first (costs are unique: each names its group), from the index of
    # the groups' costs: the next only when it does not hold.
    for _, cheapest, picked in _trials(state, need, key, costs, since, elig, holders):
        for v in picked:
            state.release(v)
        # Only the group's cheapest nodes are walked: no other may be chosen.
        chosen = find_multi(state, need, elig & frozenset(cheapest), set(cheapest))
        if chosen:
            return chosen, picked
        for v in picked:
            state.reclaim(v)
    return None


# A node where room could be made, ranked as ``evict_for`` tries them: by the highest
# class evicted, how many, holding the weights first, then name; and whom it evicts.
Ranked = tuple[tuple[int, int, bool, int], int, list[Running]]
Option = tuple[int, int, list[Running]]


def _walk(
    state: State,
    rank: int,
    need: Need,
    elig: frozenset[int],
    protect: frozenset[int | str],
    memo: dict[int, Victims],
    could: frozenset[int],
    holders: set[int],
    key: tuple[object, ...],
) -> tuple[tuple[object, int, list[Running]], Callable[[], list[Ranked]]] | None:
    """Return the cheapest room for a one-node replica and every room the search found
    (the holders of the weights, then the other nodes in name order up to where one
    opportunistic replica made room), or None. A search that walked every node leaves
    their costs for the next (``State.options``)."""
    ranks_on = state.ranks_on

    def evictable(i: int) -> bool:
        return any(k > 0 for r, k in ranks_on[i].items() if r < rank)

    order = itertools.chain(
        sorted(i for i in holders if i in could and evictable(i)),
        (i for i in _evictable(state, rank, need, elig, could) if i not in holders),
    )
    options: list[Ranked] = []
    whole = True
    for i in order:
        option = _option(state, i, rank, need, protect, memo)
        if option is not None:
            top, count, victims = option
            options.append(((top, count, i not in holders, i), i, victims))
            if top == 1 and count == 1:
                whole = False
                break
    if whole:
        costs = Costs(len(state.changed))
        for c, i, v in options:
            costs.put(i, (c[0], c[1], v))
        state.options[key] = costs
    if not options:
        return None
    return min(options, key=lambda o: o[0]), lambda: options


def _evictable(
    state: State,
    rank: int,
    need: Need,
    elig: frozenset[int],
    could: frozenset[int],
) -> Iterator[int]:
    """Yield the eligible nodes big enough emptied that run a class below rank, in name
    order.

    They are kept in order per shape's nodes and rank: a node that no longer runs a
    lower class is dropped as it is met, and one that began to since is put in its
    place (``State.became``), so a search that stops early walks only a few.
    """
    ranks_on = state.ranks_on

    def evictable(i: int) -> bool:
        return any(k > 0 for r, k in ranks_on[i].items() if r < rank)

    key = (elig, need.cls, need.g, need.mem, need.cores, rank)
    kept = state.evictable_order.get(key)
    if kept is None:
        nodes = sorted(state.evictable_among(elig & could, rank))
    else:
        nodes, pos = kept
        for i, r in state.became[pos:]:
            if r < rank and i in elig and i in could:
                at = bisect.bisect_left(nodes, i)
                if at == len(nodes) or nodes[at] != i:
                    nodes.insert(at, i)
    state.evictable_order[key] = (nodes, len(state.became))
    at = 0
    while at < len(nodes):
        i = nodes[at]
        if not evictable(i):
            del nodes[at]
            continue
        at += 1
        yield i


def _ascending(nodes: set[int]) -> Iterator[int]:
    """Yield nodes in name order as they are asked for (a heap): a search that stops
    early does not sort them all."""
    heap = list(nodes)
    heapq.heapify(heap)
    while heap:
        yield heapq.heappop(heap)


class Costs:
    """What making room costs on each node for one shape (``_option``), indexed by cost.

    ``table`` holds each node's cost (the highest class evicted, how many) and victims;
    the nodes of each cost are kept in name order, so the cheapest is found without
    walking the cluster. ``pos`` is the length of ``State.changed`` when last counted.
    """

    def __init__(self, pos: int) -> None:
        """Start with no node counted."""
        self.pos = pos
        self.table: dict[int, Option] = {}
        self.by_cost = Buckets()

    def put(self, i: int, option: Option) -> None:
        """Record node i's cost and victims."""
        old = self.table.get(i)
        self.table[i] = option
        new = _cost_key(option)
        if old is None:
            self.by_cost.add(new, i)
        else:
            self.by_cost.move(_cost_key(old), new, i)

    def drop(self, i: int) -> None:
        """Forget node i: no room can be made there."""
        old = self.table.pop(i, None)
        if old is not None:
            self.by_cost.remove(_cost_key(old), i)

    def cheapest(self, holders: set[int]) -> tuple[object, int, list[Running]] | None:
        """Return the cheapest option as ``options`` orders them: by cost, then holding
        the weights, then name."""
        for k in self.by_cost.keys:
            held = [i for i in holders if i in self.table and _cost_key(self.table[i]) == k]
            i = min(held) if held else self.by_cost.groups[k][0]
            return None, i, self.table[i][2]
        return None

    def options(
        self, holders: set[int]
    ) -> list[tuple[tuple[int, int, int, int], int, list[Running]]]:
        """Return every option, keyed by cost, holding the weights, then name."""
        return [((t, k, i not in holders, i), i, v) for i, (t, k, v) in self.table.items()]


def _cost_key(option: Option) -> int:
    """Return an option's cost (highest class evicted, then how many) as one int."""
    return (option[0] << 32) + option[1]


def _could(state: State, need: Need) -> frozenset[int]:
    """Return the nodes that, emptied, would be big enough for a replica's share."""
    key = (need.cls, need.g, need.mem, need.cores)
    found = state.could_memo.get(key)
    if found is None:
        # Asked once per kind of node (its cards, memory and cores), not per node.
        found = frozenset(
            i
            for total, mem, cores, nodes in state.node_kinds()
            if _could_fit_kind(total, mem, cores, need)
            for i in nodes
        )
        state.could_memo[key] = found
    return found


Trial = tuple[tuple[int, int, str], list[int], list[Running]]


class Groups:
    """Each group's trial for one shape of a multi-node replica (``_trials``), indexed by
    cost: the cheapest is found without listing every group."""

    def __init__(self, trials: dict[str, Trial | None]) -> None:
        """Start from each group's trial (None where it gives no room)."""
        self.trials = {name: t for name, t in trials.items() if t is not None}
        self.costs = sorted(t[0] for t in self.trials.values())

    def put(self, name: str, trial: Trial | None) -> None:
        """Record a group's trial counted again (None: it gives no room)."""
        old = self.trials.pop(name, None)
        if old is not None:
            del self.costs[bisect.bisect_left(self.costs, old[0])]
        if trial is not None:
            self.trials[name] = trial
            bisect.insort(self.costs, trial[0])


def _trials(
    state: State,
    need: Need,
    key: tuple[object, ...],
    costs: Costs,
    since: tuple[int, frozenset[int]] | None,
    elig: frozenset[int],
    holders: set[int],
) -> Iterator[Trial]:
    """Yield, per group of nodes a multi-node replica may take (its keep_within domain),
    the cheapest nodes and whom evicting there evicts, with its cost, the cheapest first.

    Among nodes of one cost, those holding the weights come first. Kept per shape as
    though no node held them, and only the groups with a node whose room changed are
    counted again; a group with a node holding this replica's weights is counted for it.
    ``since`` is when the costs were counted before and the eligible nodes whose room
    may have changed since (None: counted just now): the groups counted then need not
    look for them again.
    """
    label = LABEL_PREFIX + need.level if need.level else ""
    table = costs.table

    def trial(name: str, members: list[int], held: set[int]) -> Trial | None:
        if len(members) < need.n:
            return None
        cheapest = sorted(members, key=lambda i: (table[i][0], table[i][1], i not in held, i))[
            : need.n
        ]
        victims = {}
        for i in cheapest:
            for v in table[i][2]:
                victims[v.id] = v
        if not victims:
            return None  # it would have fit without evicting; power stopped it
        picked = [victims[k] for k in sorted(victims, key=str)]
        return (max(v.class_rank for v in picked), len(picked), name), cheapest, picked

    def nodes_of(name: str) -> list[int]:
        nodes = state.members(label, name) if label else sorted(table)
        return [i for i in nodes if i in table]

    kept = state.group_trials.get(key)
    if kept is None:
        groups = Groups(
            {
                name: trial(name, members, set())
                for name, members in state.groups(need, sorted(table)).items()
            }
        )
    else:
        groups, pos = kept
        dirty = since[1] if since and since[0] == pos else state.dirty_since(pos) & elig
        names = {state.labels[i].get(label) for i in dirty} - {None, ""} if label else {""}
        for name in names if dirty else ():
            groups.put(name, trial(name, nodes_of(name), set()))
    state.group_trials[key] = (groups, len(state.changed))
    mine = {i for i in holders if i in table}
    held: dict[str, Trial | None] = {}
    if mine:
        names = {state.labels[i].get(label) for i in mine} - {None, ""} if label else {""}
        for name in names:
            held[name] = trial(name, nodes_of(name), mine)
    trials = groups.trials
    ranked = (trials[cost[2]] for cost in groups.costs if cost[2] not in held)
    yield from heapq.merge(
        ranked,
        sorted((t for t in held.values() if t is not None), key=lambda t: t[0]),
        key=lambda t: t[0],
    )


def _option(
    state: State,
    i: int,
    rank: int,
    need: Need,
    protect: frozenset[int | str],
    memo: dict[int, Victims],
) -> tuple[int, int, list[Running]] | None:
    """Return what making room on node i costs (the highest class evicted, how many) and
    whom it evicts, or None where it cannot be made."""
    if state.fits(i, need):
        return 0, 0, []
    victims = _victims(state, i, rank, need, protect, memo)
    if victims is None:
        return None
    return max(v.class_rank for v in victims), len(victims), victims


def _victims(
    state: State,
    i: int,
    rank: int,
    need: Need,
    protect: frozenset[int | str],
    memo: dict[int, Victims],
) -> list[Running] | None:
    """Return the fewest, lowest-class replicas on node i whose going makes room.

    Known from an earlier trial of the same shape (``memo``, one per need with its
    source left out where it asks no disk, rank and protected replicas) while node
    i's room has not changed since (what runs there changes only with its room), and
    each power check the trial made comes out as it did: its domains' power may have
    changed (room taken or given back on their other nodes) without changing a step.
    A trial holds for another class too where that class finds the same replicas below
    it on the node (a trial for critical serves standard on a node running only
    opportunistic replicas).
    """
    known = memo.get(i)
    if known is not None and known[0] == state.node_ver[i] and known[1] < rank <= known[2]:
        used, cap = state.used, state.cap
        if all((used[d] - gone + w > cap[d] + EPSILON) == over for d, gone, w, over in known[3]):
            return known[4]
    checks: list[tuple[int, float, float, bool]] = []
    lower, above = _lower(state, i, rank, protect)
    found = _victims_now(state, i, need, lower, checks)
    top = max((r.class_rank for r in lower), default=0)
    memo[i] = (state.node_ver[i], top, above, tuple(checks), found)
    return found


def _lower(
    state: State, i: int, rank: int, protect: frozenset[int | str]
) -> tuple[list[Running], float]:
    """Return the live replicas on node i that a class may evict (below its rank, not
    protected), and the lowest class of the others there: every rank above the highest
    of the first and up to the second finds the same replicas."""
    alive = state.alive
    lower: list[Running] = []
    above: float = float("inf")
    for r in state.on_node[i]:
        if r.id in alive and r.id not in protect:
            k = r.class_rank
            if k < rank:
                lower.append(r)
            elif k < above:
                above = k
    return lower, above


# A node's trial of victims for a shape: its room's version then, the classes it holds
# for (above the first, up to the second), each power check made (domain, watts freed
# there, watts drawn, whether it was over), and the victims.
Victims = tuple[int, int, float, tuple[tuple[int, float, float, bool], ...], list[Running] | None]


def _victims_now(
    state: State,
    i: int,
    need: Need,
    lower: list[Running],
    checks: list[tuple[int, float, float, bool]] | None = None,
) -> list[Running] | None:
    """Return the fewest, lowest-class replicas of ``lower`` (those on node i a class may
    evict) whose going makes room, counted (each power check made added to ``checks``)."""
    # Node i, emptied, would be big enough: only such nodes are asked (``_could``).
    if not lower:
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
        if _fits_without(state, i, need, chosen, checks):
            break
    else:
        return None
    # Keep only those needed: try sparing the higher classes first.
    for r in reversed(list(chosen)):
        rest = [v for v in chosen if v is not r]
        if rest and _fits_without(state, i, need, rest, checks):
            chosen = rest
    return chosen


def _fits_without(
    state: State,
    i: int,
    need: Need,
    victims: list[Running],
    checks: list[tuple[int, float, float, bool]] | None = None,
) -> bool:
    """Return whether node i would fit a replica were these replicas gone.

    Counted on the side, without releasing them: trying victims on every node of a
    full cluster by releasing and taking back would be most of a tick. Each power check
    made is added to ``checks`` (its domain, the watts freed there and drawn, whether
    it was over the cap).
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
            over = state.used[d] - gone + w > state.cap[d] + EPSILON
            if checks is not None:
                checks.append((d, gone, w, over))
            if over:
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


def _could_fit_kind(total: dict[str, int], memory_mb: int, cpu_cores: int, need: Need) -> bool:
    """Return whether a node of these cards (by class), memory and cores, emptied, would
    be big enough."""
    if need.g and total.get(need.cls, 0) < need.g:
        return False
    if memory_mb > 0 and memory_mb < need.mem:
        return False
    return not (cpu_cores > 0 and cpu_cores < need.cores)
