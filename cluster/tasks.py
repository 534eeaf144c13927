"""Celery tasks of the cluster (production: run by the worker, scheduled by beat)."""

from __future__ import annotations

from celery import shared_task

from cluster import reconciler


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
    from cluster import benchrun

    benchrun.in_background(model, profile, user_id, surface, via)
