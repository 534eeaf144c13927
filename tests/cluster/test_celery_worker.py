"""A real Celery worker on the local Redis runs the reconcile task against the database."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from cluster.models import Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.dburl import database_url
from tests.redisserver import RedisServer
from tests.redisserver import url as redis_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
REDIS = redis_url(15)


@contextlib.contextmanager
def celery_worker(
    tmp_path: Path, redis: str = REDIS, pool: str = "solo", **extra_env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker on the test database and the local Redis (or ``redis``); this
    process's Celery app sends to that Redis meanwhile. ``pool``: solo (one process), or
    prefork (two children)."""
    from llmgw_core.celery import app

    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=database_url(),
        LLMGW_REDIS_URL=redis,
        LLMGW_DATA_DIR=str(tmp_path),
        LLMGW_SECRET_KEY="test-only",
        **extra_env,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "llmgw_admin", "worker", "--pool", pool,
         "--concurrency", "1" if pool == "solo" else "2", "--without-gossip", "--without-mingle",
         "--loglevel", "INFO"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    old = app.conf.broker_url
    app.conf.broker_url = redis
    _new_pools(app)
    try:
        yield worker
    finally:
        app.conf.broker_url = old
        _new_pools(app)
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()


def _new_pools(app: Any) -> None:
    """Have the next send connect to the broker now configured, as a forked process
    does (Celery's own ``_after_fork``): the pools cache the first broker they used."""
    app._pool = None
    app.amqp._producer_pool = None


@pytest.mark.django_db(transaction=True)
def test_worker_runs_the_reconcile_task(tmp_path: Path) -> None:
    from cluster.tasks import reconcile_cluster
    from llmgw_core.celery import app

    join_node("n1", ["nvidia-h100-80gb"] * 2)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    with celery_worker(tmp_path) as worker:
        reconcile_cluster.apply_async(connection=app.connection_for_write(REDIS))
        deadline = time.monotonic() + 60
        placed = Replica.objects.filter(model_name="chat", assignments__isnull=False)
        while time.monotonic() < deadline and not placed.exists():
            assert worker.poll() is None, worker.stdout.read().decode() if worker.stdout else ""
            time.sleep(0.2)
        if not placed.exists():
            worker.terminate()
            raise AssertionError(worker.communicate(timeout=20)[0].decode()[-3000:])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_with_redis_away_the_worker_still_reconciles_a_change(
    tmp_path: Path, settings: Any, pool: str
) -> None:
    """Beat cannot send the reconcile task while Redis is away, nor can a change: the
    worker ticks on its own timer (the leader lock in PostgreSQL), and the change made
    meanwhile is placed. With the prefork pool the timers run in its children."""
    from cluster.models import ControlMark

    server = RedisServer(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    server.start()
    join_node("n1", ["nvidia-h100-80gb"] * 2)
    settings.REDIS_URL = server.url
    lines: list[str] = []
    try:
        with celery_worker(tmp_path, server.url, pool, LLMGW_RECONCILE_INTERVAL="1") as worker:
            threading.Thread(target=_read, args=(worker, lines), daemon=True).start()
            wait_until(lambda: any(" ready." in line for line in lines), 60, "the worker ready")
            server.stop()  # Redis away: no task reaches the worker from here on
            store(gpu_model("chat", scaling={"min": 1, "max": 1}))
            placed = Replica.objects.filter(model_name="chat", assignments__isnull=False)
            wait_until(placed.exists, 30, "the change placed with Redis away")
            assert worker.poll() is None
            # The tick's mark is written after its placements commit: waited for too.
            ticks = ControlMark.objects.filter(kind=ControlMark.TICK)
            wait_until(ticks.exists, 30, "the tick's mark written")
            mark = ticks.get()
            assert mark.by.startswith("worker on ")
            # Solo: the worker's own process; prefork: one of its children, never the
            # parent, which forks them.
            assert (f"(pid {worker.pid})" in mark.by) == (pool == "solo"), mark.by
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_prefork_worker_starts_its_timers_without_a_failure(tmp_path: Path) -> None:
    """Each child of the pool starts its timer once Celery has given it connections of its
    own: the first look at the last tick works, so an ordinary start logs no failure."""
    from cluster.models import ControlMark

    join_node("n1", ["nvidia-h100-80gb"] * 2)
    lines: list[str] = []
    with celery_worker(tmp_path, pool="prefork", LLMGW_RECONCILE_INTERVAL="1") as worker:
        reader = threading.Thread(target=_read, args=(worker, lines), daemon=True)
        reader.start()
        wait_until(lambda: any(" ready." in line for line in lines), 60, "the worker ready")
        ticks = ControlMark.objects.filter(kind=ControlMark.TICK, by__startswith="worker on ")
        wait_until(ticks.exists, 30, "a tick of the worker's timer")
        worker.terminate()
        worker.wait(timeout=20)
        reader.join(timeout=20)
    out = "".join(lines)
    assert "Traceback" not in out and "timer failed" not in out, out[-4000:]


def test_a_tick_is_due_when_none_finished_within_an_interval() -> None:
    from datetime import UTC, datetime, timedelta

    from cluster.workertimer import due

    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert due(None, now, 5)  # none yet
    assert not due(now - timedelta(seconds=4.9), now, 5)  # beat's last is recent
    assert due(now - timedelta(seconds=5), now, 5)
    assert due(now - timedelta(minutes=3), now, 5)  # beat's ticks stopped


def _read(worker: subprocess.Popen[bytes], lines: list[str]) -> None:
    """Keep a worker's output (its pipe never fills), line by line, until it exits."""
    assert worker.stdout is not None
    for raw in worker.stdout:
        lines.append(raw.decode(errors="replace"))


@pytest.mark.django_db(transaction=True)
def test_a_catalog_change_sends_the_reconcile_task_only_once_it_commits(
    tmp_path: Path, settings: Any
) -> None:
    """A model saved in a transaction wakes the workers after the commit, never before (a
    worker reading the catalog then would not see the model) and never for a rollback. The
    task is looked for on the real broker's queue."""
    import redis

    from cluster import wake
    from llmgw_core.celery import app

    settings.REDIS_URL = REDIS
    queue = redis.Redis.from_url(REDIS, socket_timeout=5)
    queue.delete("celery")
    old = app.conf.broker_url
    app.conf.broker_url = REDIS
    _new_pools(app)
    try:
        with transaction.atomic():
            wake._sent_at = -wake.COALESCE  # no send of an earlier test counts
            store(gpu_model("rolled-back"))
            transaction.set_rollback(True)
        assert queue.llen("celery") == 0  # a rollback wakes nothing
        with transaction.atomic():
            wake._sent_at = -wake.COALESCE
            store(gpu_model("committed"))
            assert queue.llen("celery") == 0  # not before the commit
        sent = [json.loads(m)["headers"]["task"] for m in queue.lrange("celery", 0, -1)]
        assert sent == ["cluster.tasks.reconcile_cluster"]
    finally:
        queue.delete("celery")
        app.conf.broker_url = old
        _new_pools(app)


__all__: list[Any] = []
