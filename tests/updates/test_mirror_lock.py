"""A fetch waiting for another writer of its folder is alive, not left by a dead worker:
its row moves while it waits, so the tick's look does not take it up again nor fail it."""

from __future__ import annotations

import fcntl
import hashlib
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections
from django.utils import timezone

from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import HubStandIn
from tests.waiting import wait_until
from updates import mirror, registry
from updates.models import Fetch

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_fetch_waiting_for_its_folder_s_lock_is_not_taken_for_a_dead_one(
    hub: HubStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror.store, "LOCK_POLL_S", 0.02)
    monkeypatch.setattr(mirror.store, "LOCK_TOUCH_S", 0.05)
    hub.commit("org/chat", {"model.safetensors": b"w" * 1000})
    store(gpu_model("chat"))
    f = mirror.request_fetch("chat", start=False)
    folder = mirror.folder_for("org/chat", registry.latest("org/chat").commit)
    locks = mirror.root() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    held = open(locks / (hashlib.sha256(folder.encode()).hexdigest()[:24] + ".lock"), "a+b")  # noqa: SIM115
    fcntl.flock(held, fcntl.LOCK_EX)  # another process writing the same folder
    result: list[Any] = []

    def fetch() -> None:
        try:
            result.append(mirror.run_fetch(f.pk))
        finally:
            close_old_connections()

    worker = threading.Thread(target=fetch, daemon=True)
    worker.start()
    try:
        wait_until(lambda: Fetch.objects.get(pk=f.pk).state == "fetching", what="fetching")
        long_ago = timezone.now() - timedelta(seconds=mirror.fetches.STALE_AFTER_S + 5)
        Fetch.objects.filter(pk=f.pk).update(updated=long_ago)
        wait_until(lambda: Fetch.objects.get(pk=f.pk).updated > long_ago, what="its row moved")
        assert mirror.resume_stale() == []
        assert Fetch.objects.get(pk=f.pk).reason == ""
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()
    worker.join(30)
    assert not worker.is_alive()
    assert result and result[0].state == "done", result
