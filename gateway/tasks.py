"""Celery tasks of the gateway (production: run by the worker, scheduled by beat; embedded:
called by a thread of the web process, ``llmgw_admin.jobs``)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from gateway import stored
from gateway.batch import runner, store
from gateway.records import history, refusals


@shared_task(ignore_result=True)
def prune_refusals() -> int:
    """Delete refusal records older than ``LLMGW_GATEWAY_REFUSAL_DAYS``; return how many."""
    return refusals.prune()


@shared_task(ignore_result=True)
def roll_history() -> int:
    """Sum the traffic history's old minutes into hours, delete old hours; return how
    many minute rows were rolled (``gateway.records.history.roll``)."""
    return history.roll()[0]


@shared_task(ignore_result=True)
def prune_responses() -> int:
    """Delete stored responses older than ``LLMGW_RESPONSES_KEEP`` days; return how many."""
    return stored.prune()


# A batch's run lasts at most its window (24 h) and one line's timeout: not held to
# LLMGW_TASK_TIME_LIMIT; a worker lost mid-run is resumed by the next call.
BATCH_TIME_LIMIT_S = 26 * 3600


@shared_task(ignore_result=True, time_limit=BATCH_TIME_LIMIT_S)
def run_batches() -> int:
    """Run (or resume) the oldest batch not ended that no other runner holds
    (``gateway.batch.runner``)."""
    return runner.run_next()


@shared_task(ignore_result=True)
def prune_files() -> int:
    """Delete files and ended batches older than ``LLMGW_FILES_KEEP`` days."""
    return store.prune(settings.LLMGW_FILES_KEEP)
