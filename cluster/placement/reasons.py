"""Why a request fits nowhere, in words an operator reads, and whether it never could.

``diagnose`` checks every node against every condition (``CONDITIONS``) and tells the one
that binds; ``_staged`` walks the conditions in turn where none binds alone. ``never``
asks the same of the cluster as built, every node empty and taking replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace as replace_node

from catalog.rules import FACILITY_LEVELS, suggest_cores
from cluster.placement.data import LABEL_PREFIX, PlacementProfile, Request, profile_key
from cluster.placement.finding import choose, find
from cluster.placement.state import EPSILON, MB_PER_GB, Need, State, version_matches

# What a node may miss for a profile, in the order a reason names them when several
# bind: whether it takes new replicas, the cards (class, how many, free), the engine and
# its version, the node selector, the keep_within label, what is free now (memory,
# cores, disk, power), and last that it is simulated, which no operator can change: a
# real node that lacks only llama-server is told before simulated nodes with room.
CONDITIONS = (
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


def _gb(mb: int) -> str:
    """Return megabytes as gigabytes, as a person reads them."""
    v = mb / MB_PER_GB
    return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"


def _with_cards(need: Need) -> str:
    """Return which nodes a reason speaks of: " with L4 cards", " with 2 L4" (or none)."""
    if not need.g:
        return ""
    return f" with {need.cls} cards" if need.g == 1 else f" with {need.g} {need.cls}"


def _selector_text(sel: Mapping[str, str]) -> str:
    """Return a node selector as written in a reason: a=b,c=d."""
    return ",".join(f"{k}={sel[k]}" for k in sorted(sel))


def why_unplaced(
    state: State, req: Request, tries: list[tuple[PlacementProfile, Need, frozenset[int]]]
) -> str:
    """Return why a request fits nowhere: each profile's closest miss, in order tried."""
    parts = [(p, diagnose(state, p, need)) for p, need, _ in tries]
    if len(parts) == 1:
        text = parts[0][1]
    else:
        text = ". ".join(f'profile "{p.name}": {why}' for p, why in parts)
    lower = any(state.any_evictable(elig, req.class_rank) for _, _, elig in tries)
    if lower:
        text += " (evicting lower-class replicas would not make room)"
    return text


def never(state: State, req: Request) -> str | None:
    """Return why no node could run req even were all of them empty and taking
    replicas, or None when one could (or the cluster has no node yet to judge by).

    Counted on the cluster as built: every card, the whole memory and cores, every
    power cap with nothing drawing; not the disk, which is free or not as weights come
    and go.
    """
    if not state.nodes:
        return None
    key = tuple(profile_key(p) for p in req.profiles)
    if key in state.never_memo:
        return state.never_memo[key]
    if state.empty is None:
        state.empty = State(
            [
                replace_node(n, schedulable=True, disk_free_mb=0, holds=frozenset())
                for n in state.nodes
            ],
            state.domains,
            state.core_watts,
        )
    empty = state.empty
    profiles = sorted(req.profiles, key=lambda p: -p.priority)
    tries = [(p, empty.need(p), empty.eligible(p)) for p in profiles]
    why: str | None = None
    if not any(
        not (need.level and need.level not in FACILITY_LEVELS)
        and not (need.g == 0 and p.gpus_per_node > 0)
        and find(empty, need, elig)
        for p, need, elig in tries
    ):
        parts = [(p, diagnose(empty, p, need)) for p, need, _ in tries]
        why = (
            parts[0][1]
            if len(parts) == 1
            else ". ".join(f'profile "{p.name}": {w}' for p, w in parts)
        )
    state.never_memo[key] = why
    return why


def diagnose(state: State, p: PlacementProfile, need: Need) -> str:
    """Return why no node (or set of nodes) fits p, naming the constraint that bound.

    Each node is checked against every condition (``_misses``). A condition binds
    when the nodes that miss only it, with those that miss nothing, would be enough:
    the first such condition, in the order of ``CONDITIONS``, is told, with the best
    of those nodes. Where no single condition would be enough (nodes that miss
    several), the conditions are walked in turn and the first that leaves too few
    nodes is told (``_staged``).
    """
    if need.level and need.level not in FACILITY_LEVELS:
        return _staged(state, p, need)
    if need.g == 0 and p.gpus_per_node > 0:
        return _staged(state, p, need)
    nn = need.n
    tally = _tally(state, p, need)
    fit = tally.fit + tally.fit_delta
    if fit >= nn:
        # Enough nodes each fit: what binds is how they group (keep_within, power).
        return _staged(state, p, need)
    # The cards first: a reason never says no node has them where some node has,
    # so the nodes that have them are the ones whose miss is told (``Tally.pool``).
    for cond in CONDITIONS:
        only = tally.only(cond)
        if only and fit + len(only) >= nn:
            return _bound(state, cond, p, need, sorted(only), fit)
    return _staged(state, p, need)


