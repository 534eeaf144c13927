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


@pytest.fixture
def embedded_loop(transactional_db: Any) -> Iterator[None]:
    """The embedded web process's reconciler loop, ticking once an hour: what it does
    within a test's wait, a wake-up made it do."""
    stop = threading.Event()

    def loop() -> None:
        try:
            reconciler.run_forever(3600, stop)
        finally:
            connections.close_all()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wake, "_looping", False)
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        wait_for(lambda: wake._looping, 10, "the loop")
        try:
            yield
        finally:
            stop.set()
            wake.wake()
            thread.join(timeout=20)
    assert not thread.is_alive()


def placed_on(model: str, node: str) -> Any:
    return Replica.objects.filter(
        model_name=model, desired=True, assignments__node__name=node
    ).exists


def test_the_changes_that_wake_it_place_what_was_waiting_at_once(embedded_loop: None) -> None:
    """Each change an operator or an agent makes is acted on at once, as the one who made
    it sees: a replica waiting for a node is placed on the node that joins, on the node
    uncordoned, an on-demand model asked for is started, a drained node's replica is
    replaced elsewhere. (The loop's interval is an hour.)"""
    store(gpu_model("waiting", scaling={"min": 1, "max": 1}))
    wait_for(lambda: Replica.objects.filter(model_name="waiting").exists(), 20, "a replica")
    join_node("n1", [H100, H100, H100])  # room for "waiting" (tp 2) and one more
    wait_for(placed_on("waiting", "n1"), 20, "the replica placed on the node that joined")

    node = Node.objects.get(name="n1")
    services.set_cordon(node, True)
    store(gpu_model("cordoned", scaling={"min": 1, "max": 1}, profiles=[
        {"name": "h100", "engine": "vllm", "gpu_class": H100, "tp": 1}]))  # fmt: skip
    reason = Replica.objects.filter(model_name="cordoned", unplaced=True)
    wait_for(reason.exists, 20, "the new model waiting (its node cordoned)")
    services.set_cordon(node, False)
    wait_for(placed_on("cordoned", "n1"), 20, "the replica placed on the node uncordoned")

    join_node("n2", [H100, H100, H100])
    store(cpu_model("small", scaling={"min": 0, "max": 1}))
    services.demand("small")
    started = Replica.objects.filter(model_name="small", desired=True, assignments__isnull=False)
    wait_for(started.exists, 20, "the on-demand model started when asked for")

    services.drain(node, force=True)
    wait_for(placed_on("waiting", "n2"), 20, "the drained node's replica replaced on n2")


def test_the_embedded_loop_places_a_saved_model_at_once(embedded_loop: None) -> None:
    join_node("n1", [H100, H100])
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    wait_for(placed_on("chat", "n1"), 20, "the replica placed")


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

    from llmgw_core.celery import app
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
