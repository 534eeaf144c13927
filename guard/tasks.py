"""Celery tasks of the guard (production: run by the worker, scheduled by beat)."""

from __future__ import annotations

from celery import shared_task

from guard import services


@shared_task(ignore_result=True)
def probe_judge_health() -> None:
    """Probe every judge with an ordinary and a harmful text; keep how each did."""
    services.probe_judges()