class Tally:
    """What the nodes miss for one shape of a profile (``_misses``), counted.

    ``misses`` by node index; ``fit``, how many miss nothing; ``alone``, by condition,
    the nodes of ``pool`` (the nodes whose miss may be told) that miss only it. Kept per
    shape, its weights aside, and counted again only on the nodes whose room changed
    since ``pos`` (``State.dirty_since``): what a node is and runs does not change in a
    plan. The nodes holding or fetching one replica's weights are counted for it on the
    side (``fit_delta``, ``added``, ``removed``).
    """

    def __init__(
        self, misses: list[tuple[str, ...]], static: list[Static], pool: list[bool], pos: int
    ) -> None:
        """Count what each node misses (``static``: what it misses whatever is free)."""
        self.misses = misses
        self.static = static
        self.drawn: dict[int, float] = {}
        self.pool = pool
        self.pos = pos
        self.fit = 0
        self.alone: dict[str, set[int]] = {}
        for i, m in enumerate(misses):
            self._count(i, m, 1)
        self.fit_delta = 0
        self.added: dict[str, set[int]] = {}
        self.removed: dict[str, set[int]] = {}

    def _count(self, i: int, m: tuple[str, ...], sign: int) -> None:
        """Count (sign 1) or stop counting (-1) node i missing m."""
        if not m:
            self.fit += sign
        elif len(m) == 1 and self.pool[i]:
            if sign > 0:
                self.alone.setdefault(m[0], set()).add(i)
            else:
                self.alone[m[0]].discard(i)

    def watts(self, state: State, i: int, need: Need) -> float:
        """Return what this shape's share on node i draws, known while node i's room
        stays as it is (its lowest free cards)."""
        w = self.drawn.get(i)
        if w is None:
            w = self.drawn[i] = state.watts(i, need)
        return w

    def set(self, i: int, m: tuple[str, ...]) -> None:
        """Record what node i misses now."""
        self.drawn.pop(i, None)
        old = self.misses[i]
        if old != m:
            self._count(i, old, -1)
            self._count(i, m, 1)
            self.misses[i] = m

    def side(self, i: int, m: tuple[str, ...]) -> None:
        """Count node i as missing m for one replica only, in place of ``misses[i]``."""
        old = self.misses[i]
        if old == m:
            return
        self.fit_delta += (not m) - (not old)
        if len(old) == 1 and self.pool[i]:
            self.removed.setdefault(old[0], set()).add(i)
        if len(m) == 1 and self.pool[i]:
            self.added.setdefault(m[0], set()).add(i)

    def only(self, cond: str) -> set[int]:
        """Return the nodes of the pool that miss only cond."""
        base = self.alone.get(cond, set())
        removed, added = self.removed.get(cond), self.added.get(cond)
        if removed or added:
            return (base - (removed or set())) | (added or set())
        return base


def _tally(state: State, p: PlacementProfile, need: Need) -> Tally:
    """Return what each node misses for p, counted (``Tally``), for this replica's weights."""
    shape = state.shape(need, always=True)
    key = (p.engine, p.engine_version, tuple(sorted(p.node_selector.items())), shape)
    tally = state.miss_cache.get(key)
    if tally is None:
        static = [_static(state, i, p, shape) for i in range(len(state.nodes))]
        misses = [_misses(state, i, shape, static[i]) for i in range(len(state.nodes))]
        tally = Tally(misses, static, _pool(state, need), len(state.changed))
        state.miss_cache[key] = tally
    elif tally.pos < len(state.changed):
        # A node whose own room did not change, in a domain whose power did, may
        # have come within its caps or gone over them: only that is counted again.
        nodes, domains = state.changed_since(tally.pos)
        for i in nodes:
            tally.set(i, _misses(state, i, shape, tally.static[i]))
        members, node_domains, used, cap = (
            state.domain_members,
            state.node_domains,
            state.used,
            state.cap,
        )
        for d in domains:
            for i in members[d]:
                if i in nodes:
                    continue
                old = tally.misses[i]
                w = tally.watts(state, i, shape)
                over = any(used[e] + w - cap[e] > EPSILON for e in node_domains[i])
                if over != ("power" in old):
                    tally.set(i, _with_power(old, over))
        tally.pos = len(state.changed)
    tally.fit_delta = 0
    tally.added, tally.removed = {}, {}
    if need.src and need.disk:
        for i in state.holders.get(need.src, set()) | state.fetching_at.get(need.src, set()):
            tally.side(i, _misses(state, i, need, tally.static[i]))
    return tally


