"""The catalog as the reconciler's placement reads it: kept while its rows are unchanged.

A tick reuses the last tick's specs and placement profiles only while a fingerprint of
every catalog row says nothing changed; a change however written (the service, or a row
changed underneath it) is placed by the next tick.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog import codec, services
from catalog.choices import Surface
from catalog.models import Profile
from cluster import reconciler
from cluster.models import Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"


def tick() -> reconciler.TickResult:
    """Run a tick with every agent having just heartbeaten."""
    now = reconciler.control_now()
    Node.objects.update(last_heartbeat=now)
    return reconciler.tick(now)


def test_a_profile_changed_under_the_service_is_placed_as_changed_by_the_next_tick() -> None:
    join_node("n1", [H100] * 2)
    store(gpu_model("big", profiles=[{"name": "h100", "gpu_class": H100, "tp": 4}]))
    first = tick()
    (reason,) = first.unplaced.values()
    assert "needs 4 " in reason
    # The same catalog: the replica waits for the same reason.
    assert list(tick().unplaced.values()) == [reason]
    # A row changed without the service (no model saved, no timestamp touched).
    assert Profile.objects.filter(model__name="big").update(tp=2, gpus_per_node=2) == 1
    again = tick()
    assert len(again.placed) == 1 and not again.unplaced
    assert Replica.objects.get(model_name="big").assignments.get().cards == [0, 1]


def test_an_unchanged_catalog_is_not_converted_again() -> None:
    join_node("n1", [H100] * 2)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    tick()
    with CaptureQueriesContext(connection) as queries:
        tick()
    profile_table = Profile._meta.db_table
    reads = [q["sql"] for q in queries if f'FROM "{profile_table}"' in q["sql"]]
    # Only the fingerprint reads the profiles' table: the rows are not fetched again.
    assert len(reads) == 1 and "md5" in reads[0]
    # A change through the service is read again at the next tick.
    m, problems = codec.decode_model(gpu_model("chat", scaling={"min": 2, "max": 2}))
    assert not problems
    services.save_model(m, services.Actor(user=None, surface=Surface.CLI), replacing="chat")
    assert tick().created == {"chat": 1}
