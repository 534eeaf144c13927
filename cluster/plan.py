"""How many replicas each model should have now, and what to start and stop: plain data.

The reconciler (cluster.reconciler) calls these each tick; they know nothing of Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


def wanted(
    m: Model,
    now: datetime,
    last_demand: datetime | None = None,
    idle_default_ns: int = 15 * 60 * SECOND,
) -> Want:
    """Return how many replicas a (normalized) model should have at ``now``.

    ``now`` is aware, in the control time zone. Outside every schedule window the model's
    own min applies; inside one, the window's. An on-demand model (min 0, max above it)
    has one replica while it was asked for within its idle timeout (the model's, or the
    cluster default), else none. External models have none: they are served elsewhere.
    """
    if rules.is_external(m):
        return Want(0, "external: served elsewhere")
    lo, hi = m.scaling.min, m.scaling.max
    window = rules.window_at(m.scaling, now)
    where = "scaling"
    if window is not None:
        lo = window.min
        hi = max(window.max or m.scaling.max, lo)
        days = ",".join(window.days) or "every day"
        where = f"window {days} {window.from_}-{window.to}"
    if lo == 0 and hi > 0:
        idle = m.scaling.idle_timeout or idle_default_ns
        if last_demand is not None:
            idle_s = (now - last_demand).total_seconds()
            if idle_s * SECOND < idle:
                return Want(1, f"on demand: asked for {int(idle_s)} s ago")
            return Want(0, f"on demand: idle for {int(idle_s)} s")
        return Want(0, "on demand: not asked for")
    if hi == 0 and lo == 0:
        return Want(0, f"switched off ({where}: min 0, max 0)")
    return Want(lo, f"{where}: min {lo}")


@dataclass(frozen=True)
class ReplicaView:
    """What the plan needs to know of an existing replica."""

    id: int
    model: str
    desired: bool
    state: str
    placed: bool
    replaces: int | None = None
    created: float = 0.0


@dataclass
class Changes:
    """What a tick should do: replicas to create per model, and replicas to stop."""

    create: dict[str, int] = field(default_factory=dict)
    stop: list[tuple[int, str]] = field(default_factory=list)


# Which replicas go first when a model has too many: those doing least good.
_STOP_ORDER = {"pending": 0, "failed": 1, "starting": 2, "loading": 3, "ready": 4}


def scale(wants: dict[str, Want], replicas: Iterable[ReplicaView]) -> Changes:
    """Return the replicas to create and stop so each model has what it wants.

    Replicas of models no longer in the catalog are stopped. A replica started by a
    rolling update (``replaces`` set) does not count until it is ready, so a roll never
    makes the model look over-full.
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
        have = [r for r in by_model.get(name, []) if r.replaces is None or r.state == "ready"]
        if len(have) < want.count:
            out.create[name] = want.count - len(have)
        elif len(have) > want.count:
            extra = sorted(have, key=lambda r: (_STOP_ORDER.get(r.state, 5), -r.created, -r.id))
            for r in extra[: len(have) - want.count]:
                out.stop.append((r.id, f"scaled down: {want.why}"))
    return out


def lost_nodes(
    heartbeats: Sequence[tuple[str, datetime | None]],
    now: datetime,
    lost_after_s: float,
    listening_since: datetime | None = None,
) -> list[str]:
    """Return the nodes not heard from for longer than ``lost_after_s``.

    ``listening_since`` is when the control plane started hearing heartbeats: silence from
    before then is the control plane's own (it was down or restarting), not the nodes',
    so a node is lost only after ``lost_after_s`` of silence it could have heard.
    """
    lost = []
    for name, last in heartbeats:
        heard = last
        if listening_since is not None and (heard is None or heard < listening_since):
            heard = listening_since
        if heard is None or (now - heard).total_seconds() > lost_after_s:
            lost.append(name)
    return lost
