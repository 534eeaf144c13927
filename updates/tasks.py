"""Celery tasks of the updates app (production: run by the worker, the check scheduled by
beat; embedded: the check called by a thread of the web process, ``llmgw_admin.jobs``,
and a fetch run by a thread of the process that queued it)."""

from __future__ import annotations

from celery import shared_task

from updates import checking, mirror, run

# A fetch of a large model takes hours: it is not held to the tasks' default time limit.
FETCH_TIME_LIMIT_S = 24 * 3600


@shared_task(ignore_result=True)
def check_for_updates() -> int:
    """Check every model with an origin for updates, and take up fetches a dead worker left;
    return how many models were checked (``LLMGW_UPDATE_CHECK_EVERY``)."""
    mirror.resume_stale()
    return len(checking.check_models(by="schedule"))


@shared_task(ignore_result=True, time_limit=FETCH_TIME_LIMIT_S, acks_late=True)
def fetch_into_mirror(pk: int) -> None:
    """Fetch a queued fetch's files into the mirror (``updates.mirror.run_fetch``)."""
    mirror.run_fetch(pk)


# The update flow: an eval runs apart from the reconcile tick that moves the
# update (updates.run); its cases take a while.
@shared_task(ignore_result=True)
def advance_updates() -> int:
    """Look once at every running update (``updates.run.advance_all``), sent at each
    reconcile tick; return how many."""
    return len(run.advance_all())


@shared_task(ignore_result=True)
def run_update_eval(*, pk: int) -> None:
    """Run an update's eval suite against its candidate (``updates.run.run_eval``)."""
    run.run_eval(pk)
