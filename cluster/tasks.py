"""Celery tasks of the cluster (production: run by the worker, scheduled by beat), and the
worker's own reconcile timer (``cluster.workertimer``), which ticks without the broker."""

from __future__ import annotations

from typing import Any

from celery import shared_task, signals
from django.conf import settings

from cluster import benchrun, reconciler, workertimer


@shared_task(ignore_result=True)
def reconcile_cluster() -> None:
    """Run one reconcile tick; a worker that is not the leader does nothing."""
    reconciler.start_listening(role="worker")
    reconciler.tick()


@shared_task(ignore_result=True)
def bench_profile(
    model: str, profile: str | None, user_id: int | None, surface: str, via: str
) -> None:
    """Measure a profile's capacity and write it (cluster.benchrun.start's worker part)."""
    benchrun.in_background(model, profile, user_id, surface, via)


def _timer_in_pool_process(**kwargs: Any) -> None:
    """Start the reconcile timer where tasks run: each child of the prefork pool (after its
    fork, with connections of its own), the worker itself for the solo pool."""
    workertimer.start(float(settings.LLMGW_RECONCILE_INTERVAL))


@signals.worker_init.connect
def _timer_after_the_connections_are_closed(**kwargs: Any) -> None:
    """Have each pool child start its timer after Celery's Django fixup has closed the
    connections the child inherited from the worker (its own ``worker_process_init``
    handler, connected as the worker starts, which is now). Connected at this module's
    import, the timer ran first and its first look took the inherited pool as it was
    being closed: a logged failure and a retry on every start."""
    signals.worker_process_init.connect(_timer_in_pool_process)  # once: Celery keys it by id


@signals.worker_ready.connect
def _timer_in_worker(sender: Any = None, **kwargs: Any) -> None:
    """Start it in the worker itself for a pool that sends no ``worker_process_init``
    (threads); a prefork worker's own process forks the pool's children, and runs none."""
    pool = getattr(sender, "pool", None)
    if pool is not None and "prefork" in type(pool).__module__:
        return
    workertimer.start(float(settings.LLMGW_RECONCILE_INTERVAL))
