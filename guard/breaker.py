"""A circuit breaker per judge: a judge that keeps failing is skipped for a while.

A judge that fails (no answer in time, the connection refused, an error status, an
answer that is no verdict) costs every check that asks it up to its timeout. After
``Config.failures`` consecutive failures its breaker opens: the chain skips it (a skipped
judge counts as failed, so the policy's ``fail`` decides when no other judge answers:
``fail: closed`` still refuses) for a back-off, ``Config.backoff`` seconds at first. When
the back-off is over, the next check asks it once more (the breaker is half-open: one
check probes it, the others still skip it until that probe ends or its lease runs out).
The probe's answer closes the breaker; its failure opens it again for twice the last
back-off, at most ``Config.max_backoff``.

The core is pure: ``admit``, ``succeeded`` and ``failed`` take a ``State`` and the time
(Unix seconds) and return the next one. ``Breakers`` keeps one state per judge for a
process, under a lock, and tells listeners of each change (the guard's recorder, which
writes it for the console; the gateway's metrics). Each process keeps its own, and the
gateway processes share each opening and closing through Redis (``gateway.shared``): a
breaker one opens is ``adopt``ed by the others within a quarter second (open until the
same time; each then probes on its own), and one closed by an answer closes in the others.
While Redis does not answer, each process counts its own failures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)

# What ``admit`` decides: ask the judge (closed), ask it as the probe (half-open), or
# skip it (open, or another check is probing it).
ASK = "ask"
PROBE = "probe"
SKIP = "skip"

# The failure kind a skipped judge is recorded with (guard.chain).
SKIPPED = "breaker_open"


class Skipped(Exception):
    """A judge not asked: its breaker is open (``guard.chain`` records the failure)."""

    kind = SKIPPED


@dataclass(frozen=True)
class Config:
    """How a breaker behaves: ``failures`` consecutive failures open it; it stays open
    ``backoff`` seconds, doubled after each failed probe up to ``max_backoff``.

    No defaults here: the settings' (``LLMGW_GUARD_BREAKER_*``) are the only ones.
    """

    failures: int
    backoff: float
    max_backoff: float
    factor: float = 2.0

    @classmethod
    def from_settings(cls, settings: Any) -> Config:
        """The settings' (``django.conf.settings`` or anything with those names)."""
        return cls(
            failures=max(1, int(settings.LLMGW_GUARD_BREAKER_FAILURES)),
            backoff=max(0.001, float(settings.LLMGW_GUARD_BREAKER_BACKOFF)),
            max_backoff=max(0.001, float(settings.LLMGW_GUARD_BREAKER_MAX_BACKOFF)),
        )


@dataclass(frozen=True)
class State:
    """One judge's breaker.

    ``failures`` counts consecutive failures; ``since`` is when it entered its state,
    ``opened_at`` when the current outage began (the first opening since it was last
    closed); ``backoff`` the current back-off; ``next_probe`` when an open breaker lets
    one check probe; ``probing_since`` when a half-open breaker's probe began (None:
    none running); ``last_kind`` the last failure's kind.
    """

    state: str = CLOSED
    failures: int = 0
    since: float | None = None
    opened_at: float | None = None
    backoff: float = 0.0
    next_probe: float | None = None
    probing_since: float | None = None
    last_kind: str = ""


def admit(s: State, now: float, lease: float) -> tuple[str, State]:
    """Return whether a check asks the judge (``ASK``, ``PROBE``) or skips it (``SKIP``),
    and the state after.

    ``lease`` is how long a probe may run before another check may probe (the judge's
    timeout and a margin: a probe whose check was dropped must not hold it for ever).
    A clock that went back (``now`` before the time a decision was made at) lets a
    probe through rather than holding the judge for as long as it went back.
    """
    if s.state == CLOSED:
        return ASK, s
    if s.state == OPEN:
        due = s.next_probe is None or now >= s.next_probe or (s.since is not None and now < s.since)
        if not due:
            return SKIP, s
        return PROBE, replace(s, state=HALF_OPEN, since=now, probing_since=now)
    started = s.probing_since
    if started is None or now >= started + lease or now < started:
        return PROBE, replace(s, probing_since=now)
    return SKIP, s


def peek(s: State, now: float, lease: float) -> str:
    """Return what ``admit`` would decide, changing nothing."""
    return admit(s, now, lease)[0]


def release(s: State) -> State:
    """Return the state after a probe that was admitted but never made (its check went
    another way): the next check may probe."""
    if s.state == HALF_OPEN:
        return replace(s, probing_since=None)
    return s


def succeeded(s: State, now: float) -> State:
    """Return the state after the judge answered: closed, its count of failures zero."""
    if s.state == CLOSED and not s.failures and not s.last_kind:
        return s
    since = s.since if s.state == CLOSED else now
    return State(CLOSED, 0, since, None, 0.0, None, None, "")


