"""Session affinity: a request that names a session goes where its session went last.

A session (``gateway.path.dialects.sessions``: the ``x-session-id`` header, OpenAI's
``prompt_cache_key``, ``previous_response_id``, Anthropic's ``metadata.user_id``) resends
its whole conversation each turn; the replica that served its last turn holds that
conversation in its prefix cache. ``choose`` picks a session's replica:

- the replica its session last used (``last``) while that replica is a candidate (ready,
  not ejected, not tried already for this request) and one more request keeps it within
  ``skew`` times its weighted share of the model's requests in flight, or within
  ``FLOOR`` requests per unit of weight (``balance.within_bound``): an engine batches
  that many at once, so a momentary skew among a few requests moves no session off the
  replica that holds its conversation's cache. That is ``KEPT``.
- else the replica the model's balancer picks (``balance.pick``: prefix affinity with
  bounded loads, or ``least``) over the session's own key, among the replicas that hold
  no more than ``SPREAD`` times their weighted share of the model's sessions (those
  holding the fewest for their weight when none does), and never the replica left behind when another is there: ``MOVED``
  (the session had a replica) or ``NEW``. The session moves with it.

Why the session's key and not the conversation's leading text: every session of an
agent starts with the same long system prompt, so the leading text is one key for them
all, and prefix hashing would send every new session to one replica (the bounded loads
then fill the replicas one after another). The session's key spreads them by weight, and
every gateway process hashes it alike, so a session's first replica is the same whichever
process its turns reach, with nothing shared. The spread bound on sessions held keeps
the replicas within a few sessions of each other however the hashes fall.

``Sessions`` is the table a gateway process keeps, in memory, per model: each session's
last replica and when it was used, at most ``size`` sessions (the least recently used
leave first) for at most ``age`` seconds since their last turn, and how many each
replica holds. Plain Python: the clock is passed in. Its lock is held a few steps per
turn, and once a second by the thread that publishes the process's traffic
(``figures``: the Traffic page's sessions and share kept, ``gateway.records.traffic``).
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.path import balance
from gateway.path.balance import Ring, Target

if TYPE_CHECKING:
    from gateway.path.table import Key

KEPT = "kept"
MOVED = "moved"
NEW = "new"

# The skew a session's replica may reach before its sessions move (its requests in flight
# over its weighted share of the model's): LLMGW_SESSION_SKEW's default.
DEFAULT_SKEW = 2.0
# Requests in flight per unit of weight a session's replica may always hold.
FLOOR = 8
# A new (or moving) session goes to a replica holding at most this factor of its weighted
# share of the model's sessions.
SPREAD = 1.1
DEFAULT_SIZE = 100_000
DEFAULT_AGE = 1800.0


def affinity_key(key: Key, session: str) -> str:
    """A session's key in the table: scoped to the key's owner (a key with none: itself),
    so two tenants' sessions never meet."""
    return f"{key.owner or 'key:' + key.name}\x00{session}"


def choose(
    ring: Ring,
    in_flight: Mapping[int, int],
    held: Mapping[int, int],
    last: int | None,
    key: str,
    *,
    skew: float = DEFAULT_SKEW,
    floor: float = FLOOR,
    profile: str = balance.DEFAULT_PROFILE,
    exclude: Collection[int] = (),
    rng: random.Random | None = None,
) -> tuple[Target | None, str]:
    """The replica for a session's turn and whether its session kept its replica (the
    module's docstring); ``held`` is the model's sessions per replica. (None, NEW or
    MOVED) when every replica is excluded."""
    candidates = [t for t in ring.targets if t.id not in exclude]
    if not candidates:
        return None, NEW if last is None else MOVED
    least = min(t.capacity for t in candidates)
    capacity = sum(t.capacity for t in candidates)
    if last is not None:
        for target in candidates:
            if target.id == last:
                total = sum(in_flight.get(t.id, 0) for t in candidates)
                if balance.within_bound(target, in_flight, total, capacity, skew, floor, least):
                    return target, KEPT
                break
    outcome = NEW if last is None else MOVED
    sessions = sum(held.get(t.id, 0) for t in candidates)
    over = {
        t.id for t in candidates
        if not balance.within_bound(t, held, sessions, capacity, SPREAD, least=least)
    }  # fmt: skip
    # The replica left behind (over its skew, or gone) is not taken when another is there.
    behind = {last} if last is not None and len(candidates) > 1 else set()
    over |= behind
    if all(t.id in over for t in candidates):
        # None within: those holding the fewest sessions for their weight.
        rest = [t for t in candidates if t.id not in behind] or candidates
        fewest = min(held.get(t.id, 0) / t.capacity for t in rest)
        over = behind | {t.id for t in rest if held.get(t.id, 0) / t.capacity > fewest}
    skip = set(exclude) | over
    return balance.pick(ring, in_flight, key, profile=profile, exclude=skip, rng=rng), outcome


