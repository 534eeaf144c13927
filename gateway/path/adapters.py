"""Which replica serves a LoRA adapter, when replicas hold only a few at once: plain Python.

A model with ``max_loaded_adapters`` above 0 runs on vLLM replicas that load an adapter
the first time a request names it (the agent starts them with vLLM's resolver) and hold at
most that many. ``Placer`` keeps, per replica, the adapters this process sent there, most
recently used last. A request naming an adapter goes to a replica that holds it while that
replica has room: within 1.5 times its share of what is in flight, or two requests at least
(loading an adapter elsewhere costs seconds, so affinity is held longer than a prefix's;
``balance.within_bound``), else
to the least busy replica, which then holds it; past ``max_loaded`` the least recently
used adapter there is unloaded (``choose`` returns it, for the lead to ask the engine's
``/v1/unload_lora_adapter`` off the request path).

Each gateway process keeps its own view; an engine that evicted on its own simply loads
again when asked (the request still succeeds, later).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

from gateway.path import balance
from gateway.path.balance import Target

ROOM_FACTOR = 1.5
ROOM_FLOOR = 2.0


class Placer:
    def __init__(self) -> None:
        self.held: dict[int, OrderedDict[str, None]] = {}

    def holds(self, replica: int) -> list[str]:
        return list(self.held.get(replica, ()))

    def choose(
        self,
        targets: Sequence[Target],
        in_flight: Mapping[int, int],
        adapter: str,
        max_loaded: int,
        exclude: Collection[int] = (),
    ) -> tuple[Target | None, str | None]:
        """The replica for a request naming ``adapter``, and an adapter to unload there."""
        candidates = [t for t in targets if t.id not in exclude]
        if not candidates:
            return None, None
        total = sum(in_flight.get(t.id, 0) for t in candidates)
        capacity = sum(t.capacity for t in candidates)
        holding = [t for t in candidates if adapter in self.held.get(t.id, ())]
        roomy = [
            t
            for t in holding
            if balance.within_bound(t, in_flight, total, capacity, ROOM_FACTOR, ROOM_FLOOR)
        ]
        if roomy:
            target = balance.least_busy(roomy, in_flight)
            assert target is not None
            self.held[target.id].move_to_end(adapter)
            return target, None
        target = balance.least_busy(candidates, in_flight)
        assert target is not None
        held = self.held.setdefault(target.id, OrderedDict())
        evicted = None
        if adapter in held:
            held.move_to_end(adapter)
        else:
            held[adapter] = None
            if max_loaded > 0 and len(held) > max_loaded:
                evicted, _ = held.popitem(last=False)
        return target, evicted

    def forget(self, keep: Collection[int]) -> None:
        """Drop what replicas no longer routed to held."""
        for replica in [r for r in self.held if r not in keep]:
            del self.held[replica]
