"""The reconciler's tick asks the database as many times for 2 replicas as for 12.

The cluster is read one query per table, and placements, evictions and the reasons of
those that wait are written in one statement each, not one per replica: a tick at a
large site's size is not a thousand round trips. Counted with Django's
``CaptureQueriesContext`` on two clusters alike but for their size.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from catalog.models import ServedModel
from cluster import reconciler
from cluster.models import Assignment, Node, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
NOW = datetime(2026, 11, 30, 12, tzinfo=ZoneInfo("UTC"))


def counted_tick() -> tuple[reconciler.TickResult, int]:
    """Run a tick with every agent just heard from; return it and its queries."""
    Node.objects.update(last_heartbeat=NOW)
    with CaptureQueriesContext(connection) as queries:
        result = reconciler.tick(NOW)
    return result, len(queries)


def ticks_of(size: int) -> dict[str, int]:
    """On ``size`` nodes of two H100s: a tick that places ``size`` replicas and leaves
    ``size`` waiting; a steady tick; a tick where ``size`` critical replicas evict the
    opportunistic ones. Return each tick's queries, having held what it did."""
    for k in range(size):
        join_node(f"n{k}", [H100] * 2)
    store(
        gpu_model("cheap", **{"class": "opportunistic"}, scaling={"min": size, "max": size}),
        gpu_model(
            "huge",
            profiles=[{"name": "h100", "gpu_class": H100, "tp": 8}],
            scaling={"min": size, "max": size},
        ),
    )
    first, placing = counted_tick()
    assert len(first.placed) == size and len(first.unplaced) == size
    assert Assignment.objects.count() == size
    again, steady = counted_tick()
    assert not again.placed and not again.created and len(again.unplaced) == size
    store(gpu_model("vital", **{"class": "critical"}, scaling={"min": size, "max": size}))
    third, evicting = counted_tick()
    assert len(third.evicted) == size and len(third.placed) == size
    cheap = Replica.objects.filter(model_name="cheap")
    assert not cheap.filter(assignments__isnull=False).exists()
    assert {r.state for r in cheap} == {"pending"}
    assert all(r.evicted_by and r.generation == 2 for r in cheap)
    assert not Replica.objects.filter(model_name="vital", assignments__isnull=True).exists()
    return {"placing": placing, "steady": steady, "evicting": evicting}


@pytest.mark.parametrize("tick", ["placing", "steady", "evicting"])
def test_a_ticks_queries_do_not_grow_with_the_replicas(tick: str) -> None:
    # The first ticks of a process write what later ones only read (the tick's mark):
    # both sizes are counted after them.
    counts = []
    for size in (1, 2, 12):
        counts.append(ticks_of(size))
        Replica.objects.all().delete()
        Node.objects.all().delete()
        ServedModel.objects.all().delete()
    _, small, large = counts
    assert large[tick] == small[tick], (small, large)


def test_a_waiting_replicas_reason_is_written_only_when_it_changed() -> None:
    """A steady tick writes no waiting replica's row: its reason is the one it had."""
    join_node("n1", [H100] * 2)
    store(
        gpu_model(
            "huge",
            profiles=[{"name": "h100", "gpu_class": H100, "tp": 8}],
            scaling={"min": 3, "max": 3},
        )
    )
    counted_tick()
    waiting = {r.pk: r.reason for r in Replica.objects.all()}
    assert all("8" in why for why in waiting.values())
    Node.objects.update(last_heartbeat=NOW)
    with CaptureQueriesContext(connection) as queries:
        reconciler.tick(NOW)
    updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "cluster_replica"')]
    assert not updates
    assert {r.pk: r.reason for r in Replica.objects.all()} == waiting