def failed(s: State, now: float, kind: str, config: Config) -> State:
    """Return the state after the judge failed (``kind`` says how).

    Closed: one more failure; the ``config.failures``-th in a row opens it for
    ``config.backoff``. Half-open (the probe failed): open again for the back-off times
    ``config.factor``, at most ``config.max_backoff``. Open (a check asked before it
    opened failed late): counted, nothing else changes.
    """
    count = s.failures + 1
    if s.state == CLOSED:
        if count < config.failures:
            return replace(s, failures=count, last_kind=kind)
        backoff = min(config.backoff, config.max_backoff)
        return State(OPEN, count, now, now, backoff, now + backoff, None, kind)
    if s.state == HALF_OPEN:
        backoff = min(max(s.backoff, config.backoff) * config.factor, config.max_backoff)
        return State(OPEN, count, now, s.opened_at or now, backoff, now + backoff, None, kind)
    return replace(s, failures=count, last_kind=kind)


Listener = Callable[[str, State], None]


class Breakers:
    """The breakers of one process, one per judge, safe to share between threads.

    ``config`` is read on each change (settings may differ between tests); ``clock``
    gives Unix seconds. Listeners hear ``(judge, state)`` after each change of state
    (closed, open, half-open), outside the lock.
    """

    def __init__(
        self,
        config: Callable[[], Config],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or time.time
        self._lock = threading.Lock()
        self._states: dict[str, State] = {}
        self._listeners: list[Listener] = []
        # The last state taken from another process per judge (``adopt``), so a listener
        # that shares the changes can tell them from this process's own.
        self._adopted: dict[str, State] = {}

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` of every change of state from now on (once per listener)."""
        if listener not in self._listeners:
            self._listeners.append(listener)

    def unlisten(self, listener: Listener) -> None:
        """Tell ``listener`` nothing more."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def admit(self, judge: str, lease: float) -> str:
        """Return ``ASK``, ``PROBE`` or ``SKIP`` for a check about to ask ``judge``."""
        with self._lock:
            before = self._states.get(judge)
            if before is None:
                return ASK
            decision, after = admit(before, self.clock(), lease)
            self._states[judge] = after
        self._told(judge, before, after)
        return decision

    def peek(self, judge: str, lease: float) -> str:
        """Return what ``admit`` would, changing nothing."""
        with self._lock:
            s = self._states.get(judge)
            return ASK if s is None else peek(s, self.clock(), lease)

    def release(self, judge: str) -> None:
        """A probe admitted but not made: the next check may probe."""
        with self._lock:
            s = self._states.get(judge)
            if s is not None:
                self._states[judge] = release(s)

    def succeeded(self, judge: str) -> None:
        """The judge answered."""
        with self._lock:
            before = self._states.get(judge)
            if before is None:
                return
            after = succeeded(before, self.clock())
            if after.state == CLOSED and after.failures == 0 and before.state == CLOSED:
                # Nothing left to remember of a judge that answers.
                del self._states[judge]
            else:
                self._states[judge] = after
        self._told(judge, before, after)

    def failed(self, judge: str, kind: str) -> None:
        """The judge failed (``kind``: ``guard.client``'s, or ``guard.chain``'s)."""
        with self._lock:
            before = self._states.get(judge) or State(since=None)
            after = failed(before, self.clock(), kind, self.config())
            self._states[judge] = after
        self._told(judge, before, after)

    def adopt(self, judge: str, state: State) -> None:
        """Another process's change of the judge's breaker (opened, or closed by an
        answer): this process's is the same from now on."""
        with self._lock:
            before = self._states.get(judge)
            if state.state == CLOSED:
                if before is None:
                    return
                self._states.pop(judge, None)
            else:
                self._states[judge] = state
            self._adopted[judge] = state
            if len(self._adopted) > 1000:
                self._adopted = {judge: state}
        self._told(judge, before, state)

    def adopted(self, judge: str, state: State) -> bool:
        """Whether ``state`` (a listener's) was taken from another process (``adopt``)."""
        with self._lock:
            return self._adopted.get(judge) is state

    def state(self, judge: str) -> State:
        """Return the judge's breaker (closed when nothing is known of it)."""
        with self._lock:
            return self._states.get(judge) or State()

    def states(self) -> dict[str, State]:
        """Return every judge's breaker this process knows."""
        with self._lock:
            return dict(self._states)

    def clear(self) -> None:
        """Forget every breaker (tests)."""
        with self._lock:
            self._states.clear()

    def _told(self, judge: str, before: State | None, after: State) -> None:
        if (before.state if before is not None else CLOSED) == after.state:
            return
        for listener in list(self._listeners):
            try:
                listener(judge, after)
            except Exception:  # a listener's bug must not fail the check
                log.exception("a breaker listener failed")
