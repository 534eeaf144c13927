"""Passive outlier detection: which replicas a gateway process leaves out of routing.

Plain Python over plain data and a clock (no Django, no I/O, no lock): the gateway's
request path tells it how each attempt on a replica went, and asks it which of a model's
replicas to leave out. Envoy's model (its ``consecutive_5xx``, ``base_ejection_time``,
``max_ejection_time`` and ``max_ejection_percent``):

- A replica whose last ``Rules.after`` attempts in a row failed (no connection, a broken
  connection, no answer in time, or a 5xx) is **ejected**: no request is sent to it for a
  while. Any answer under 500 resets its count (a 429 is neither: the replica is busy,
  not broken).
- The while grows with each ejection in a row: ``base`` seconds the first time, then
  ``2 × base``, ``3 × base`` ... up to ``most``. Each ``base`` seconds a replica stays in
  routing after it came back forgives one step, so a replica that fails once a day is
  ejected for ``base`` each time, one that keeps failing for longer and longer.
- It **comes back on its own** when the while ends, with its count at zero: no probe is
  sent, the next requests are the probe (``after`` more failures eject it again, for
  longer).
- **Never all of a model**: at most ``max_percent`` of its replicas are out at once (at
  least one may be, when it has two or more) and always at least one stays in. A model
  with one replica never has it ejected: with no other replica to move to, ejecting it
  would turn each request into a 502 (or a fallback) for the whole while, even after it
  recovered, where trying it costs a refused connection (under a millisecond) or the
  connect timeout; its failures still move requests to the fallbacks.

Each gateway process keeps its own view (as each Envoy does), and with Redis the processes
share their ejections (``gateway.shared``): a replica one process ejects is ``adopt``ed by
the others within a quarter second, for the same while, without failures of their own on
it. While Redis does not answer, each process ejects after its own ``after`` failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

# Replicas followed at most (those with failures, or ejected lately); past it the ones
# heard of longest ago are forgotten, so memory stays bounded as replicas come and go.
MAX_TRACKED = 10_000

_NONE: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Rules:
    after: int = 5  # consecutive failures that eject a replica; 0: never eject
    base: float = 30.0  # the first ejection's length, in seconds
    most: float = 300.0  # the longest ejection
    max_percent: int = 50  # of a model's replicas out at once (at least one, never all)

    @classmethod
    def from_settings(cls, settings: Any) -> Rules:
        return cls(
            after=settings.LLMGW_GATEWAY_EJECT_AFTER,
            base=float(settings.LLMGW_GATEWAY_EJECT_SECONDS),
            most=float(settings.LLMGW_GATEWAY_EJECT_MAX_SECONDS),
            max_percent=settings.LLMGW_GATEWAY_EJECT_MAX_PERCENT,
        )


def allowed(replicas: int, max_percent: int) -> int:
    """How many of a model's ``replicas`` may be ejected at once: ``max_percent`` of
    them rounded down but at least one, and never all (so none of one replica)."""
    if replicas <= 1:
        return 0
    return min(replicas - 1, max(1, replicas * max_percent // 100))


def ejection_seconds(level: int, rules: Rules) -> float:
    """How long the ``level``-th ejection in a row lasts (1: the first)."""
    return min(rules.most, rules.base * max(1, level))


@dataclass
class Health:
    """What is known of one replica."""

    model: str
    failures: int = 0  # in a row, since its last answer under 500 or its return
    level: int = 0  # ejections in a row (the multiplier), forgiven with time in routing
    until: float = 0.0  # ejected until this time of the clock; 0: in routing
    back: float = 0.0  # when it last came back (the forgiving counts from there)
    heard: float = 0.0  # when an attempt on it last failed


@dataclass(frozen=True)
class Ejection:
    """A replica just ejected."""

    model: str
    replica: int
    seconds: float
    until: float  # on the detector's clock
    failures: int
    level: int


class Outliers:
    """One gateway process's view of its replicas. ``clock`` is monotonic seconds."""

    def __init__(self, rules: Rules | None = None, clock: Callable[[], float] = time.monotonic):
        self.rules = rules or Rules()
        self.clock = clock
        self.replicas: dict[int, Health] = {}
        self.ejected: dict[int, Health] = {}  # the replicas out of routing now (or lately)

    # What an attempt came to.
    def succeeded(self, replica: int) -> None:
        """An answer under 500: its failures in a row end."""
        health = self.replicas.get(replica)
        if health is None or health.until:
            return
        health.failures = 0
        if not health.level:
            del self.replicas[replica]

    def failed(
        self, model: str, replica: int, pool: Collection[int], now: float | None = None
    ) -> Ejection | None:
        """A failed attempt on ``replica``, one of ``pool`` (its model's replicas now):
        the ejection it caused, if it did."""
        now = self.clock() if now is None else now
        health = self.replicas.get(replica)
        if health is None:
            if len(self.replicas) >= MAX_TRACKED:
                self._forget_some()
            health = self.replicas[replica] = Health(model)
        health.model = model
        health.heard = now
        if health.until:
            if health.until > now:
                return None  # already out (a request sent before it was ejected)
            self._back(replica, health)
        health.failures += 1
        rules = self.rules
        if not rules.after or health.failures < rules.after:
            return None
        out = sum(1 for r in pool if r != replica and self._out(r, now))
        if out >= allowed(len(pool), rules.max_percent):
            return None  # as many are out as may be: it stays, and is tried
        if health.level and health.back and rules.base > 0:
            forgiven = int((now - health.back) // rules.base)
            health.level = max(0, health.level - forgiven)
        health.level += 1
        seconds = ejection_seconds(health.level, rules)
        health.until = now + seconds
        self.ejected[replica] = health
        return Ejection(model, replica, seconds, health.until, health.failures, health.level)

    def adopt(self, model: str, replica: int, until: float, level: int,
              now: float | None = None) -> bool:  # fmt: skip
        """Another gateway process ejected ``replica`` of ``model`` until ``until`` (this
        clock's time), its ``level``-th ejection in a row: out of routing here too, as long,
        unless it is out here already. Returns whether that is news here."""
        now = self.clock() if now is None else now
        if until <= now:
            return False
        health = self.replicas.get(replica)
        if health is None:
            if len(self.replicas) >= MAX_TRACKED:
                self._forget_some()
            health = self.replicas[replica] = Health(model)
        health.model = model
        health.heard = now
        if health.until > now:
            return False  # out already (its own ejection, or one heard before)
        health.until = until
        health.level = max(health.level, level)
        health.failures = 0
        self.ejected[replica] = health
        return True

    # What routing leaves out.
    def excluded(self, pool: Collection[int], now: float | None = None) -> frozenset[int]:
        """The replicas of ``pool`` (one model's) out of routing now. Ones whose while
        has ended come back; should more be out than the pool allows now (it shrank), the
        ones coming back soonest come back at once, so one always stays in."""
        if not self.ejected:
            return _NONE
        now = self.clock() if now is None else now
        out = []
        for replica in pool:
            health = self.ejected.get(replica)
            if health is None:
                continue
            if health.until > now:
                out.append(replica)
            else:
                self._back(replica, health)
        if not out:
            return _NONE
        bound = allowed(len(pool), self.rules.max_percent)
        if len(out) > bound:
            out.sort(key=lambda r: self.ejected[r].until, reverse=True)
            out = out[:bound]
        return frozenset(out)

    def current(self, now: float | None = None) -> dict[str, dict[int, float]]:
        """Each model's replicas out of routing now, with the clock's time they come
        back at; the ones whose while has ended come back."""
        now = self.clock() if now is None else now
        shown: dict[str, dict[int, float]] = {}
        for replica, health in list(self.ejected.items()):
            if health.until > now:
                shown.setdefault(health.model, {})[replica] = health.until
            else:
                self._back(replica, health)
        return shown

    def out(self, now: float | None = None) -> dict[str, dict[int, float]]:
        """What ``current`` says, changing nothing (another thread may read it: one whose
        read meets a change gets ``RuntimeError`` and reads again later)."""
        now = self.clock() if now is None else now
        shown: dict[str, dict[int, float]] = {}
        for replica, health in list(self.ejected.items()):
            if health.until > now:
                shown.setdefault(health.model, {})[replica] = health.until
        return shown

    def _out(self, replica: int, now: float) -> bool:
        health = self.ejected.get(replica)
        return health is not None and health.until > now

    def _back(self, replica: int, health: Health) -> None:
        health.back = health.until
        health.until = 0.0
        health.failures = 0
        self.ejected.pop(replica, None)

    def _forget_some(self) -> None:
        """Forget the half of the replicas in routing heard of longest ago."""
        quiet = sorted((h.heard, r) for r, h in self.replicas.items() if not h.until)
        for _, replica in quiet[: max(1, len(quiet) // 2)]:
            del self.replicas[replica]
