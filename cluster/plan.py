"""How many replicas each model should have now, and what to start and stop: plain data.

The reconciler (cluster.reconciler) calls these each tick; they know nothing of Django.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from catalog import rules
from catalog.durations import SECOND
from catalog.spec import Model


@dataclass(frozen=True)
class Want:
    """A model's wanted replica count, and why, in words for the console."""

    count: int
    why: str


@dataclass(frozen=True)
class Bounds:
    """The replica counts a model may have now: load scaling (``cluster.scaling``) picks
    between ``lo`` and ``hi``. ``fixed`` is set where there is nothing to pick: the count,
    and why (external, switched off, an on-demand model not asked for, min equal to max).
    """

    lo: int
    hi: int
    where: str
    fixed: Want | None = None


def bounds(
    m: Model,
    now: datetime,
    last_demand: datetime | None = None,
    idle_default_ns: int = 15 * 60 * SECOND,
) -> Bounds:
    """Return the min and max in force for a (normalized) model at ``now``.

    ``now`` is aware, in the control time zone. Outside every schedule window the model's
    own min and max apply; inside one, the window's (its max, when set, else the
    model's). An on-demand model (min 0, max above it) has 1 to max while it was asked
    for within its idle timeout (the model's, or the cluster default), else none.
    External models have none: they are served elsewhere.
    """
    if rules.is_external(m):
        return Bounds(0, 0, "external", Want(0, "external: served elsewhere"))
    lo, hi = m.scaling.min, m.scaling.max
    window = rules.window_at(m.scaling, now)
    where = "scaling"
    if window is not None:
        lo = window.min
        hi = max(window.max or m.scaling.max, lo)
        days = ",".join(window.days) or "every day"
        where = f"window {days} {window.from_}-{window.to}"
    hi = max(hi, lo)
    if lo == 0 and hi > 0:
        idle = m.scaling.idle_timeout or idle_default_ns
        if last_demand is not None:
            idle_s = (now - last_demand).total_seconds()
            if idle_s * SECOND < idle:
                why = f"on demand: asked for {int(idle_s)} s ago"
                return Bounds(1, hi, why, Want(1, why) if hi == 1 else None)
            return Bounds(0, 0, where, Want(0, f"on demand: idle for {int(idle_s)} s"))
        return Bounds(0, 0, where, Want(0, "on demand: not asked for"))
    if hi == 0 and lo == 0:
        return Bounds(0, 0, where, Want(0, f"switched off ({where}: min 0, max 0)"))
    if hi == lo:
        return Bounds(lo, hi, where, Want(lo, f"{where}: min {lo}"))
    return Bounds(lo, hi, where)


def wanted(
    m: Model,
    now: datetime,
    last_demand: datetime | None = None,
    idle_default_ns: int = 15 * 60 * SECOND,
) -> Want:
    """Return how many replicas a (normalized) model should have at ``now``, load aside:
    the count ``bounds`` fixes, else the min in force (an on-demand model asked for: 1).
    """
    b = bounds(m, now, last_demand, idle_default_ns)
    if b.fixed is not None:
        return b.fixed
    if b.lo == 1 and b.where.startswith("on demand"):
        return Want(1, b.where)
    return Want(b.lo, f"{b.where}: min {b.lo}")


@dataclass(frozen=True)
class ReplicaView:
    """What the plan needs to know of an existing replica.

    ``replaces`` is the replica a rolling update (or a drain) started this one to replace;
    ``outdated`` that it runs an old definition of its profile.
    """

    id: int
    model: str
    desired: bool
    state: str
    placed: bool
    replaces: int | None = None
    created: float = 0.0
    outdated: bool = False


@dataclass
class Changes:
    """What a tick should do: replicas to create per model, and replicas to stop."""

    create: dict[str, int] = field(default_factory=dict)
    stop: list[tuple[int, str]] = field(default_factory=list)


# Which replicas go first when a model has too many: those doing least good.
_STOP_ORDER = {"pending": 0, "failed": 1, "starting": 2, "loading": 3, "ready": 4}


def slots(replicas: Iterable[ReplicaView]) -> list[list[ReplicaView]]:
    """Group one model's desired replicas into the places they fill, oldest first.

    A replica and the replacements started for it (a roll, a drain) fill one place: the
    model is never over its count because a replacement runs beside what it replaces. A
    replacement whose replica is already stopped or gone fills the place on its own.
    """
    reps = [r for r in replicas if r.desired]
    by_id = {r.id: r for r in reps}

    def root(r: ReplicaView) -> int:
        seen = {r.id}
        while r.replaces is not None and r.replaces in by_id and r.replaces not in seen:
            r = by_id[r.replaces]
            seen.add(r.id)
        return r.id

    groups: dict[int, list[ReplicaView]] = {}
    for r in sorted(reps, key=lambda r: (r.created, r.id)):
        groups.setdefault(root(r), []).append(r)
    return list(groups.values())


