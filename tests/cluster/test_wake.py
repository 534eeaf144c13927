"""The reconciler woken by changes (cluster.wake) instead of waiting for its interval.

The loop and the worker here are given an interval of an hour, so a replica that appears
within the test's wait was placed because the change woke the reconciler.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

from cluster import reconciler, services, wake
from cluster.models import Node, Replica
from tests.catalog.samples import cpu_model, gpu_model, store
from tests.cluster.helpers import join_node
from tests.e2e.conftest import wait_for

H100 = "nvidia-h100-80gb"


@pytest.fixture
def woken(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """This process runs the loop (as the embedded web process does); the loop's event."""
    monkeypatch.setattr(wake, "_looping", True)
    wake._wake.clear()
    yield wake._wake
    wake._wake.clear()


@pytest.mark.django_db(transaction=True)
def test_a_committed_change_wakes_the_loop_and_a_rolled_back_one_does_not(
    woken: threading.Event,
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        store(gpu_model("chat"))
        raise RuntimeError("undo")
    assert not woken.is_set()

    with transaction.atomic():
        store(gpu_model("chat"))
        assert not woken.is_set()  # not before the commit
    assert woken.is_set()


@pytest.mark.django_db(transaction=True)
def test_the_changes_that_wake_it(woken: threading.Event) -> None:
    def wakes(change: Any) -> bool:
        woken.clear()
        change()
        return woken.is_set()

    assert wakes(lambda: join_node("n1", [H100, H100]))
    node = Node.objects.get(name="n1")
    assert not wakes(lambda: services.set_cordon(node, True))  # cordoning places nothing
    assert wakes(lambda: services.set_cordon(node, False))
    assert wakes(lambda: store(cpu_model("small", scaling={"min": 0, "max": 1})))
    # An on-demand model asked for while it has no replica starts now...
    assert wakes(lambda: services.demand("small"))
    reconciler.tick()
    assert Replica.objects.filter(model_name="small", desired=True).exists()
    # ... and asking for it again while it runs wakes nothing.
    assert not wakes(lambda: services.demand("small"))
    assert wakes(lambda: services.drain(node))


@pytest.mark.django_db(transaction=True)
def test_the_embedded_loop_places_a_saved_model_at_once() -> None:
    join_node("n1", [H100, H100])
    stop = threading.Event()

    def loop() -> None:
        try:
            reconciler.run_forever(3600, stop)  # an hour: only a wake-up ticks again
        finally:
            connections.close_all()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wake, "_looping", False)
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        wait_for(lambda: wake._looping, 10, "the loop")
        placed = Replica.objects.filter(model_name="chat", assignments__isnull=False)
        try:
            store(gpu_model("chat", scaling={"min": 1, "max": 1}))
            wait_for(placed.exists, 20, "the replica placed")
        finally:
            stop.set()
            wake.wake()
            thread.join(timeout=20)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_with_redis_a_change_sends_the_task_a_worker_runs(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cluster.test_celery_worker import REDIS, celery_worker

    settings.REDIS_URL = REDIS
    settings.LLMGW_RECONCILE_INTERVAL = 3600
    join_node("n1", [H100, H100])
    placed = Replica.objects.filter(model_name="chat", assignments__isnull=False)
    with celery_worker(tmp_path):
        # The join's wake-up went to the broker before the worker's; this one is not
        # held back as part of the same burst.
        monkeypatch.setattr(wake, "_sent_at", -wake.COALESCE)
        store(gpu_model("chat", scaling={"min": 1, "max": 1}))
        wait_for(placed.exists, 60, "the replica placed by the worker")


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_changes_sends_one_task(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five commits within a fraction of a second put one reconcile task on the real
    broker's queue, to run after the burst and expire before the next tick."""
    import redis

    from llmgw_admin.celery import app
    from tests.cluster.test_celery_worker import REDIS, _new_pools

    settings.REDIS_URL = REDIS
    queue = redis.Redis.from_url(REDIS, socket_timeout=5)
    queue.delete("celery")
    old = app.conf.broker_url
    app.conf.broker_url = REDIS
    _new_pools(app)

    def sent() -> list[dict[str, Any]]:
        return [json.loads(m) for m in queue.lrange("celery", 0, -1)]

    try:
        monkeypatch.setattr(wake, "_sent_at", -wake.COALESCE)
        now = [100.0]
        monkeypatch.setattr(wake, "_clock", lambda: now[0])
        for i in range(5):  # five commits within the same fraction of a second
            store(gpu_model(f"m{i}"))
            now[0] += wake.COALESCE / 10
        tasks = sent()
        assert [t["headers"]["task"] for t in tasks] == ["cluster.tasks.reconcile_cluster"]
        # It runs after the burst's last commit (an eta COALESCE ahead) and expires before
        # the next scheduled tick would make it pointless.
        headers = tasks[0]["headers"]
        assert headers["eta"] is not None and headers["expires"] is not None
        eta = datetime.fromisoformat(headers["eta"])
        expires = datetime.fromisoformat(headers["expires"])
        assert (expires - eta).total_seconds() == pytest.approx(
            float(settings.LLMGW_RECONCILE_INTERVAL), abs=0.05
        )
        now[0] += wake.COALESCE
        store(gpu_model("later"))
        assert len(sent()) == 2
    finally:
        queue.delete("celery")
        app.conf.broker_url = old
        _new_pools(app)
