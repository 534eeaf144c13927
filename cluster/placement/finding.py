"""The best node, or set of nodes, for a replica: spread, then the weights, then best fit."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

from catalog.rules import FACILITY_LEVELS
from cluster.placement.data import LABEL_PREFIX
from cluster.placement.state import EPSILON, Need, State


def find_again(state: State, need: Need, elig: frozenset[int], model: str = "") -> list[int]:
    """Return what ``find`` returns, knowing where the same shape fit nowhere before.

    A placement only takes room; a shape that fit no node fits none until some node
    gains room (``State.gained``), and then only there: only those nodes are tried.
    The shape is the need, its source left out where it asks no disk. The nodes a
    shape did not fit are passed over until they gain: those short of what does not
    depend on the weights (cards, memory, cores, power) for every source alike, those
    short of disk for this source alone; either for every profile's engine and node
    selector alike. A multi-node replica: ``find_groups_again``.
    """
    if need.n > 1:
        return find_groups_again(state, need, elig)
    shape = state.shape(need)
    key = (shape, elig)
    now = len(state.gained)
    pos = state.find_failed.get(key)
    if pos == now:
        return []
    base = state.base(need)
    # Whether a node fits a need does not hang on the nodes a profile may take: the
    # misses are kept per need alone, shared by profiles of other engines and labels.
    bad = _still_bad(state, base, now)
    short = _still_bad(state, shape, now) if need.disk else bad
    if pos is None:
        chosen = find(state, need, elig, model, bad=bad, short=short)
    else:
        among = (state.may_fit_since(pos) & elig) - bad
        if short is not bad:
            among -= short
        chosen = find(state, need, elig, model, among, bad, short) if among else []
    if not chosen:
        state.find_failed[key] = now
    return chosen


def _still_bad(state: State, key: object, now: int) -> set[int]:
    """Return the nodes a shape was found not to fit that have not gained room since,
    kept under key (``State.find_bad``)."""
    kept = state.find_bad.get(key)
    if kept is None:
        bad: set[int] = set()
    else:
        bad, since = kept
        if bad and since < now:
            bad -= state.may_fit_since(since)
    state.find_bad[key] = (bad, now)
    return bad


def find_groups_again(state: State, need: Need, elig: frozenset[int]) -> list[int]:
    """Return what ``find_multi`` returns, knowing which groups of nodes did not fit.

    Whether a group (a rack, say, for keep_within rack) gives a replica its nodes
    depends only on its own nodes and the power of their domains: a group that gave
    none gives none until one of those changes (``State.dirty_since``), so only the
    groups that changed, and those holding the weights (walked without their holders),
    are walked again, in the same order. Without keep_within the nodes are one group.
    """
    now = len(state.changed)
    if not need.level or need.level not in FACILITY_LEVELS:
        key = (need, elig)
        if state.find_failed.get(key) == now:
            return []
        chosen = find_multi(state, need, elig)
        if not chosen:
            state.find_failed[key] = now
        return chosen
    label = LABEL_PREFIX + need.level
    labels = state.labels
    key = (state.shape(need, always=True), elig)
    kept = state.groups_open.get(key)
    held = (
        {labels[i].get(label) for i in state.holders.get(need.src, ()) if i in elig}
        if need.src
        else set()
    )
    if kept is None:
        chosen = find_multi(state, need, elig)
        if chosen:
            return chosen  # nothing known of the groups after the one that gave
        open_: set[str | None] = set()
    else:
        open_, pos = kept
        if pos < now:
            open_ |= {labels[i].get(label) for i in state.dirty_since(pos)}
        open_ |= held
        among: set[int] = set()
        for name in open_:
            if name:
                among.update(state.members(label, name))
        chosen = find_multi(state, need, elig, among)
    # Failed: every group not holding the weights is known not to give nodes; given
    # nodes, the groups not walked are still known not to.
    state.groups_open[key] = (open_ if chosen else held, now)
    return chosen


def find(
    state: State,
    need: Need,
    elig: frozenset[int],
    model: str = "",
    among: AbstractSet[int] | None = None,
    bad: set[int] | None = None,
    short: set[int] | None = None,
) -> list[int]:
    """Return the best nodes for a replica, or [] when none fit.

    A one-node replica goes where its model has the fewest replicas: on the node,
    then in its rack (``spread``); then on a node holding the weights, then the best
    fit. With ``among``, only those nodes are walked: every node that fits must be
    among them. With ``bad``, the nodes in it are known not to fit and are passed
    over, and each node walked that does not fit is added to it; with ``short`` too,
    those that would fit but for the disk go there instead.
    """
    if need.n > 1:
        return find_multi(state, need, elig, among)
    holders = state.holders.get(need.src) if need.src else None
    mine = state.model_on.get(model) if model else None
    if bad is None:
        bad = set()
    if short is None or short is bad or not need.disk:
        short, base, disk_short = bad, need, None
    else:
        base = state.base(need)
        disk, disk_needed = state.disk, state.disk_needed

        def disk_short(i: int) -> bool:
            return disk[i] < disk_needed(i, need)

    walk = state.walk(need) if among is None else state.walk_among(need, among, bad)
    fits = state.fits
    if not mine:
        if holders:
            best = min(
                ((state.fit_key(i, need), i) for i in holders & elig if fits(i, need)),
                default=None,
            )
            if best is not None:
                return [best[1]]
        for i in walk:
            if i in elig and i not in bad and i not in short:
                if not fits(i, base):
                    bad.add(i)
                elif disk_short and disk_short(i):
                    short.add(i)
                else:
                    return [i]
        return []
    found: tuple[tuple[int, int], int, int] | None = None
    if holders:
        for _, i in sorted((state.fit_key(i, need), i) for i in holders & elig if fits(i, need)):
            score = state.spread(model, i)
            if not any(score):
                return [i]
            if found is None or (score, 0) < found[:2]:
                found = (score, 0, i)
    for i in walk:
        if i in elig and i not in bad and i not in short:
            if not fits(i, base):
                bad.add(i)
                continue
            if disk_short and disk_short(i):
                short.add(i)
                continue
            score = state.spread(model, i)
            if not any(score):
                return [i]
            if found is None or (score, 1) < found[:2]:
                found = (score, 1, i)
    return [found[2]] if found else []


def find_multi(
    state: State, need: Need, elig: frozenset[int], among: set[int] | None = None
) -> list[int]:
    """Return ``need.n`` nodes for a multi-node replica, or [].

    Groups holding the weights are tried first, whole; then the nodes are walked in
    best-fit order, and the first group to gather enough of them (with power for
    all) wins, which keeps the smallest holes in use.
    """
    label = LABEL_PREFIX + need.level if need.level else ""
    labels = state.labels
    holders = state.holders.get(need.src, set()) & elig if need.src else set()
    if label:
        names = sorted(
            {labels[i][label] for i in holders if labels[i].get(label) and state.fits(i, need)}
        )
        best: tuple[tuple[int, int, str], list[int]] | None = None
        for name in names:
            members = [i for i in state.members(label, name) if i in elig and state.fits(i, need)]
            chosen, _ = choose(state, need, members)
            if chosen:
                held = sum(need.src in state.holds[i] for i in chosen)
                score = (-held, sum(state.fit_key(i, need) for i in chosen), name)
                if best is None or score < best[0]:
                    best = (score, chosen)
        if best:
            return best[1]
        found: dict[str, list[int]] = {}
    else:
        # One group, the holders in it from the start: _choose puts them first.
        found = {"": sorted(i for i in holders if state.fits(i, need))}
    walk = state.walk(need) if among is None else state.walk_among(need, among)
    for i in walk:
        if i not in elig or i in holders or not state.fits(i, need):
            continue
        name = labels[i].get(label) if label else ""
        if name is None or (label and not name):
            continue
        members = found.setdefault(name, [])
        members.append(i)
        if len(members) >= need.n:
            chosen, _ = choose(state, need, members)
            if chosen:
                return chosen
    members = found.get("", [])
    if not label and len(members) >= need.n:
        return choose(state, need, members)[0]
    return []


def choose(state: State, need: Need, members: list[int]) -> tuple[list[int], str]:
    """Pick ``need.n`` nodes from members, counting their power together.

    Returns the nodes, or [] and the power cap that stopped it.
    """
    order = sorted(
        members, key=lambda i: (need.src not in state.holds[i], state.fit_key(i, need), i)
    )
    extra: dict[int, float] = {}
    chosen: list[int] = []
    blocked = ""
    for i in order:
        w = state.watts(i, need)
        over = [
            d
            for d in state.node_domains[i]
            if state.used[d] + extra.get(d, 0.0) + w > state.cap[d] + EPSILON
        ]
        if over:
            d = over[0]
            blocked = blocked or state.power_text(d, state.used[d] + extra.get(d, 0.0), w)
            continue
        chosen.append(i)
        for d in state.node_domains[i]:
            extra[d] = extra.get(d, 0.0) + w
        if len(chosen) == need.n:
            return chosen, ""
    return [], blocked