def _pool(state: State, need: Need) -> list[bool]:
    """Return, by node index, whether a node's miss may be told: where enough nodes have
    cards of the class (and enough of them), only those."""
    n = len(state.nodes)
    pool = list(range(n))
    if need.g:
        has = [i for i in pool if state.total[i].get(need.cls, 0) > 0]
        if len(has) >= need.n:
            pool = has
        enough = [i for i in pool if state.total[i].get(need.cls, 0) >= need.g]
        if len(enough) >= need.n:
            pool = enough
    out = [False] * n
    for i in pool:
        out[i] = True
    return out


Static = tuple[tuple[str, ...], bool, bool]


def _with_power(misses: tuple[str, ...], over: bool) -> tuple[str, ...]:
    """Return what a node misses with "power" put in its place (over its caps) or
    taken out."""
    out = [c for c in misses if c != "power"]
    if over:
        out.insert(len(out) - 1 if out and out[-1] == "real" else len(out), "power")
    return tuple(out)


def _static(state: State, i: int, p: PlacementProfile, need: Need) -> Static:
    """Return what node i misses for p whatever is free on it: those conditions in
    ``CONDITIONS`` order but "real", whether its free cards are to be counted, and
    whether it misses "real" (told last)."""
    n = state.nodes[i]
    out = set()
    if not n.schedulable:
        out.add("ready")
    real = p.engine != "sim" and n.simulated
    if not real:
        if p.engine != "sim" and p.engine not in n.engines:
            out.add("engine")
        elif not version_matches(n.engines.get(p.engine, ""), p.engine_version):
            out.add("version")
    if not all(n.labels.get(k) == v for k, v in p.node_selector.items()):
        out.add("selector")
    if need.level and not n.labels.get(LABEL_PREFIX + need.level):
        out.add("label")
    free = False
    if need.g:
        total = state.total[i].get(need.cls, 0)
        if total == 0:
            out.add("class")
        elif total < need.g:
            out.add("count")
        else:
            free = True
    return tuple(c for c in CONDITIONS if c in out), free, real


def _misses(state: State, i: int, need: Need, static: Static) -> tuple[str, ...]:
    """Return the conditions node i misses, one per kind, in ``CONDITIONS`` order: what
    it is and runs (``_static``), then what is free on it now.

    Conditions of one kind are a chain: a node without the engine is not also said
    to lack its version, one without cards of the class not also to lack free ones.
    """
    head, free, real = static
    out = list(head)
    if free and len(state.free[i].get(need.cls, ())) < need.g:
        out.append("free")
    if state.mem[i] < need.mem:
        out.append("memory")
    if state.cores[i] < need.cores:
        out.append("cores")
    if need.disk and state.disk[i] < state.disk_needed(i, need):
        out.append("disk")
    domains = state.node_domains[i]
    if domains:
        w = state.watts(i, need)
        used, cap = state.used, state.cap
        if any(used[d] + w - cap[d] > EPSILON for d in domains):
            out.append("power")
    if real:
        out.append("real")
    return tuple(out)


