"""Which replica a request goes to: plain Python, no Django, no I/O.

Two strategies, named by a model's ``routing_profile`` (``ROUTING_PROFILES``):

- ``prefix`` (the default, also ``""``): consistent hashing with bounded loads over the
  request's affinity key (the conversation's leading text), as KubeAI's ``PrefixHash``
  does. The key's point on a ring of virtual nodes (``VNODES`` per unit of weight) names
  a replica; it is taken if its requests in flight stay within ``LOAD_FACTOR`` of its
  weighted share of everything in flight, else the walk goes on round the ring. So a
  conversation's next turn lands where its KV cache is, and no replica takes much more
  than its share. A request with no key (an embedding of nothing, say) goes to the least
  busy replica.
- ``least``: fewest requests in flight per unit of weight, ties broken at random so
  several gateway processes (each counting only its own requests) do not herd.

``weight`` is the profile's capacity weight; 0 means 1. Replicas in ``exclude`` (tried
already for this request) are never chosen again.

``Ring`` is built once per set of replicas (the state keeps it until the set changes);
``pick`` costs one hash and a short walk.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

PREFIX = "prefix"
LEAST = "least"
ROUTING_PROFILES = (PREFIX, LEAST)
DEFAULT_PROFILE = PREFIX

# Virtual nodes per unit of weight on the ring (KubeAI uses 256 per endpoint).
VNODES = 160
# A replica may take up to this factor of its weighted share of the requests in flight.
LOAD_FACTOR = 1.25


@dataclass(frozen=True)
class Target:
    """One ready replica a request can go to."""

    id: int
    weight: float = 1.0

    @property
    def capacity(self) -> float:
        return self.weight if self.weight > 0 else 1.0


def hash64(text: str | bytes) -> int:
    """A stable 64-bit hash (the same in every process and every run)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Ring:
    """A consistent-hash ring over targets, virtual nodes in proportion to weight."""

    __slots__ = ("_points", "_owners", "targets")

    def __init__(self, targets: Sequence[Target]) -> None:
        self.targets = tuple(targets)
        points: list[tuple[int, int]] = []
        for index, target in enumerate(self.targets):
            count = max(1, round(VNODES * target.capacity))
            points.extend((hash64(f"{target.id}#{v}"), index) for v in range(count))
        points.sort()
        self._points = [p for p, _ in points]
        self._owners = [i for _, i in points]

    def walk(self, key_hash: int) -> Iterator[Target]:
        """Each target once, in ring order from the key's point."""
        n = len(self._points)
        if not n:
            return
        seen: set[int] = set()
        start = bisect.bisect_left(self._points, key_hash)
        for step in range(n):
            owner = self._owners[(start + step) % n]
            if owner not in seen:
                seen.add(owner)
                yield self.targets[owner]
                if len(seen) == len(self.targets):
                    return


def least_busy(
    targets: Sequence[Target],
    in_flight: Mapping[int, int],
    exclude: Collection[int] = (),
    rng: random.Random | None = None,
) -> Target | None:
    """The target with the fewest requests in flight per unit of weight."""
    best: list[Target] = []
    best_load = 0.0
    for target in targets:
        if target.id in exclude:
            continue
        load = (in_flight.get(target.id, 0) + 1) / target.capacity
        if not best or load < best_load:
            best, best_load = [target], load
        elif load == best_load:
            best.append(target)
    if not best:
        return None
    if len(best) == 1:
        return best[0]
    return (rng or random).choice(best)


def within_bound(
    target: Target,
    in_flight: Mapping[int, int],
    total: int,
    total_capacity: float,
    factor: float = LOAD_FACTOR,
    floor: float = 1.0,
) -> bool:
    """Whether one more request keeps ``target`` within its bounded share."""
    share = (total + 1) * target.capacity / total_capacity
    return in_flight.get(target.id, 0) + 1 <= max(floor, factor * share)


def pick(
    ring: Ring,
    in_flight: Mapping[int, int],
    key: str | bytes | None,
    *,
    profile: str = DEFAULT_PROFILE,
    exclude: Collection[int] = (),
    rng: random.Random | None = None,
) -> Target | None:
    """The replica for one request, or None when every one is excluded."""
    targets = ring.targets
    if profile == LEAST or not key:
        return least_busy(targets, in_flight, exclude, rng)
    candidates = [t for t in targets if t.id not in exclude]
    if not candidates:
        return None
    total = sum(in_flight.get(t.id, 0) for t in candidates)
    total_capacity = sum(t.capacity for t in candidates)
    for target in ring.walk(hash64(key)):
        if target.id in exclude:
            continue
        if within_bound(target, in_flight, total, total_capacity):
            return target
    return least_busy(candidates, in_flight, (), rng)


def in_canary(key: str | bytes | None, percent: int, rng: random.Random | None = None) -> bool:
    """Whether a request goes to the canary: sticky per conversation key."""
    if percent <= 0:
        return False
    if percent >= 100:
        return True
    if not key:
        return (rng or random).randrange(100) < percent
    raw = key.encode() if isinstance(key, str) else key
    return hash64(b"canary\x00" + raw) % 100 < percent
