"""A ready engine watched: its health read every few seconds, with a timeout, off the
supervisor's tick (agent.supervisor). No Django, no I/O here: what each read means.

An engine can stop answering while its process runs on (stopped by SIGSTOP, wedged in a
driver call, its HTTP thread deadlocked): it still accepts connections, so only a read
with a timeout tells. ``HUNG_AFTER`` reads in a row with no 200 (no answer within the
read's timeout, a refused connection, any other status) report the replica ``failed``
with the reason, which takes it out of routing (the gateway routes to ``ready`` replicas
only); the engine is left running, and its first 200 after that reports it ``ready``
again.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

# How often a ready engine's health is read, how long a read waits for its answer, and
# how many reads in a row without a 200 report it hung: about 6 to 8 s from its last
# answer to the report.
EVERY_S = 2.0
TIMEOUT_S = 2.0
HUNG_AFTER = 3

READY_AGAIN = "the engine answers /health again"


@dataclass
class Watch:
    """One ready engine's watch: the engine (by its pid) and its reads so far."""

    pid: int
    due: float  # monotonic: when the next read is sent
    misses: int = 0  # reads in a row without a 200
    first_miss: float = 0.0  # wall clock: when the first of them was sent
    hung: bool = False  # reported failed for it
    reading: Future[int | None] | None = None
    sent: float = 0.0  # wall clock: when the read in flight was sent


def answered(w: Watch, answer: int | None, *, timeout_s: float = TIMEOUT_S,
             after: int = HUNG_AFTER) -> tuple[str, str] | None:  # fmt: skip
    """Take a read's ``answer`` (its status, None for none in time): the state and reason
    to report when it changes what the replica is, else None."""
    if answer == 200:
        w.misses = 0
        if w.hung:
            w.hung = False
            return "ready", READY_AGAIN
        return None
    if not w.misses:
        w.first_miss = w.sent
    w.misses += 1
    if w.hung or w.misses < after:
        return None
    w.hung = True
    return "failed", hung_reason(answer, w.misses, w.first_miss, timeout_s)


def hung_reason(answer: int | None, misses: int, since: float, timeout_s: float) -> str:
    """Why a running engine is out of routing, as the console shows it."""
    what = f"no answer within {timeout_s:g} s" if answer is None else f"HTTP {answer}"
    at = time.strftime("%H:%M:%S", time.gmtime(since))
    return (
        f"not answering: its /health gave {what} {misses} times in a row since {at} UTC; "
        "out of routing while its process runs on, ready again once it answers"
    )