def _bound(
    state: State, cond: str, p: PlacementProfile, need: Need, only: list[int], fit: int
) -> str:
    """Return the reason a binding condition gives, over the nodes that miss only it."""
    nn = need.n
    nodes = state.nodes
    names = ", ".join(nodes[i].name for i in only[:3]) + (", …" if len(only) > 3 else "")
    what = f"{need.g} free {need.cls}" if need.g else "room for it"
    if cond == "ready":
        if not any(n.schedulable for n in nodes):
            return "no node is ready for new replicas"
        where = f"only nodes that take no new replicas (cordoned, not ready or lost) have {what}: {names}"
        return where if nn == 1 else f"{_short(nn, fit, what)} ({where})"
    if cond == "real":
        text = (
            f"only simulated nodes have {what} ({names}), "
            f"and they run only sim profiles, not {p.engine}"
        )
        return text if nn == 1 else f"{_short(nn, fit, 'real cards')}: {text}"
    if cond == "class":
        return f"no node has {need.cls} cards" if nn == 1 or not fit else _short(nn, fit, need.cls)
    if cond == "count":
        if nn == 1:
            most = max(t.get(need.cls, 0) for t in state.total)
            return f"needs {need.g} {need.cls} on one node; the largest node has {most}"
        return _short(nn, fit, f"{need.g} {need.cls}")
    if cond in ("engine", "version", "selector"):
        return _bound_software(state, cond, p, need, only, fit)
    if cond == "label":
        label = LABEL_PREFIX + need.level
        return f"keep_within {need.level}: {_short(nn, fit, f'a {label} label')}"
    if cond == "free":
        if nn == 1:
            best = max(len(state.free[i].get(need.cls, ())) for i in only)
            return f"needs {need.g} free {need.cls} on one node; the best node has {best}"
        return _short(nn, fit, what)
    stage = {
        "memory": _memory_stage,
        "cores": _cores_stage,
        "disk": _disk_stage,
        "power": _power_stage,
    }[cond]
    _, text, each = stage(state, only, need)
    return text if nn == 1 else _short(nn, fit, each)


def _bound_software(
    state: State, cond: str, p: PlacementProfile, need: Need, only: list[int], fit: int
) -> str:
    """Return the reason the engine, its version or the node selector gives when it binds."""
    if cond == "engine":
        what, has = f"engine {p.engine}", _has_engine(state, p)
    elif cond == "version":
        versions = sorted({state.nodes[i].engines.get(p.engine, "") for i in only} - {""})
        found = f" (found {', '.join(versions[:3])})" if versions else ""
        what, has = f"engine {p.engine} {p.engine_version}{found}", _has_version(state, p)
    else:
        what = f"node_selector {_selector_text(p.node_selector)}"
        has = _has_labels(state, p)
    if need.n > 1:
        each = f"engine {p.engine} {p.engine_version}" if cond == "version" else what
        return _short(need.n, fit, each)
    verb = "matches" if cond == "selector" else "has"
    claim = f"no node{_with_cards(need)} {verb} {what}"
    return _no_node(state, need, claim, only, what, has)


def _short(nn: int, found: int, each: str) -> str:
    """Return the reason for too few nodes of a multi-node profile."""
    return f"needs {nn} nodes each with {each}; found {found}"


def _staged(state: State, p: PlacementProfile, need: Need) -> str:
    """Return why no node fits p: the stage where the last nodes fell out.

    Walks the nodes through each condition in turn; the first condition that leaves
    too few nodes is the closest miss, told with the best node it dropped: first what
    the node is and runs (``_suited``), then what is free on it now (``_short_of_room``).
    """
    if need.level and need.level not in FACILITY_LEVELS:
        return f'keep_within "{p.keep_within}" is not one of {", ".join(FACILITY_LEVELS)}'
    if need.g == 0 and p.gpus_per_node > 0:
        return (
            f"names no gpu_class but asks for {p.gpus_per_node} GPUs per node; "
            "only a llamacpp profile runs without a GPU"
        )
    c, why = _suited(state, p, need)
    return why or _short_of_room(state, need, c)


def _suited(state: State, p: PlacementProfile, need: Need) -> tuple[list[int], str]:
    """Return the ready nodes that could run p were they empty, or why too few could:
    ready, real, with enough cards of the class, then ``_runs``."""
    nn = need.n
    nodes = state.nodes
    c = [i for i in range(len(nodes)) if nodes[i].schedulable]
    if len(c) < nn:
        return c, (
            "no node is ready for new replicas"
            if not c
            else f"needs {nn} ready nodes; found {len(c)}"
        )
    if p.engine != "sim":
        real = [i for i in c if not nodes[i].simulated]
        if len(real) < nn:
            return real, (
                f"only simulated nodes are ready, and they run only sim profiles, not {p.engine}"
                if not real
                else _short(nn, len(real), "real cards")
            )
        c = real
    if need.g:
        kept = [i for i in c if state.total[i].get(need.cls, 0) > 0]
        if len(kept) < nn:
            return kept, _class_missing(state, p, need, c, kept)
        c = kept
        kept = [i for i in c if state.total[i][need.cls] >= need.g]
        if len(kept) < nn:
            return kept, _class_missing(state, p, need, c, kept, need.g)
        # A node with fewer cards of the class than a replica needs never fits it.
        c = kept
    return _runs(state, p, need, c)


