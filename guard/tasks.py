"""Celery tasks of the guard (production: run by the worker, scheduled by beat)."""

from __future__ import annotations

from celery import shared_task

from guard import evalrun, services


@shared_task(ignore_result=True)
def probe_judge_health() -> None:
    """Probe every judge with an ordinary and a harmful text; keep how each did."""
    services.probe_judges()


# Acknowledged when done, and given back when the worker dies: a run is asked again
# from the start rather than left running.
@shared_task(ignore_result=True, time_limit=3600, acks_late=True, reject_on_worker_lost=True)
def run_evaluation(pk: int) -> None:
    """Ask the judges of an evaluation started from the console (``evalrun.start``)."""
    evalrun.execute_kept(pk)
