"""A roll of every replica (cluster.services.roll(every=True)): what an update's promote and
rollback do, since new weights change no profile."""

from __future__ import annotations

import pytest

from cluster import services
from cluster.models import Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.cluster.test_reconciler import H100, at, tick

pytestmark = pytest.mark.django_db


def test_every_replaces_each_replica_once_and_only_when_the_new_one_is_ready() -> None:
    join_node("n1", [H100] * 8)
    store(gpu_model("chat", scaling={"min": 2, "max": 2}))
    tick(at(2026, 11, 30, 12))
    old = set(Replica.objects.values_list("pk", flat=True))
    Replica.objects.update(state="ready")
    assert services.roll("chat") == []  # no profile changed: a plain roll does nothing
    started = services.roll("chat", every=True)
    assert len(started) == 2
    assert services.roll("chat", every=True) == []  # each is being replaced already
    tick(at(2026, 11, 30, 12))
    assert all(Replica.objects.get(pk=p).desired for p in old)  # the old ones keep serving
    Replica.objects.filter(pk__in=started).update(state="ready")
    tick(at(2026, 11, 30, 12))
    assert set(Replica.objects.filter(desired=True).values_list("pk", flat=True)) == set(started)
