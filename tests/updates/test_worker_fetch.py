"""Production: a fetch into the mirror is run by a real Celery worker on the local Redis
(the task ``updates.tasks.fetch_into_mirror``), the Hub stand-in as the registry."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.catalog.samples import gpu_model, store
from tests.cluster.test_celery_worker import REDIS, ROOT, _new_pools
from tests.dburl import database_url
from tests.updates.hubstandin import HubStandIn
from tests.waiting import wait_until
from updates import mirror
from updates.models import Fetch

WEIGHTS = bytes(range(256)) * 4096


@contextlib.contextmanager
def worker(tmp_path: Path, hub: HubStandIn, mirror_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    from llmgw_core.celery import app

    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=database_url(),
        LLMGW_REDIS_URL=REDIS,
        LLMGW_DATA_DIR=str(tmp_path / "data"),
        LLMGW_SECRET_KEY="test-only",
        HF_ENDPOINT=hub.url,
        LLMGW_MIRROR_HOSTS=hub.url,
        LLMGW_MIRROR_DIR=str(mirror_dir),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "llmgw_admin", "worker", "--pool", "solo",
         "--concurrency", "1", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    old = app.conf.broker_url
    app.conf.broker_url = REDIS
    _new_pools(app)
    try:
        yield proc
    finally:
        app.conf.broker_url = old
        _new_pools(app)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.django_db(transaction=True)
def test_a_worker_fetches_into_the_mirror(hub: HubStandIn, tmp_path: Path, settings: Any) -> None:
    hub.commit("org/chat", {"model.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    with worker(tmp_path, hub, Path(settings.LLMGW_MIRROR_DIR)):
        fetch = mirror.request_fetch("chat", by="test", surface="cli")
        done = wait_until(
            lambda: Fetch.objects.filter(pk=fetch.pk, state__in=("done", "failed")).first(),
            timeout=90,
            what="the worker to end the fetch",
        )
    assert done.state == "done", done.reason
    assert (mirror.local_path("chat") / "model.safetensors").read_bytes() == WEIGHTS
    assert hub.count("GET", "/resolve/") == 1


@pytest.mark.django_db(transaction=True)
def test_a_fetch_whose_worker_is_killed_is_said_so_then_resumed(
    hub: HubStandIn, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from updates import run, signals

    settings.REDIS_URL = REDIS  # fetches are dispatched to the workers through the broker
    monkeypatch.setattr(mirror.fetches, "STALE_AFTER_S", 3)
    # Three of the transfer's 4 MiB buffers; it stalls within the second, so that the first
    # is on disk when the worker dies, whatever the machine's pace (a buffer is handed on
    # when full, or part full after a quarter second: with the stall inside the first, a
    # quick machine held nothing yet, and a stall that outlived its 60 s let it finish).
    big = WEIGHTS * 12
    hub.commit("org/chat", {"model.safetensors": big})
    store(gpu_model("chat"))
    hub.stall_after["model.safetensors"] = len(big) // 2
    mirror_dir = Path(settings.LLMGW_MIRROR_DIR)

    def held() -> int:
        """Bytes in the mirror's folder (the ``.part`` file, while a worker writes it)."""
        total = 0
        for p in mirror_dir.rglob("*"):
            with contextlib.suppress(OSError):
                total += p.stat().st_size if p.is_file() else 0
        return total

    with worker(tmp_path, hub, mirror_dir) as proc:
        fetch = mirror.request_fetch("chat", by="test", surface="cli")
        wait_until(hub.stalled.is_set, timeout=90, what="the transfer to stall halfway")
        wait_until(
            lambda: Fetch.objects.filter(pk=fetch.pk, state="fetching", bytes_done__gt=0).first()
            and held(),
            timeout=30,
            what="the worker to have written the first buffer and said so",
        )
        proc.kill()  # dies mid-transfer
        proc.wait(20)

        def said() -> Fetch | None:
            assert signals.worth_a_look()
            run.advance_all()  # each tick's look
            f = Fetch.objects.get(pk=fetch.pk)
            return f if f.reason.startswith("its worker stopped (no progress for") else None

        f = wait_until(said, timeout=30, what="the dead worker's fetch said so")
        assert f.state in ("queued", "fetching") and "queued again" in f.reason
    hub.unstall.set()
    with worker(tmp_path, hub, mirror_dir):  # a worker again: it takes the fetch up
        done = wait_until(
            lambda: Fetch.objects.filter(pk=fetch.pk, state__in=("done", "failed")).first(),
            timeout=90,
            what="the fetch to end",
        )
    assert done.state == "done", done.reason
    assert (mirror.local_path("chat") / "model.safetensors").read_bytes() == big
    resumed = [r for m, p, r in hub.requests if m == "GET" and "/resolve/" in p][1:]
    # The second worker asked only for what the first had not kept.
    starts = [
        int(r.removeprefix("bytes=").split("-")[0]) for r in resumed if r.startswith("bytes=")
    ]
    assert len(resumed) == 1 and starts and 0 < starts[0] <= len(big) // 2, (
        hub.requests,
        done.reason,
    )
