"""Which silent nodes are lost, and which are only held: plain data (no Django).

The reconciler calls :func:`judge` each tick. A node is *silent* when it has not been heard
from for longer than ``LLMGW_NODE_LOST_AFTER``, counted from the later of its last heartbeat
and the moment heartbeats could be heard at all (``listening_since``: the latest start of a
web process, or of the process that reconciles). Silence from before then is the control
plane's own, not the node's.

A silent node is *lost*: its replicas are placed elsewhere, and its agent, when it returns,
stops the engines it no longer has. But when most nodes fall silent together the control
plane (the web process that hears heartbeats, or its network) is the likely fault, not the
nodes: calling them all lost would stop every engine the moment they come back. As
Kubernetes' node lifecycle controller stops evicting in a disrupted zone (no ready node at
all, or more than 2 not ready and at least 55% of them, in a cluster too small for a slow
eviction rate), such nodes are *held*: shown not ready, their replicas kept where they are.

"Together" is judged over the nodes *quiet* for half of ``LLMGW_NODE_LOST_AFTER`` or more,
not only those already past it: nodes that fell silent at the same moment cross the line a
heartbeat apart, and the first of them must not be lost before the others count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

# The share of silent nodes at or above which (with more than PARTIAL_MIN of them) the
# silence is taken for the control plane's: Kubernetes' unhealthyZoneThreshold.
MASS_SILENCE = 0.55
PARTIAL_MIN = 2
# A node not heard from for this share of LLMGW_NODE_LOST_AFTER counts as fallen silent
# when judging whether most nodes did at once.
QUIET_SHARE = 0.5


@dataclass(frozen=True)
class Silence:
    """What to do with the silent nodes: ``lost`` are lost; ``held`` are kept, for ``why``."""

    lost: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    why: str = ""


def judge(
    heartbeats: Sequence[tuple[str, datetime | None]],
    now: datetime,
    lost_after_s: float,
    listening_since: datetime | None = None,
    threshold: float = MASS_SILENCE,
) -> Silence:
    """Return which of the nodes (name, last heartbeat) are lost and which are held.

    ``heartbeats`` are the nodes not already lost. A node never heard from counts from
    ``listening_since`` (or is silent, without it).
    """
    silent, quiet = [], 0
    for name, last in heartbeats:
        heard = last
        if listening_since is not None and (heard is None or heard < listening_since):
            heard = listening_since
        for_s = float("inf") if heard is None else (now - heard).total_seconds()
        if for_s > lost_after_s:
            silent.append(name)
        if for_s > lost_after_s * QUIET_SHARE:
            quiet += 1
    if not silent:
        return Silence()
    total = len(heartbeats)
    if quiet == total:
        what = "every node" if total > 1 else "the only node"
    elif quiet > PARTIAL_MIN and quiet / total >= threshold:
        what = f"{quiet} of {total} nodes"
    else:
        return Silence(lost=tuple(silent))
    why = (
        f"not heard from for more than {lost_after_s:g} s, with {what} silent at once: the control "
        "plane or its network is the likely fault, so its replicas stay where they are"
    )
    return Silence(held=tuple(silent), why=why)
