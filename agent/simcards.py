"""What a simulated node's cards use (``--simulate``): figures derived from the replicas
on them, since there is no card to ask. No Django here.

A real node's agent reads each card's memory used and utilisation from nvidia-smi
(``agent.discovery.discover_use``); a simulated node's agent reports these instead, with
every heartbeat, so the node page shows a simulated cluster as it would a real one:

- memory used: a ready replica holds 90% of each of its cards (vLLM's default
  ``--gpu-memory-utilization``); while it loads, that share times its progress; while it
  starts, 5%; a card no replica holds, none.
- utilisation: a ready replica's load, its sim engine's busy slots of all its slots
  (``/health`` says both); while it loads, 30%; else none.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

HELD_SHARE = 0.9  # of a card's memory, by a ready replica
STARTING_SHARE = 0.05
LOADING_UTILIZATION = 30
# How long a heartbeat waits for one engine's /health (a local call).
LOAD_TIMEOUT_S = 0.3


def card_figures(
    cards: Sequence[Mapping[str, Any]], replicas: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Return each card's simulated memory used (MiB) and utilisation (percent).

    ``replicas`` are those this node runs: ``cards`` (indexes), ``state``, ``progress``
    (0 to 1 or None) and ``load`` (busy slots over all, 0 to 1, or None when unknown).
    """
    holder: dict[int, Mapping[str, Any]] = {}
    for r in replicas:
        for index in r.get("cards") or ():
            holder[int(index)] = r
    out = []
    for c in cards:
        index = int(c["index"])
        total = int(c.get("memory_mb") or 0)
        r = holder.get(index)
        share, busy = 0.0, 0
        if r is not None:
            state = r.get("state")
            if state == "ready":
                share = HELD_SHARE
                busy = round(100 * min(1.0, max(0.0, float(r.get("load") or 0.0))))
            elif state == "loading":
                progress = min(1.0, max(0.0, float(r.get("progress") or 0.0)))
                share = HELD_SHARE * progress
                busy = LOADING_UTILIZATION
            elif state == "starting":
                share = STARTING_SHARE
        out.append({"index": index, "memory_used_mb": round(total * share), "utilization": busy})
    return out


def engine_load(port: int | None, host: str = "127.0.0.1") -> float | None:
    """Return a sim engine's busy slots over all from its ``/health``; None if it does not
    say (not up, loading, or not a sim engine)."""
    if not port:
        return None
    try:
        with urllib.request.urlopen(  # noqa: S310 (a local http URL this agent built)
            f"http://{host}:{port}/health", timeout=LOAD_TIMEOUT_S
        ) as answer:
            body = json.loads(answer.read(4096) or b"{}")
    except (OSError, ValueError, urllib.error.URLError):
        return None
    busy, total = body.get("slots_busy"), body.get("slots_total")
    if not isinstance(busy, int) or not isinstance(total, int) or total <= 0:
        return None
    return busy / total
