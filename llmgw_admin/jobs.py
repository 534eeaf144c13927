"""The periodic jobs: one table that Celery beat and the embedded web process both run from.

Production runs each job as a Celery task, sent by beat every interval
(``CELERY_BEAT_SCHEDULE``, built here by ``beat_schedule`` in the settings). Embedded there
is no worker or beat: ``manage.py serve`` starts one thread per job (``start_embedded``),
which calls the same task in-process every interval. A new periodic job is one row of
``JOBS``; both read it.

Wiring (no app imports it). Nothing of Django or of an app is imported at import time: the
settings import this module.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One periodic job.

    ``task`` is the Celery task's dotted name (beat sends it; embedded, it is called in this
    process). ``interval`` names the setting that holds its period in seconds. ``loop``,
    when set, is the dotted name of a function ``loop(interval, stop)`` that runs the job
    embedded instead of calling the task every interval: the reconciler's loop, which is
    also woken at once by a change (``cluster.wake``).
    """

    name: str
    task: str
    interval: str
    loop: str | None = None


JOBS: tuple[Job, ...] = (
    Job(
        "reconcile-cluster",
        "cluster.tasks.reconcile_cluster",
        "LLMGW_RECONCILE_INTERVAL",
        loop="cluster.reconciler.run_forever",
    ),
    Job("probe-judge-health", "guard.tasks.probe_judge_health", "LLMGW_PROBE_INTERVAL"),
    Job(
        "prune-gateway-refusals",
        "gateway.tasks.prune_refusals",
        "LLMGW_GATEWAY_REFUSAL_PRUNE_INTERVAL",
    ),
    Job(
        "prune-stored-responses",
        "gateway.tasks.prune_responses",
        "LLMGW_RESPONSES_PRUNE_INTERVAL",
    ),
    Job("run-batches", "gateway.tasks.run_batches", "LLMGW_BATCH_INTERVAL"),
    Job("prune-batch-files", "gateway.tasks.prune_files", "LLMGW_FILES_PRUNE_INTERVAL"),
    Job("roll-gateway-history", "gateway.tasks.roll_history", "LLMGW_HISTORY_ROLL_INTERVAL"),
    Job("check-for-updates", "updates.tasks.check_for_updates", "LLMGW_UPDATE_CHECK_EVERY"),
)


def beat_schedule(intervals: Mapping[str, Any], jobs: tuple[Job, ...] = JOBS) -> dict[str, Any]:
    """Return Celery beat's schedule: every job at its interval, expiring before the next."""
    schedule = {}
    for job in jobs:
        every = float(intervals[job.interval])
        schedule[job.name] = {
            "task": job.task,
            "schedule": every,
            # A run still queued when the next is due is dropped, not run twice.
            "options": {"expires": max(1.0, every * 0.9)},
        }
    return schedule


@dataclass(frozen=True)
class Runner:
    """How the embedded web process runs a job: ``target(*args)`` in a thread ``name``."""

    name: str
    interval: float
    target: Callable[..., None]
    args: tuple[Any, ...]


def embedded_runners(
    settings: Any, stop: threading.Event, jobs: tuple[Job, ...] = JOBS
) -> list[Runner]:
    """Return how each job runs in the embedded web process, at its setting's interval."""
    out = []
    for job in jobs:
        interval = float(getattr(settings, job.interval))
        if job.loop:
            out.append(Runner(job.name, interval, _resolve(job.loop), (interval, stop)))
        else:
            out.append(Runner(job.name, interval, every, (interval, _resolve(job.task), stop)))
    return out


def start_embedded(
    settings: Any, stop: threading.Event | None = None, jobs: tuple[Job, ...] = JOBS
) -> list[threading.Thread]:
    """Start a daemon thread per job (embedded: no worker, no beat); return them."""
    stop = stop or threading.Event()
    threads = []
    for runner in embedded_runners(settings, stop, jobs):
        thread = threading.Thread(
            target=runner.target, args=runner.args, name=runner.name, daemon=True
        )
        thread.start()
        threads.append(thread)
    return threads


def every(interval: float, call: Callable[[], Any], stop: threading.Event) -> None:
    """Call ``call()`` every ``interval`` seconds, first after one interval, until ``stop``."""

    name = getattr(call, "name", None) or getattr(call, "__name__", repr(call))
    while not stop.wait(interval):
        try:
            close_old_connections()
            call()
        except Exception:
            log.exception("%s failed; trying again in %g s", name, interval)


def _resolve(dotted: str) -> Callable[..., Any]:
    """Return the object a dotted name ``package.module.name`` names."""
    module, _, attr = dotted.rpartition(".")
    found: Callable[..., Any] = getattr(importlib.import_module(module), attr)
    return found