def _runs(state: State, p: PlacementProfile, need: Need, c: list[int]) -> tuple[list[int], str]:
    """Return the nodes of c with p's engine and version, its node selector and its
    keep_within label, or why too few have them."""
    nn = need.n
    nodes = state.nodes
    q = _with_cards(need)
    has = _has_engine(state, p)
    kept = [i for i in c if has(i)]
    if len(kept) < nn:
        if nn == 1 or not kept:
            what = f"engine {p.engine}"
            return kept, _no_node(state, need, f"no node{q} has {what}", c, what, has)
        return kept, _short(nn, len(kept), f"engine {p.engine}")
    c = kept
    has = _has_version(state, p)
    kept = [i for i in c if has(i)]
    if len(kept) < nn:
        versions = sorted({nodes[i].engines.get(p.engine, "") for i in c} - {""})
        found = f" (found {', '.join(versions[:3])})" if versions else ""
        if nn == 1 or not kept:
            what = f"engine {p.engine} {p.engine_version}{found}"
            return kept, _no_node(state, need, f"no node{q} has {what}", c, what, has)
        return kept, _short(nn, len(kept), f"engine {p.engine} {p.engine_version}")
    c = kept
    kept = [i for i in c if state.static_ok(i, p)]
    if len(kept) < nn:
        what = f"node_selector {_selector_text(p.node_selector)}"
        if nn == 1 or not kept:
            claim = f"no node{q} matches {what}"
            return kept, _no_node(state, need, claim, c, what, _has_labels(state, p))
        return kept, _short(nn, len(kept), what)
    c = kept
    if need.level:
        label = LABEL_PREFIX + need.level
        kept = [i for i in c if nodes[i].labels.get(label)]
        if len(kept) < nn:
            return kept, f"keep_within {need.level}: {_short(nn, len(kept), f'a {label} label')}"
        c = kept
    return c, ""


def _short_of_room(state: State, need: Need, c: list[int]) -> str:
    """Return why the nodes c, which could run the replica, have no room for it now:
    free cards, memory, cores, disk, power, then how they group (keep_within, power)."""
    nn = need.n
    what = f"{need.g} free {need.cls}" if need.g else "room for it"
    if need.g:
        kept = [i for i in c if len(state.free[i].get(need.cls, ())) >= need.g]
        if len(kept) < nn:
            best = max(len(state.free[i].get(need.cls, ())) for i in c)
            if nn == 1:
                return f"needs {need.g} free {need.cls} on one node; the best node has {best}"
            return _short(nn, len(kept), what)
        c = kept
    for stage in (_memory_stage, _cores_stage, _disk_stage, _power_stage):
        kept, text, each = stage(state, c, need)
        if len(kept) < nn:
            return text if nn == 1 else _short(nn, len(kept), each)
        c = kept
    groups = state.groups(need, c)
    big = {name: m for name, m in groups.items() if len(m) >= nn}
    if not big:
        most = max((len(m) for m in groups.values()), default=0)
        return (
            f"keep_within {need.level}: no {need.level} has {nn} nodes with {what}; "
            f"the best has {most}"
        )
    for name in sorted(big):
        chosen, blocked = choose(state, need, big[name])
        if not chosen and blocked:
            return blocked
    return "no node fits"


def _has_engine(state: State, p: PlacementProfile) -> Callable[[int], bool]:
    return lambda i: p.engine == "sim" or p.engine in state.nodes[i].engines


def _has_version(state: State, p: PlacementProfile) -> Callable[[int], bool]:
    return lambda i: version_matches(state.nodes[i].engines.get(p.engine, ""), p.engine_version)


def _has_labels(state: State, p: PlacementProfile) -> Callable[[int], bool]:
    sel = p.node_selector
    return lambda i: all(state.nodes[i].labels.get(k) == v for k, v in sel.items())


def _no_node(
    state: State, need: Need, claim: str, closest: list[int], what: str, has: Callable[[int], bool]
) -> str:
    """Return ``claim`` ("no node with L4 cards has engine vllm") where it is true of
    every node of the cluster (with the cards, if any), else what the closest nodes
    lack, naming them: a node that has it may miss something else, or be cordoned."""
    pool = [
        i
        for i in range(len(state.nodes))
        if not need.g or state.total[i].get(need.cls, 0) >= need.g
    ]
    if not any(has(i) for i in pool):
        return claim
    lacking = [i for i in closest if not has(i)] or closest
    names = ", ".join(state.nodes[i].name for i in lacking[:3])
    names += ", …" if len(lacking) > 3 else ""
    return f"the nodes closest to fit ({names}) lack {what}"


