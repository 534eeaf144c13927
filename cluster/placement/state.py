"""The cluster as it stands while a plan is made: what is free on each node.

``State`` indexes the nodes (their cards, MIG instances, power domains), counts what each
running replica holds, answers whether one node fits one node's share of a replica
(``fits``), and takes a placed replica's room (``commit``). Finding nodes, evicting and
telling why are functions over it (``finding``, ``evicting``, ``reasons``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from catalog.rules import FACILITY_LEVELS
from cluster.placement.data import (
    LABEL_PREFIX,
    RACK_LABEL,
    Assignment,
    Domain,
    Node,
    PlacementProfile,
    Running,
)

MB_PER_GB = 1024
# A capacity a node did not report: large enough never to run out, and still an int.
UNKNOWN = 1 << 62
EPSILON = 1e-6
# Where nodes with cards start in the best-fit order of CPU profiles (``State._cpu_key``).
CARDS_KEY = 1 << 41


@dataclass(frozen=True)
class Need:
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


@dataclass(slots=True)
class Hold:
    """A replica's resources on one node, in the state's terms."""

    i: int
    cards: tuple[int, ...]
    cores: int
    mem: int
    disk: int
    watts: float
    src: str


class Buckets:
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

    def from_key(self, key: int, below: int | None = None) -> Iterator[int]:
        """Yield the nodes of every key from this one up (to ``below``, if given), in
        (key, name) order."""
        keys = self.keys
        end = len(keys) if below is None else bisect.bisect_left(keys, below)
        for k in keys[bisect.bisect_left(keys, key) : end]:
            yield from self.groups[k]


def version_matches(version: str, prefix: str) -> bool:
    """Return whether an installed version starts with a prefix, by whole components."""
    if not prefix:
        return True
    if not version.startswith(prefix):
        return False
    # Whole components: "0.1" is not a prefix of 0.11.0.
    rest = version[len(prefix) :]
    return not (rest and rest[0].isdigit() and prefix[-1].isdigit())


def _w(watts: float) -> str:
    """Return watts as a person reads them."""
    return f"{watts:.0f}" if abs(watts - round(watts)) < 0.05 else f"{watts:.1f}"


class Kept:
    """Sets of nodes worked out from a log (``State.changed``, ``State.gained``) at a
    position, kept until the log grows."""

    __slots__ = ("found", "length")

    def __init__(self) -> None:
        self.length = -1
        self.found: dict[int, frozenset[int]] = {}

    def at(self, length: int, pos: int, work: Callable[[int], frozenset[int]]) -> frozenset[int]:
        """Return what ``work(pos)`` gave while the log stood at ``length``, else work it
        out and keep it."""
        if self.length != length:
            self.length = length
            self.found = {}
        got = self.found.get(pos)
        if got is None:
            got = self.found[pos] = work(pos)
        return got


class State:
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
        self.mem = [n.memory_mb if n.memory_mb > 0 else UNKNOWN for n in nodes]
        self.cores = [n.cpu_cores if n.cpu_cores > 0 else UNKNOWN for n in nodes]
        self.disk = [n.disk_free_mb if n.disk_free_mb > 0 else UNKNOWN for n in nodes]
        self.holds = [frozenset(n.holds) for n in nodes]
        self.labels = [n.labels for n in nodes]
        self.holders: dict[str, set[int]] = {}
        # Downloads reserved per node: source -> [replicas using it, MB reserved].
        self.fetching: list[dict[str, list[int]]] = [{} for _ in nodes]
        # The nodes fetching each source (those with an entry in ``fetching``).
        self.fetching_at: dict[str, set[int]] = {}
        self.card_class: list[dict[int, str]] = []
        self.card_watts: list[dict[int, float]] = []
        self.children: list[dict[int, list[int]]] = []
        self.claims: list[dict[int, int]] = []
        self.free: list[dict[str, list[int]]] = []
        self.total: list[dict[str, int]] = []
        self.uneven: list[bool] = []
        self.kinds: list[tuple[dict[str, int], int, int, list[int]]] | None = None
        self.card_kinds: dict[tuple[object, ...], tuple[Any, ...]] = {}
        self.class_buckets: dict[str, Buckets] = {}
        self.cpu_buckets = Buckets()
        for i, n in enumerate(nodes):
            for src in n.holds:
                self.holders.setdefault(src, set()).add(i)
            self._index_cards(i, n)
        self.has_cards = [bool(t) for t in self.total]
        # The best-fit order is built when first walked, once the running replicas are
        # held (``hold``), not moved replica by replica.
        self.bucketed = False
        self._index_domains(domains)
        self.domains = domains
        self.empty: State | None = None
        self.never_memo: dict[tuple[object, ...], str | None] = {}
        self.on_node: list[list[Running]] = [[] for _ in nodes]
        # Replicas of each model per node index: placement spreads them (``spread``).
        self.model_on: dict[str, dict[int, int]] = {}
        # Live running replicas per node, by class rank: who could make way there.
        self.ranks_on: list[dict[int, int]] = [{} for _ in nodes]
        # The nodes running a live replica of each class rank: where eviction may look.
        self.rank_nodes: dict[int, set[int]] = {}
        # Each time a node began to run a live replica of a class rank, in order; and
        # per shape's nodes and rank, the nodes where eviction may look, in name order,
        # with the length of ``became`` then (``evicting._evictable_order``).
        self.became: list[tuple[int, int]] = []
        self.evictable_order: dict[tuple[object, ...], tuple[list[int], int]] = {}
        self.holds_of: dict[int | str, list[Hold]] = {}
        self.alive: dict[int | str, Running] = {}
        self.eligible_cache: dict[tuple[object, ...], frozenset[int]] = {}
        self.engine_index: dict[str, dict[str, list[int]]] | None = None
        # By profile object: it, its need, eligible nodes and key (``placing._known``).
        self.profiles: dict[int, tuple[Any, ...]] = {}
        # By need object: it, and its shape without the weights (``shape``).
        self.shapes: dict[int, tuple[Need, Need]] = {}
        self.bases: dict[int, tuple[Need, Need]] = {}
        self.label_index: dict[str, dict[str, list[int]]] = {}
        # Placements only take capacity, so a request that failed keeps failing until
        # an eviction gives some back (``epoch`` counts them), or a placement starts
        # fetching its weights somewhere (``fetched``, per source), after which that
        # node needs no disk for them. ``commits`` only dates the reason's figures.
        self.epoch = 0
        self.commits = 0
        self.fetched: dict[str, int] = {}
        self.failed: dict[tuple[object, ...], tuple[int, int, int, str]] = {}
        # Every node whose free room changed, in order (``_apply``): what a reason counted
        # over the cluster before need only be counted again on these (``misses``).
        self.changed: list[int] = []
        # How often each node's room changed: a node's trial of victims holds while it
        # did not, and its power checks come out as they did (``evicting._victims``).
        self.node_ver = [0] * len(nodes)
        # The nodes where a replica may fit that did not before (room given back, or a
        # fetch begun: ``_apply``); a shape that fit nowhere is tried again only there.
        self.gained: list[int] = []
        # Where in ``gained`` room was given back (its domains' other nodes may fit).
        self.gained_wide: list[int] = []
        self.find_failed: dict[tuple[object, ...], int] = {}
        # ``dirty_since`` and ``may_fit_since`` by position, kept while their log stands.
        self.dirty_kept = Kept()
        self.gained_kept = Kept()
        # Per shape, the nodes walked that it did not fit, and the length of ``gained``
        # then: passed over until they gain room (``finding.find_again``).
        self.find_bad: dict[object, tuple[set[int], int]] = {}
        # Per shape of a multi-node replica kept within a domain, the groups not known
        # to give it no nodes, and the length of ``changed`` then (``find_groups_again``).
        self.groups_open: dict[tuple[object, ...], tuple[set[str | None], int]] = {}
        self.victims_memo: dict[tuple[object, ...], dict] = {}
        self.could_memo: dict[tuple[object, ...], frozenset[int]] = {}
        # Per shape of a replica whose every node was counted: each node's
        # cheapest room (``evicting``), and the length of ``changed`` then.
        self.options: dict[tuple[object, ...], tuple[dict, int]] = {}
        # The same for a multi-node replica's groups of nodes (``evicting._trials``).
        self.group_trials: dict[tuple[object, ...], tuple[Any, int]] = {}  # ``Groups``
        self.miss_cache: dict[tuple[object, ...], Any] = {}  # ``reasons.Tally`` per shape

    def _index_cards(self, i: int, n: Node) -> None:
        """Record node i's cards: classes, power limits, MIG parents and what is free.

        Nodes of one make report the same cards: what does not change while a plan is
        made (classes, power limits, MIG parents, totals) is worked out once per set of
        cards and shared; the claims and free lists are each node's own.
        """
        key = tuple([(c.index, c.gpu_class, c.power_limit_w, c.mig_of) for c in n.cards])
        found = self.card_kinds.get(key)
        if found is None:
            classes = {c.index: c.gpu_class for c in n.cards}
            children: dict[int, list[int]] = {}
            for c in n.cards:
                if c.mig_of is not None and c.mig_of != c.index:
                    children.setdefault(c.mig_of, []).append(c.index)
            free: dict[str, list[int]] = {}
            for idx in sorted(classes):
                if idx not in children:
                    free.setdefault(classes[idx], []).append(idx)
            watts = {c.index: max(c.power_limit_w, 0.0) for c in n.cards}
            # Cards of one class drawing differently: taking some may leave a replica's
            # derived watts lower there (``_apply``).
            uneven = len({(classes[c], w) for c, w in watts.items()}) > len(set(classes.values()))
            total = {cls: len(idx) for cls, idx in free.items()}
            found = self.card_kinds[key] = (classes, watts, children, free, total, uneven)
        classes, watts, children, free, total, uneven = found
        self.card_class.append(classes)
        self.card_watts.append(watts)
        self.children.append(children)
        self.claims.append(dict.fromkeys(classes, 0))
        self.free.append({cls: idx[:] for cls, idx in free.items()})
        self.total.append(total)
        self.uneven.append(uneven)

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
        self.domain_members: list[list[int]] = [[] for _ in self.cap]
        for i, n in enumerate(self.nodes):
            mine = []
            for level in FACILITY_LEVELS:
                name = n.labels.get(LABEL_PREFIX + level)
                if name is not None and (level, name) in ids:
                    mine.append(ids[(level, name)])
                    self.domain_members[ids[(level, name)]].append(i)
            self.node_domains.append(tuple(mine))

    def _bucket(self) -> None:
        """Build the best-fit order of every schedulable node from what is free now."""
        self.class_buckets = {}
        self.cpu_buckets = Buckets()
        for i, n in enumerate(self.nodes):
            if not n.schedulable:
                continue
            self.cpu_buckets.add(self._cpu_key(i), i)
            free = self.free[i]
            for cls in self.total[i]:
                self.class_buckets.setdefault(cls, Buckets()).add(len(free.get(cls, ())), i)
        self.bucketed = True

    def _cpu_key(self, i: int) -> int:
        """Return node i's place in the best-fit order of CPU profiles."""
        # Nodes without cards first, keeping GPU nodes' hosts for GPU replicas; then
        # the fewest free cores, keeping large holes for large CPU replicas.
        cores = min(max(self.cores[i], 0), 1 << 40)
        return (CARDS_KEY if self.has_cards[i] else 0) + cores

    def hold(self, running: list[Running]) -> None:
        """Count running replicas against their nodes.

        Called once, before anything is asked of the state: what the replicas take is
        counted in bulk (each card's claims, then the free lists of the nodes they are
        on, built once), and not logged as room changed (``changed``, ``gained``), which
        only what happens after it need be.
        """
        self.bucketed = False
        index, card_class, children_of, claims_of = (
            self.index,
            self.card_class,
            self.children,
            self.claims,
        )
        on_node, node_domains, used = self.on_node, self.node_domains, self.used
        mem, cores, held, alive = self.mem, self.cores, self.holds, self.alive
        ranks_on, rank_nodes, became = self.ranks_on, self.rank_nodes, self.became
        model_on, holds_of, fetch = self.model_on, self.holds_of, self._fetch
        touched: set[int] = set()
        for r in sorted(running, key=lambda r: str(r.id)):
            rid = r.id
            if rid in alive:
                raise ValueError(f"two running replicas share the id {rid}")
            alive[rid] = r
            holds = []
            src, rank = r.source, r.class_rank
            mine = model_on.get(r.model)
            if mine is None:
                mine = model_on[r.model] = {}
            for a in r.assignments:
                i = index.get(a.node)
                if i is None:
                    continue  # a node that is gone holds nothing
                classes = card_class[i]
                cards = a.cards
                for c in cards:
                    if c not in classes:  # a card gone from its node holds nothing
                        cards = tuple(c for c in cards if c in classes)
                        break
                h = Hold(i, cards, a.cpu_cores, a.memory_mb, a.disk_mb, a.watts, src)
                holds.append(h)
                here = on_node[i]
                if not here or here[-1] is not r:
                    here.append(r)
                    # ``count_rank`` and ``count_model``, once per node of a replica.
                    ranks = ranks_on[i]
                    k = ranks[rank] = ranks.get(rank, 0) + 1
                    if k == 1:
                        where = rank_nodes.get(rank)
                        if where is None:
                            where = rank_nodes[rank] = set()
                        where.add(i)
                        became.append((i, rank))
                    mine[i] = mine.get(i, 0) + 1
                if cards:
                    claims, children = claims_of[i], children_of[i]
                    for c in cards:
                        claims[c] += 1
                        if children:
                            for child in children.get(c, ()):
                                claims[child] += 1
                    touched.add(i)
                cores[i] -= h.cores
                mem[i] -= h.mem
                if (src and src not in held[i]) or (not src and h.disk):
                    fetch(i, h, 1)
                if h.watts:
                    for d in node_domains[i]:
                        used[d] += h.watts
            holds_of[rid] = holds
        for i in touched:
            claims, children, classes = claims_of[i], children_of[i], card_class[i]
            free: dict[str, list[int]] = {cls: [] for cls in self.free[i]}
            for c in sorted(classes):
                if c not in children and claims[c] == 0:
                    free.setdefault(classes[c], []).append(c)
            self.free[i] = free

    def _apply(self, holds: list[Hold], sign: int) -> None:
        """Take (sign 1) or give back (sign -1) what these holds use."""
        node_domains, used = self.node_domains, self.used
        for h in holds:
            i = h.i
            self.changed.append(i)
            self.node_ver[i] += 1
            domains = node_domains[i]
            # Room given back; or cards taken where power counts on a node whose cards
            # of one class draw differently: a replica's derived watts read the lowest
            # free cards, which may now draw less. Nothing else taken makes a node fit
            # what it did not: a fetch begun reserves the largest disk of those fetching
            # its source, which leaves no replica of that source less to find.
            if sign < 0 or (h.cards and domains and self.uneven[i]):
                # Only room given back frees power its domains' other nodes may use.
                if sign < 0:
                    self.gained_wide.append(len(self.gained))
                self.gained.append(i)
            if h.cards:
                children = self.children[i]
                # Each class's free count before, where it changed: the node moves once
                # in the best-fit order, not once per card.
                counts: dict[str, int] = {}
                for c in h.cards:
                    self._claim(i, c, sign, counts)
                    if children:
                        for child in children.get(c, ()):
                            self._claim(i, child, sign, counts)
                if counts and self.bucketed and self.nodes[i].schedulable:
                    free = self.free[i]
                    for cls, count in counts.items():
                        self.class_buckets[cls].move(count, len(free[cls]), i)
            if h.cores:
                old = self._cpu_key(i)
                self.cores[i] -= sign * h.cores
                if self.bucketed and self.nodes[i].schedulable:
                    self.cpu_buckets.move(old, self._cpu_key(i), i)
            self.mem[i] -= sign * h.mem
            if h.src or h.disk:
                self._fetch(i, h, sign)
            for d in domains:
                used[d] += sign * h.watts

    def _fetch(self, i: int, h: Hold, sign: int) -> None:
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
                self.fetching_at.setdefault(h.src, set()).add(i)
            entry[0] += 1
            if h.disk > entry[1]:
                self.disk[i] -= h.disk - entry[1]
                entry[1] = h.disk
        elif entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                self.disk[i] += entry[1]
                del self.fetching[i][h.src]
                self.fetching_at[h.src].discard(i)

    def _claim(self, i: int, c: int, sign: int, counts: dict[str, int]) -> None:
        """Count a claim on card c of node i (or drop one), keeping the free lists;
        a class whose free list changes first has its count before put in ``counts``."""
        claims = self.claims[i]
        before = claims[c]
        claims[c] = before + sign
        if sign > 0 and before != 0 or sign < 0 and before != 1 or c in self.children[i]:
            return  # already claimed, still claimed, or never offered whole
        cls = self.card_class[i][c]
        free = self.free[i].setdefault(cls, [])
        count = len(free)
        if cls not in counts:
            counts[cls] = count
        if sign > 0:
            del free[bisect.bisect_left(free, c)]
        else:
            bisect.insort(free, c)

    def need(self, p: PlacementProfile) -> Need:
        """Return what each node of a replica of profile p must give."""
        n = max(p.nodes, 1)
        g = max(p.gpus_per_node, 1) if p.gpu_class else 0
        return Need(
            cls=p.gpu_class,
            g=g,
            n=n,
            mem=max(p.min_memory_gb, 0) * MB_PER_GB,
            cores=max(p.cpu_cores, 0),
            disk=max(p.min_disk_gb, 0) * MB_PER_GB,
            watts=p.power_watts / n if p.power_watts > 0 else None,
            src=p.source,
            level=p.keep_within.strip().lower() if n > 1 else "",
        )

    def shape(self, need: Need, always: bool = False) -> Need:
        """Return a need with its source left out where it asks no disk (or, with
        ``always``, in any case): what the weights do not change."""
        if not need.src or (need.disk and not always):
            return need
        found = self.shapes.get(id(need))
        if found is None or found[0] is not need:
            # Built field by field, not by ``dataclasses.replace`` (which looks the
            # fields up each time): each model's profiles have a need of their own.
            shape = Need(
                need.cls,
                need.g,
                need.n,
                need.mem,
                need.cores,
                need.disk,
                need.watts,
                "",
                need.level,
            )
            found = self.shapes[id(need)] = (need, shape)
        return found[1]

    def node_kinds(self) -> list[tuple[dict[str, int], int, int, list[int]]]:
        """Return the nodes by kind: their cards' totals by class, memory and cores as
        reported (what a node emptied would give)."""
        if self.kinds is None:
            kinds: dict[tuple[Any, ...], list[int]] = {}
            by_total: dict[int, tuple[tuple[str, int], ...]] = {}
            for i, n in enumerate(self.nodes):
                total = self.total[i]
                # Shared among nodes of one set of cards (``_index_cards``).
                frozen = by_total.get(id(total))
                if frozen is None:
                    frozen = by_total[id(total)] = tuple(sorted(total.items()))
                kinds.setdefault((frozen, n.memory_mb, n.cpu_cores), []).append(i)
            self.kinds = [(dict(t), m, c, nodes) for (t, m, c), nodes in kinds.items()]
        return self.kinds

    def base(self, need: Need) -> Need:
        """Return a need without its weights and disk: what a node may miss for every
        source alike (its cards, memory, cores and power)."""
        if not need.src and not need.disk:
            return need
        found = self.bases.get(id(need))
        if found is None or found[0] is not need:
            base = Need(
                need.cls, need.g, need.n, need.mem, need.cores, 0, need.watts, "", need.level
            )
            found = self.bases[id(need)] = (need, base)
        return found[1]

    def eligible(self, p: PlacementProfile) -> frozenset[int]:
        """Return the schedulable nodes whose engine, labels and kind suit p."""
        sel = tuple(sorted(p.node_selector.items()))
        key = (p.engine, p.engine_version, sel)
        found = self.eligible_cache.get(key)
        if found is None:
            # By the index of engines and versions (``static_ok``'s rule): the nodes of
            # each matching version, then the node selector on those alone.
            # The node selector by the index of labels (``members``), not node by node.
            versions = self._engine_index().get(p.engine, {})
            suited = frozenset(
                itertools.chain.from_iterable(
                    where
                    for version, where in versions.items()
                    if version_matches(version, p.engine_version)
                )
            )
            for k, v in sel:
                if v:
                    suited = suited.intersection(self.members(k, v))
                else:  # ``members`` leaves out empty values
                    suited = frozenset(i for i in suited if self.labels[i].get(k) == v)
            found = suited
            self.eligible_cache[key] = found
        return found

    def _engine_index(self) -> dict[str, dict[str, list[int]]]:
        """Return the schedulable nodes by engine and its version, as ``static_ok``
        reads them: every such node under sim (its version, or none), only real nodes
        under any other engine."""
        if self.engine_index is None:
            index: dict[str, dict[str, list[int]]] = {}
            for i, n in enumerate(self.nodes):
                if not n.schedulable:
                    continue
                index.setdefault("sim", {}).setdefault(n.engines.get("sim", ""), []).append(i)
                if n.simulated:
                    continue
                for engine, version in n.engines.items():
                    if engine != "sim":
                        index.setdefault(engine, {}).setdefault(version, []).append(i)
            self.engine_index = index
        return self.engine_index

    def static_ok(self, i: int, p: PlacementProfile) -> bool:
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
        if not version_matches(version, p.engine_version):
            return False
        labels = n.labels
        return all(labels.get(k) == v for k, v in p.node_selector.items())

    def cards_for(self, i: int, need: Need) -> list[int]:
        """Return the cards a replica would take on node i: the lowest free of its class."""
        return self.free[i].get(need.cls, [])[: need.g] if need.g else []

    def watts(self, i: int, need: Need) -> float:
        """Return what a replica's share on node i draws."""
        if need.watts is not None:
            return need.watts
        cw = self.card_watts[i]
        return sum(cw[c] for c in self.cards_for(i, need)) + need.cores * self.core_watts

    def disk_needed(self, i: int, need: Need) -> int:
        """Return the disk still to reserve on node i for a replica's weights."""
        if not need.disk or need.src in self.holds[i]:
            return 0
        entry = self.fetching[i].get(need.src) if need.src else None
        return max(need.disk - entry[1], 0) if entry else need.disk

    def fits(self, i: int, need: Need) -> bool:
        """Return whether node i has room for one node's share of a replica."""
        g = need.g
        if g:
            free = self.free[i].get(need.cls, ())
            if len(free) < g:
                return False
        if self.mem[i] < need.mem or self.cores[i] < need.cores:
            return False
        if need.disk and self.disk[i] < self.disk_needed(i, need):
            return False
        domains = self.node_domains[i]
        if domains:
            # ``watts`` and ``cards_for`` inline (asked of most nodes a walk meets), and
            # summed in the same order.
            w = need.watts
            if w is None:
                cw = self.card_watts[i]
                w = (sum(map(cw.__getitem__, free[:g])) if g else 0) + (
                    need.cores * self.core_watts
                )
            used, cap = self.used, self.cap
            for d in domains:
                if used[d] + w > cap[d] + EPSILON:
                    return False
        return True

    def fit_key(self, i: int, need: Need) -> int:
        """Return node i's place in the best-fit order (lower is tighter)."""
        return len(self.free[i].get(need.cls, ())) if need.g else self._cpu_key(i)

    def walk(self, need: Need) -> Iterator[int]:
        """Yield schedulable nodes that may have room, best fit first."""
        if not self.bucketed:
            self._bucket()
        if not need.g:
            # A node with fewer free cores than the replica needs cannot fit it: those
            # without cards, then those with, each from the cores needed up.
            cores = min(need.cores, 1 << 40)
            return itertools.chain(
                self.cpu_buckets.from_key(cores, CARDS_KEY),
                self.cpu_buckets.from_key(CARDS_KEY + cores),
            )
        buckets = self.class_buckets.get(need.cls)
        return buckets.from_key(need.g) if buckets else iter(())

    def walk_among(
        self, need: Need, among: AbstractSet[int], short: set[int] | None = None
    ) -> Iterator[int]:
        """Yield the nodes of ``among`` that ``walk`` would yield, in its order; those
        it passes over (too few free cards or cores) are added to ``short``.

        In order as they are asked for (a heap): a walk that stops at the first node
        that fits does not sort the rest.
        """
        if not need.g:
            cores, key = self.cores, self._cpu_key
            keyed = [(key(i), i) for i in among if cores[i] >= need.cores]
        else:
            free, cls, g = self.free, need.cls, need.g
            keyed = [(k, i) for i in among if (k := len(free[i].get(cls, ()))) >= g]
        if short is not None and len(keyed) < len(among):
            short.update(among.difference(i for _, i in keyed))
        heapq.heapify(keyed)
        while keyed:
            yield heapq.heappop(keyed)[1]

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

    def members(self, label: str, name: str) -> list[int]:
        """Return the nodes labelled name (rack r1, say), in name order."""
        index = self.label_index.get(label)
        if index is None:
            index = self.label_index[label] = {}
            for i, n in enumerate(self.nodes):
                value = n.labels.get(label)
                if value:
                    index.setdefault(value, []).append(i)
        return index.get(name, [])

    def groups(self, need: Need, nodes: list[int]) -> dict[str, list[int]]:
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

    def power_text(self, d: int, used: float, needs: float) -> str:
        """Return the reason a domain's power cap gives."""
        level, name = self.domain_names[d]
        return (
            f"power cap of {level} {name} ({_w(self.cap[d])} W) would be exceeded: "
            f"{_w(used)} W used, needs {_w(needs)} W"
        )

    def commit(self, need: Need, chosen: list[int]) -> tuple[Assignment, ...]:
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
            holds.append(Hold(i, cards, need.cores, need.mem, disk, w, need.src))
            out.append(Assignment(self.nodes[i].name, cards, need.cores, need.mem, disk, w))
            # Apply node by node: the next node's derived watts read its own cards.
            self._apply([holds[-1]], 1)
        return tuple(out)

    def dirty_since(self, pos: int) -> frozenset[int]:
        """Return the nodes whose room may have changed since ``changed`` stood at pos:
        those in it, and every node sharing a power domain with one (its power did).

        Kept until ``changed`` grows: the shapes asked about between two changes share
        the positions they last counted at.
        """
        return self.dirty_kept.at(
            len(self.changed), pos, lambda p: self._with_domains(*self.changed_since(p))
        )

    def may_fit_since(self, pos: int) -> frozenset[int]:
        """Return the nodes that may fit what they did not since ``gained`` stood at pos:
        those that gained room, and every node of a power domain where room was given
        back (``gained_since``). Kept until ``gained`` grows, as ``dirty_since``."""
        return self.gained_kept.at(
            len(self.gained), pos, lambda p: self._with_domains(*self.gained_since(p))
        )

    def _with_domains(self, nodes: set[int], domains: set[int]) -> frozenset[int]:
        """Return ``nodes`` with every node of ``domains``."""
        members = self.domain_members
        for d in domains:
            nodes.update(members[d])
        return frozenset(nodes)

    def gained_since(self, pos: int) -> tuple[set[int], set[int]]:
        """Return the nodes that gained room since ``gained`` stood at pos, and the power
        domains where room was given back (each of their nodes may fit now)."""
        gained = self.gained
        nodes = set(gained[pos:])
        wide = self.gained_wide
        node_domains = self.node_domains
        domains = {
            d for k in wide[bisect.bisect_left(wide, pos) :] for d in node_domains[gained[k]]
        }
        return nodes, domains

    def changed_since(self, pos: int, log: list[int] | None = None) -> tuple[set[int], set[int]]:
        """Return the nodes in a log since pos, and the power domains they are in."""
        nodes = set((self.changed if log is None else log)[pos:])
        node_domains = self.node_domains
        return nodes, {d for i in nodes for d in node_domains[i]}

    def count_rank(self, i: int, rank: int, sign: int) -> None:
        """Count a live replica of a class rank on node i (sign 1), or stop counting it."""
        ranks = self.ranks_on[i]
        ranks[rank] = ranks.get(rank, 0) + sign
        if ranks[rank] > 0:
            self.rank_nodes.setdefault(rank, set()).add(i)
            if ranks[rank] == sign:
                self.became.append((i, rank))
        else:
            self.rank_nodes.get(rank, set()).discard(i)

    def evictable_among(self, nodes: frozenset[int] | set[int], rank: int) -> set[int]:
        """Return the nodes among these that run a live replica of a class below rank."""
        out: set[int] = set()
        for r, where in self.rank_nodes.items():
            if r < rank:
                out |= where & nodes
        return out

    def any_evictable(self, nodes: frozenset[int], rank: int) -> bool:
        """Return whether any of these nodes runs a live replica of a class below rank."""
        return any(not where.isdisjoint(nodes) for r, where in self.rank_nodes.items() if r < rank)

    def release(self, r: Running) -> None:
        """Give back what a running replica holds."""
        self._apply(self.holds_of[r.id], -1)

    def reclaim(self, r: Running) -> None:
        """Take again what a released running replica held."""
        self._apply(self.holds_of[r.id], 1)
