"""One table of periodic jobs: Celery beat's schedule and the embedded threads read it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from django.conf import settings

from llmgw_admin import jobs
from llmgw_core.celery import app
from tests.waiting import wait_until


def test_every_job_is_in_beats_schedule_at_its_interval_and_nothing_else() -> None:
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert set(schedule) == {job.name for job in jobs.JOBS}
    for job in jobs.JOBS:
        entry = schedule[job.name]
        interval = float(getattr(settings, job.interval))
        assert entry["task"] == job.task
        assert entry["schedule"] == interval
        assert 0 < entry["options"]["expires"] < interval or interval <= 1


def test_every_jobs_task_is_one_the_worker_runs() -> None:
    app.loader.import_default_modules()
    assert {job.task for job in jobs.JOBS} <= set(app.tasks)


def test_the_embedded_process_runs_every_job_at_its_interval() -> None:
    stop = threading.Event()
    runners = jobs.embedded_runners(settings, stop)
    assert [r.name for r in runners] == [job.name for job in jobs.JOBS]
    for job, runner in zip(jobs.JOBS, runners, strict=True):
        interval = float(getattr(settings, job.interval))
        assert runner.interval == interval
        if job.loop:
            assert f"{runner.target.__module__}.{runner.target.__name__}" == job.loop
            assert runner.args == (interval, stop)
        else:
            # The same task the worker runs, called in this process.
            assert runner.target is jobs.every
            assert runner.args[0] == interval and runner.args[2] is stop
            assert runner.args[1].name == job.task


def test_a_job_added_to_the_table_is_scheduled_by_both() -> None:
    extra = (*jobs.JOBS, jobs.Job("tidy-up", "guard.tasks.probe_judge_health", "TIDY_INTERVAL"))
    intervals = {job.interval: 7 for job in extra}
    assert jobs.beat_schedule(intervals, extra)["tidy-up"]["schedule"] == 7.0
    runners = jobs.embedded_runners(SimpleNamespace(**intervals), threading.Event(), extra)
    assert runners[-1].name == "tidy-up" and runners[-1].interval == 7.0


LOOPED: list[float] = []
CALLS: list[int] = []


def looping(interval: float, stop: threading.Event) -> None:
    """A job's own loop, as the reconciler's is."""
    LOOPED.append(interval)


def task() -> None:
    """A job's task; the first run fails."""
    CALLS.append(len(CALLS))
    if len(CALLS) == 1:
        raise RuntimeError("the first run fails")


@pytest.mark.django_db
def test_start_embedded_runs_each_job_in_a_named_thread_until_stopped() -> None:
    LOOPED.clear()
    CALLS.clear()
    table = (
        jobs.Job("own-loop", "tests.test_jobs.task", "SLOW", loop="tests.test_jobs.looping"),
        jobs.Job("plain", "tests.test_jobs.task", "FAST"),
    )
    stop = threading.Event()
    threads = jobs.start_embedded(SimpleNamespace(SLOW=60, FAST=0.01), stop, table)
    assert [t.name for t in threads] == ["own-loop", "plain"]
    wait_until(lambda: LOOPED == [60.0], what="the job's own loop to be started")
    # Called every interval; a failed run is logged and the next one comes.
    wait_until(lambda: len(CALLS) >= 3, what="three runs of the plain job")
    stop.set()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
