"""A Celery worker's own reconcile timer: the reconciler ticks without the broker.

Beat sends the reconcile task every ``LLMGW_RECONCILE_INTERVAL`` seconds and a change sends
it at once (``cluster.wake``), both through Redis: with Redis away neither arrives. So each
worker process also keeps a timer of its own, as the embedded web process runs its loop
(``reconciler.run_forever``): a thread, started as the worker's pool starts (in each child
of the prefork pool, in the worker itself for the solo pool), that ticks whenever the last
tick any process finished (``cluster.marks``) is an interval old or older. The leader lock
in PostgreSQL keeps it to one tick at a time across every worker; the mark keeps the timers
from doubling beat's ticks while Redis is up. A change made inside the worker wakes its
timer at once (``wake.loop_started``), without the broker either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from django.db import close_old_connections
from django.utils import timezone

from cluster import reconciler, wake
from cluster.models import ControlMark

log = logging.getLogger(__name__)

# How often the timer looks at the last tick, as a share of the interval: a tick is late
# by at most this much of an interval.
LOOK_EVERY = 0.25
# A failing look or tick (PostgreSQL away) is logged whole once, then a line this often.
QUIET_S = 60.0

_started: threading.Thread | None = None
_lock = threading.Lock()


def due(last: datetime | None, now: datetime, interval: float) -> bool:
    """Return whether a tick is due: none has finished yet, or the last is an interval old."""
    return last is None or (now - last).total_seconds() >= interval


def last_tick() -> datetime | None:
    """Return when the last tick finished, in any process (``cluster.marks``)."""
    mark = ControlMark.objects.filter(kind=ControlMark.TICK).only("at").first()
    return mark.at if mark else None


def run(
    interval: float,
    stop: threading.Event | None = None,
    now: Callable[[], datetime] = timezone.now,
) -> None:
    """Tick when due or woken, looking every ``LOOK_EVERY`` of ``interval``, until ``stop``."""
    stop = stop or threading.Event()
    reconciler.start_listening(role="worker")
    wake.loop_started()
    look = max(0.05, interval * LOOK_EVERY)
    woken = False
    failing_since: float | None = None
    said = 0.0
    while not stop.is_set():
        try:
            close_old_connections()
            if woken or due(last_tick(), now(), interval):
                reconciler.tick()
            if failing_since is not None:
                log.warning("the worker's reconcile timer works again")
                failing_since = None
        except Exception as exc:
            at = time.monotonic()
            if failing_since is None:
                failing_since = said = at
                log.exception("the worker's reconcile timer failed; trying again in %g s", look)
            elif at - said >= QUIET_S:
                said = at
                log.warning(
                    "the worker's reconcile timer still fails (%s: %s), for %.0f s now",
                    type(exc).__name__, exc, at - failing_since,
                )  # fmt: skip
        woken = wake.wait(look)


def start(interval: float) -> threading.Thread:
    """Start this process's timer (once: a second call returns the running one)."""
    global _started
    with _lock:
        if _started is None or not _started.is_alive():
            _started = threading.Thread(
                target=run, args=(interval,), name="reconcile-timer", daemon=True
            )
            _started.start()
        return _started