def _drop_order(slot: list[ReplicaView]) -> tuple[object, ...]:
    """Sort key of a place to give up when scaling down: least good first.

    A place with no ready replica goes first (stopping it loses nothing that serves),
    then one being replaced (a roll or drain that would only be undone), then one of an
    old definition, then by the best state it has, the newest first.
    """
    ready = any(r.state == "ready" for r in slot)
    best = max(_STOP_ORDER.get(r.state, 5) for r in slot)
    return (
        ready,
        len(slot) == 1,
        not any(r.outdated for r in slot),
        best,
        -max(r.created for r in slot),
        -max(r.id for r in slot),
    )


def scale(wants: dict[str, Want], replicas: Iterable[ReplicaView]) -> Changes:
    """Return the replicas to create and stop so each model has what it wants.

    Replicas of models no longer in the catalog are stopped. Counting is by place
    (:func:`slots`): a replacement beside the replica it replaces counts once, so a roll
    never makes the model look over-full, and a roll's replacement is never the one
    stopped for it. Scaling down gives up whole places, those doing least good first.
    """
    out = Changes()
    by_model: dict[str, list[ReplicaView]] = {}
    for r in replicas:
        if not r.desired:
            continue
        if r.model not in wants:
            out.stop.append((r.id, f"model {r.model} is no longer in the catalog"))
            continue
        by_model.setdefault(r.model, []).append(r)
    for name, want in wants.items():
        have = slots(by_model.get(name, []))
        if len(have) < want.count:
            out.create[name] = want.count - len(have)
        elif len(have) > want.count:
            for slot in sorted(have, key=_drop_order)[: len(have) - want.count]:
                out.stop.extend((r.id, f"scaled down: {want.why}") for r in slot)
    return out


def finish_rolls(replicas: Iterable[ReplicaView]) -> list[tuple[int, int]]:
    """Return (old, new) for each ready replacement whose old replica still runs: it stops."""
    reps = list(replicas)
    desired = {r.id for r in reps if r.desired}
    return [
        (r.replaces, r.id)
        for r in reps
        if r.desired and r.state == "ready" and r.replaces is not None and r.replaces in desired
    ]


# The words a replacement waiting for room says; the console finds rolls that go one at a
# time by them (cluster.live).
ONE_AT_A_TIME = "no room beside"


def make_room(
    wants: dict[str, Want],
    replicas: Iterable[ReplicaView],
    blocked: Iterable[int],
) -> tuple[list[tuple[int, str]], dict[int, str]]:
    """Decide which replaced replicas stop first to make room for their replacements.

    ``blocked`` are replacements placement could not put beside the replica they
    replace, but could put in its room. Per model, one at a time: a replica stops first
    only while no other replica of the model is on its way up (placed or waiting, not
    ready and not failed), and only if the model keeps a ready replica, unless its count
    is under 2 (replacing a lone replica without room needs the gap, which it says).
    Return the replicas to stop with the reason, and each blocked replacement's reason.
    """
    reps = [r for r in replicas if r.desired]
    by_id = {r.id: r for r in reps}
    waiting = sorted(b for b in set(blocked) if b in by_id and by_id[b].replaces in by_id)
    olds = {by_id[b].replaces for b in waiting}
    stops: list[tuple[int, str]] = []
    reasons: dict[int, str] = {}
    stopping: set[int] = set()
    started: dict[str, list[int]] = {}
    for bid in waiting:
        new = by_id[bid]
        old_id = new.replaces
        assert old_id is not None
        model = [r for r in reps if r.model == new.model]
        rising = [
            r.id
            for r in model
            if r.state not in ("ready", "failed") and r.id not in waiting and r.id not in olds
        ] + started.get(new.model, [])
        ready = [r for r in model if r.state == "ready" and r.id not in stopping]
        want = wants[new.model].count if new.model in wants else 0
        old_ready = by_id[old_id].state == "ready"
        head = f"{ONE_AT_A_TIME} #{old_id} for #{bid}: replacing one replica at a time"
        if rising:
            reasons[bid] = f"{head}; waiting for #{min(rising)} to be ready"
        elif old_ready and len(ready) <= 1 and want >= 2:
            reasons[bid] = f"{head}; waiting for another replica to be ready"
        else:
            gap = old_ready and len(ready) <= 1
            tail = " (the model has no ready replica until it is ready)" if gap else ""
            reasons[bid] = f"{head}; #{old_id} stops first{tail}"
            stops.append((old_id, f"stopping first to make room for #{bid} (rolling update)"))
            stopping.add(old_id)
            started.setdefault(new.model, []).append(bid)
    return stops, reasons
