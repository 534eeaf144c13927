"""A judge whose breaker is open, asked again off the path until it answers: its first
answer closes the breaker at once.

While a breaker is open (``guard.breaker``) every check skips its judge, so under
``fail: closed`` every request is refused, and the back-off (5 s at first, doubled after
each failed probe, up to 5 minutes) kept refusing for that long after the judge was back.
So each process also asks an open judge itself, in a thread of its own, every
``LLMGW_GUARD_BREAKER_PROBE_EVERY`` seconds (one ordinary text, the judge's own timeout):
no client request waits on it, and its first answer closes the breaker. A probe that
fails changes nothing (the back-off and the probes of the checks go on as the breaker
says); the thread ends once the breaker is closed, by it or by a check.

``Reprober`` is the loop, given the breakers, how to ask a judge (``ask``: returns when it
answered, raises when not) and how often; ``guard.services`` makes the process's one and
has it hear every breaker's changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from guard import breaker

log = logging.getLogger(__name__)


class Reprober:
    def __init__(
        self,
        breakers: breaker.Breakers,
        ask: Callable[[str], None],
        every: Callable[[], float],
    ) -> None:
        self.breakers = breakers
        self.ask = ask
        self.every = every
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._stop = threading.Event()

    def changed(self, judge: str, state: breaker.State) -> None:
        """A breaker's change (``Breakers.listen``): one that opened is probed off the path."""
        if state.state != breaker.OPEN or self.every() <= 0:
            return
        with self._lock:
            if judge in self._running:
                return
            self._running.add(judge)
        threading.Thread(target=self._probe, args=(judge,), name=f"reprobe-{judge}",
                         daemon=True).start()  # fmt: skip

    def running(self) -> set[str]:
        with self._lock:
            return set(self._running)

    def _probe(self, judge: str) -> None:
        try:
            while not self._stop.wait(self.every()):
                if self.breakers.state(judge).state == breaker.CLOSED:
                    return
                try:
                    self.ask(judge)
                except Exception as error:  # noqa: BLE001 - still down: asked again later
                    log.debug("judge %s still gives no answer: %s", judge, error)
                    continue
                if self.breakers.state(judge).state != breaker.CLOSED:
                    self.breakers.succeeded(judge)
                    log.info("judge %s answers again: its circuit breaker is closed", judge)
                return
        finally:
            with self._lock:
                self._running.discard(judge)