@dataclass
class Counts:
    """A model's session turns in one process: how many kept their replica, how many
    moved, how many began."""

    kept: int = 0
    moved: int = 0
    new: int = 0


class Sessions:
    """A gateway process's session table (the module's docstring)."""

    def __init__(
        self, size: int = DEFAULT_SIZE, age: float = DEFAULT_AGE, skew: float = DEFAULT_SKEW
    ) -> None:
        self.size, self.age, self.skew = size, age, skew
        # (model, the session key's 64-bit hash) -> (replica, last used), least recently
        # used first: a session costs the same whatever its key's length (up to 512).
        self._table: OrderedDict[tuple[str, int], tuple[int, float]] = OrderedDict()
        # model -> replica -> sessions it holds.
        self._held: dict[str, dict[int, int]] = {}
        self.counts: dict[str, Counts] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any) -> Sessions:
        """The settings' (``django.conf.settings`` or anything with those names)."""
        return cls(
            size=int(settings.LLMGW_SESSION_MAX),
            age=float(settings.LLMGW_SESSION_AGE),
            skew=float(settings.LLMGW_SESSION_SKEW),
        )

    def __len__(self) -> int:
        return len(self._table)

    def expire(self, now: float) -> None:
        """Forget the sessions idle longer than ``age`` (the oldest are first)."""
        with self._lock:
            self._expire(now)

    def _expire(self, now: float) -> None:
        table = self._table
        while table:
            name, (_, used) = next(iter(table.items()))
            if now - used <= self.age:
                return
            self._drop(name)

    def _drop(self, name: tuple[str, int]) -> None:
        replica, _ = self._table.pop(name)
        held = self._held[name[0]]
        held[replica] -= 1
        if not held[replica]:
            del held[replica]
            if not held:
                del self._held[name[0]]

    def last(self, model: str, session: str, now: float) -> int | None:
        """The replica ``session`` of ``model`` last used (None: none within ``age``)."""
        with self._lock:
            return self._last(model, session, now)

    def _last(self, model: str, session: str, now: float) -> int | None:
        self._expire(now)
        found = self._table.get((model, balance.hash64(session)))
        return None if found is None else found[0]

    def held(self, model: str) -> Mapping[int, int]:
        """How many sessions of ``model`` each replica holds."""
        return self._held.get(model, {})

    def used(self, model: str, session: str, replica: int, now: float) -> None:
        """``session`` of ``model`` went to ``replica`` now (it is the most recent)."""
        with self._lock:
            self._used(model, session, replica, now)

    def _used(self, model: str, session: str, replica: int, now: float) -> None:
        name = (model, balance.hash64(session))
        if name in self._table:
            self._drop(name)
        self._table[name] = (replica, now)
        held = self._held.setdefault(model, {})
        held[replica] = held.get(replica, 0) + 1
        while len(self._table) > self.size:
            self._drop(next(iter(self._table)))

    def pick(
        self,
        model: str,
        session: str,
        ring: Ring,
        in_flight: Mapping[int, int],
        now: float,
        *,
        profile: str = balance.DEFAULT_PROFILE,
        exclude: Collection[int] = (),
    ) -> Target | None:
        """The replica for a turn of ``session`` (``choose``), remembered and counted."""
        with self._lock:
            last = self._last(model, session, now)
            held = dict(self.held(model))
            if last is not None and held.get(last):
                held[last] -= 1  # the session itself is not counted where it may leave from
            target, outcome = choose(ring, in_flight, held, last, f"{model}\x00{session}",
                                     skew=self.skew, profile=profile, exclude=exclude)  # fmt: skip
            if target is None:
                return None
            counts = self.counts.setdefault(model, Counts())
            setattr(counts, outcome, getattr(counts, outcome) + 1)
            self._used(model, session, target.id, now)
            return target

    def began(self, model: str, session: str, replica: int, now: float) -> None:
        """A session begun by a turn routed without it (a stored response's id)."""
        with self._lock:
            counts = self.counts.setdefault(model, Counts())
            counts.new += 1
            self._used(model, session, replica, now)

    def figures(self, now: float) -> dict[str, dict[str, int]]:
        """Per model: its sessions held now, and its turns kept, moved and new so far."""
        with self._lock:
            self._expire(now)
            out: dict[str, dict[str, int]] = {}
            for model in set(self._held) | set(self.counts):
                c = self.counts.get(model, Counts())
                out[model] = {"sessions": sum(self._held.get(model, {}).values()),
                              "kept": c.kept, "moved": c.moved, "new": c.new}  # fmt: skip
            return out
