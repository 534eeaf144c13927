"""Which replica a request goes to: plain Python, no Django, no I/O.

Two strategies, named by a model's ``routing_profile`` (``ROUTING_PROFILES``):

- ``prefix`` (the default, also ``""``): rendezvous hashing with bounded loads over the
  request's affinity key (the conversation's leading text). Each replica scores the key
  (``weight / -ln(u)``, ``u`` a hash of the key and the replica in (0, 1)) and the highest
  score names it: over many keys each replica's share is its weight's share of the total,
  whatever the replicas' ids (a ring of virtual nodes is only near it: 160 per unit of
  weight gave 2.5:1 to 3.5:1 for 3:1). It is taken if its requests in flight stay within
  ``LOAD_FACTOR`` of its weighted share of everything in flight, and always up to its
  weight's floor (``FLOOR`` per unit of the smallest weight, ``within_bound``), else the
  next score's replica is tried. So a conversation's next turn lands where its KV cache is, a replica that leaves moves only
  its own conversations, and no replica takes much more than its share. A request with no
  key (an embedding of nothing, say) goes to the least busy replica.
- ``least``: fewest requests in flight per unit of weight, ties broken at random so
  several gateway processes (each counting only its own requests) do not herd.

``weight`` is the profile's capacity weight; 0 means 1. Replicas in ``exclude`` (tried
already for this request) are never chosen again.

``Ring`` (the replicas' seeds and weights) is built once per set of replicas (the state
keeps it until the set changes); ``pick`` costs one hash of the key and a few arithmetic
steps per replica.

Each gateway process counts only its own requests in flight. So the bound's floor is in
proportion to weight (a replica of weight 3 beside one of weight 1 may always hold 6 to
its 2): at a few requests per process the bound does not move traffic off the weights, and
under load each process's own counts are a sample of the whole in the same proportions.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

PREFIX = "prefix"
LEAST = "least"
ROUTING_PROFILES = (PREFIX, LEAST)
DEFAULT_PROFILE = PREFIX

# A replica may take up to this factor of its weighted share of the requests in flight.
LOAD_FACTOR = 1.25
# ... and always this many per unit of the smallest weight: with one, a process with two to
# four requests in flight passed a weight-2 replica over beside a weight-6 one whenever a
# second conversation hashed to it (21 % of the answers for its 25 %, 18 % when it answered
# slower; two: 24 %).
FLOOR = 2.0
_MASK = (1 << 64) - 1


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


_UNIT = 1.0 / 18446744073709551616.0  # 2**-64


class Ring:
    """The targets a key is hashed over: each one's seed (from its id) and weight."""

    __slots__ = ("_pairs", "targets")

    def __init__(self, targets: Sequence[Target]) -> None:
        self.targets = tuple(targets)
        # (seed, 1 / weight) per target, in the targets' order.
        self._pairs = tuple((hash64(f"replica {t.id}"), 1.0 / t.capacity) for t in self.targets)

    def scores(self, key_hash: int) -> list[float]:
        """Each target's score for the key, ``ln(u) / weight`` (the highest is its replica:
        the same order as ``weight / -ln(u)``), ``u`` in (0, 1) from the key and the seed."""
        log, out = math.log, []
        for seed, inverse in self._pairs:
            x = key_hash ^ seed
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK  # SplitMix64's finalizer
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
            out.append(log(((x ^ (x >> 31)) + 0.5) * _UNIT) * inverse)
        return out

    def walk(self, key_hash: int) -> Iterator[Target]:
        """Each target once, best score for the key first."""
        scores = self.scores(key_hash)
        for index in sorted(range(len(scores)), key=scores.__getitem__, reverse=True):
            yield self.targets[index]


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
    least: float = 0.0,
) -> bool:
    """Whether one more request keeps ``target`` within its bounded share.

    Its share is ``factor`` times its weight's share of what is in flight (one more
    counted), and never less than ``floor`` requests per ``least`` of weight (the smallest
    weight among the candidates; 0: ``floor`` for every target).
    """
    share = (total + 1) * target.capacity / total_capacity
    low = floor * target.capacity / least if least > 0 else floor
    return in_flight.get(target.id, 0) + 1 <= max(low, factor * share)


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
    candidates = [t for t in targets if t.id not in exclude] if exclude else targets
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    total = sum(in_flight.get(t.id, 0) for t in candidates)
    total_capacity = sum(t.capacity for t in candidates)
    least = min(t.capacity for t in candidates)
    scores = ring.scores(hash64(key))
    best = targets[max(range(len(scores)), key=scores.__getitem__)]
    if best.id not in exclude and within_bound(
        best, in_flight, total, total_capacity, floor=FLOOR, least=least
    ):
        return best  # the usual case: no sort
    for index in sorted(range(len(scores)), key=scores.__getitem__, reverse=True):
        target = targets[index]
        if target.id in exclude:
            continue
        if within_bound(target, in_flight, total, total_capacity, floor=FLOOR, least=least):
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
