"""Wake the reconciler when a change wants it, instead of waiting for its next interval.

The reconciler runs every ``LLMGW_RECONCILE_INTERVAL`` seconds (5 by default) whatever
happens, so nothing depends on being woken. Waking only shortens the wait between an
operator's change and its effect: a model saved is placed, a node drained has its
replicas placed elsewhere, an on-demand model asked for starts, at once.

:func:`reconcile_soon` is called by the services that make such changes (the cluster's and
the guard's; a catalog change reaches it through the catalog's ``catalog_changed`` signal,
connected in ``cluster.signals``) and acts after the transaction commits (a rolled-back
change wakes nothing):

- in the process that runs the reconciler's loop (the embedded web process) it ends the
  loop's wait;
- with Redis (production) it sends the reconcile task to the workers, at most one per
  ``COALESCE`` seconds from a process, run that long after it is sent, so a burst of
  changes (a script saving a hundred models) costs one tick;
- elsewhere (a command in a terminal beside an embedded web process) it tells that web
  process through its ``live.sock`` (``cluster.relay``); with none listening, nothing.

Of the cluster, this module imports only the relay, so every module that changes the
cluster can call it; the reconcile task reaches the workers through ``to_worker``, the
task's own ``apply_async``, which the app sets as it starts (``cluster.apps``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import transaction

from cluster import relay

log = logging.getLogger(__name__)

COALESCE = 0.2  # seconds

_wake = threading.Event()
_looping = False
_sent_at = -COALESCE
_sent_lock = threading.Lock()
_clock = time.monotonic
# How a reconcile reaches the workers: ``cluster.tasks.reconcile_cluster.apply_async``, set
# as the app starts (``cluster.apps``): the tasks call the reconciler, which calls this
# module, never the other way round.
to_worker: Callable[..., object] | None = None


def reconcile_soon() -> None:
    """Have the reconciler tick soon, once the current transaction (if any) commits."""
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        _wake_up()
    elif not any(entry[1] is _wake_up for entry in conn.run_on_commit):
        transaction.on_commit(_wake_up, robust=True)


def _wake_up() -> None:
    global _sent_at
    if _looping:
        _wake.set()
        return
    if not settings.REDIS_URL:
        if not relay.listening():
            relay.send_wake()
        return
    with _sent_lock:
        now = _clock()
        if now - _sent_at < COALESCE:
            return  # one on its way runs after this commit
        _sent_at = now
    send = to_worker
    if send is None:
        raise RuntimeError("the cluster app is not ready: no way to the workers is set")
    interval = float(settings.LLMGW_RECONCILE_INTERVAL)
    try:
        # No retries: with Redis away the request must not wait; beat's next tick comes.
        send(countdown=COALESCE, expires=COALESCE + interval, retry=False)
    except Exception as exc:  # the broker away or hung (its timeout: LLMGW_REDIS_TIMEOUT_MS)
        log.warning(
            "could not send the reconcile task (%s: %s); the next scheduled tick will do",
            type(exc).__name__, exc,
        )  # fmt: skip


def loop_started() -> None:
    """Note that this process runs the reconciler's loop (``reconciler.run_forever``)."""
    global _looping
    _looping = True


def wait(seconds: float) -> bool:
    """Wait up to ``seconds`` for a wake-up; True if woken. Clears it for the next wait."""
    woken = _wake.wait(seconds)
    _wake.clear()
    return woken


def wake() -> None:
    """End the loop's current wait now (to stop it, or in tests)."""
    _wake.set()