def _class_missing(
    state: State, p: PlacementProfile, need: Need, c: list[int], kept: list[int], g: int = 1
) -> str:
    """Return the reason for too few nodes with g cards of the class among c (the
    ready nodes that may run p), true of the whole cluster: nodes c left out (not
    ready, simulated) may have them."""
    nn = need.n
    what = f"{g} {need.cls}" if g > 1 else need.cls
    if kept:
        return f"needs {nn} nodes each with {what}; found {len(kept)}"
    has = [i for i in range(len(state.nodes)) if state.total[i].get(need.cls, 0) >= g]
    if not has:
        if g == 1:
            return f"no node has {need.cls} cards"
        most = max(state.total[i].get(need.cls, 0) for i in range(len(state.nodes)))
        if nn == 1:
            return f"needs {g} {need.cls} on one node; the largest node has {most}"
        return f"needs {nn} nodes each with {what}; found 0"
    cards = f"{need.cls} cards" if g == 1 else f"{g} {need.cls} on one node"
    names = ", ".join(state.nodes[i].name for i in has[:3]) + (", …" if len(has) > 3 else "")
    ready = [i for i in has if state.nodes[i].schedulable]
    if not ready:
        return (
            "only nodes that take no new replicas (cordoned, not ready or lost) have "
            f"{cards}: {names}"
        )
    return (
        f"only simulated nodes have {cards} ({names}), and they run only sim "
        f"profiles, not {p.engine}"
    )


def _memory_stage(state: State, c: list[int], need: Need) -> tuple[list[int], str, str]:
    """Keep the nodes with the memory; say why the others miss."""
    kept = [i for i in c if state.mem[i] >= need.mem]
    each = f"{_gb(need.mem)} GB memory free"
    if len(kept) == len(c):
        return kept, "", each
    largest = max(state.nodes[i].memory_mb for i in c)
    if 0 < largest < need.mem:
        text = f"needs {_gb(need.mem)} GB memory; the largest node has {_gb(largest)} GB"
        return kept, text, each
    roomiest = max(max(state.mem[i], 0) for i in c)
    text = f"needs {_gb(need.mem)} GB memory; the roomiest node has {_gb(roomiest)} GB free"
    return kept, text, each


def _cores_stage(state: State, c: list[int], need: Need) -> tuple[list[int], str, str]:
    """Keep the nodes with the cores; say why the others miss."""
    kept = [i for i in c if state.cores[i] >= need.cores]
    each = f"{need.cores} free CPU cores"
    if len(kept) == len(c):
        return kept, "", each
    counts = [state.nodes[i].cpu_cores for i in c]
    largest = max(counts)
    if 0 < largest < need.cores:
        hint = suggest_cores(counts)
        text = (
            f"needs {need.cores} CPU cores; the largest node has {largest} "
            f"(cpu_cores {hint}, half the smallest node, would suit these nodes)"
        )
        return kept, text, each
    best = max(max(state.cores[i], 0) for i in c)
    return kept, f"needs {need.cores} free CPU cores; the best node has {best} free", each


def _disk_stage(state: State, c: list[int], need: Need) -> tuple[list[int], str, str]:
    """Keep the nodes with the disk; say why the others miss."""
    kept = [i for i in c if state.disk[i] >= state.disk_needed(i, need)]
    each = f"{_gb(need.disk)} GB disk free or the weights"
    if len(kept) == len(c):
        return kept, "", each
    roomiest = max(max(state.disk[i], 0) for i in c)
    text = (
        f"needs {_gb(need.disk)} GB disk for the weights; "
        f"the roomiest node has {_gb(roomiest)} GB free"
    )
    return kept, text, each


def _power_stage(state: State, c: list[int], need: Need) -> tuple[list[int], str, str]:
    """Keep the nodes within their power caps; name the closest miss."""
    kept = []
    closest: tuple[float, str] | None = None
    for i in c:
        w = state.watts(i, need)
        over = [(state.used[d] + w - state.cap[d], d) for d in state.node_domains[i]]
        worst = max(over, default=(0.0, -1))
        if worst[0] <= EPSILON:
            kept.append(i)
        elif closest is None or worst[0] < closest[0]:
            d = worst[1]
            closest = (worst[0], state.power_text(d, state.used[d], w))
    text = closest[1] if closest else ""
    return kept, text, f"power under its caps ({text})"
