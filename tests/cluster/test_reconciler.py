"""The reconciler with a frozen clock: scaling, windows, prewarm, time zone, idle, lost."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from cluster import reconciler, services
from cluster.models import Assignment, Node, Replica
from tests.catalog.samples import cpu_model, gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
UTC = ZoneInfo("UTC")


def at(*args: int, tz: Any = UTC) -> datetime:
    return datetime(*args, tzinfo=tz)


def tick(now: datetime) -> reconciler.TickResult:
    """Run a tick at a frozen time, with every agent having just heartbeaten."""
    Node.objects.update(last_heartbeat=now)
    return reconciler.tick(now)


def wanted(name: str) -> int:
    return Replica.objects.filter(model_name=name, desired=True).count()


def test_min_replicas_are_created_and_placed() -> None:
    join_node("n1", [H100] * 4)
    store(gpu_model("chat", scaling={"min": 2, "max": 2}))
    result = tick(at(2026, 11, 30, 12))
    assert result.created == {"chat": 2}
    assert len(result.placed) == 2
    assert Assignment.objects.count() == 2
    r = Replica.objects.first()
    assert r.profile == "h100" and len(r.fingerprint) == 16
    # A second tick changes nothing: level-triggered and idempotent.
    again = tick(at(2026, 11, 30, 12))
    assert not again.created and not again.placed and not again.stopped


def test_unplaced_replica_says_why() -> None:
    join_node("n1", [H100] * 2)
    store(gpu_model("big", profiles=[{"name": "h100", "gpu_class": H100, "tp": 4}]))
    result = tick(at(2026, 11, 30, 12))
    (reason,) = result.unplaced.values()
    assert "4" in reason and H100 in reason and "2" in reason
    assert Replica.objects.get().reason == reason


@pytest.mark.parametrize(
    ("when", "count"),
    [
        (at(2026, 11, 30, 7, 30), 1),  # Monday before the window
        (at(2026, 11, 30, 8, 0), 3),  # Monday, in the window
        (at(2026, 12, 5, 9, 0), 1),  # Saturday: weekdays only
        (at(2026, 12, 1, 23, 30), 2),  # Tuesday night window, past midnight
        (at(2026, 12, 2, 1, 59), 2),  # ...into Wednesday
        (at(2026, 12, 2, 2, 0), 1),
    ],
)
def test_schedule_windows(when: datetime, count: int) -> None:
    join_node("n1", [H100] * 8)
    store(
        gpu_model(
            "chat",
            profiles=[{"name": "h100", "gpu_class": H100}],
            scaling={
                "min": 1,
                "max": 4,
                "schedule": [
                    {"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 3},
                    {"days": ["tue"], "from": "23:00", "to": "02:00", "min": 2},
                ],
            },
        )
    )
    tick(when)
    assert wanted("chat") == count


def test_prewarm_opens_the_window_early() -> None:
    join_node("n1", [H100] * 8)
    store(
        gpu_model(
            "chat",
            profiles=[{"name": "h100", "gpu_class": H100}],
            scaling={
                "min": 1,
                "max": 4,
                "prewarm": "30m",
                "schedule": [{"from": "09:00", "to": "17:00", "min": 3}],
            },
        )
    )
    tick(at(2026, 11, 30, 8, 29))
    assert wanted("chat") == 1
    tick(at(2026, 11, 30, 8, 30))
    assert wanted("chat") == 3
    # Leaving the window scales back down, stopping the extra replicas.
    tick(at(2026, 11, 30, 17, 0))
    assert wanted("chat") == 1
    assert Replica.objects.filter(desired=False).count() == 2


def test_windows_are_read_in_the_control_time_zone(settings: Any) -> None:
    settings.TIME_ZONE = "Asia/Tokyo"
    join_node("n1", [H100] * 8)
    store(
        gpu_model(
            "chat",
            profiles=[{"name": "h100", "gpu_class": H100}],
            scaling={
                "min": 1,
                "max": 4,
                "schedule": [{"days": ["mon"], "from": "08:00", "to": "09:00", "min": 2}],
            },
        )
    )
    # Monday 08:30 in Tokyo is Sunday 23:30 UTC.
    sunday_utc = at(2026, 11, 29, 23, 30)
    assert tick(sunday_utc.astimezone(ZoneInfo("Asia/Tokyo"))).created == {"chat": 2}


def test_on_demand_started_on_demand_and_stopped_after_idle(settings: Any) -> None:
    settings.LLMGW_IDLE_TIMEOUT = 600
    join_node("n1", [], cpu_cores=8)
    store(cpu_model("small", scaling={"min": 0, "max": 1}))
    t0 = at(2026, 11, 30, 12)
    tick(t0)
    assert wanted("small") == 0
    services.demand("small", at=t0)
    tick(t0 + timedelta(seconds=5))
    assert wanted("small") == 1
    tick(t0 + timedelta(seconds=599))
    assert wanted("small") == 1
    tick(t0 + timedelta(seconds=601))
    assert wanted("small") == 0


def test_model_idle_timeout_overrides_the_cluster_default() -> None:
    join_node("n1", [], cpu_cores=8)
    store(cpu_model("small", scaling={"min": 0, "max": 1, "idle_timeout": "2m"}))
    t0 = at(2026, 11, 30, 12)
    services.demand("small", at=t0)
    tick(t0 + timedelta(seconds=119))
    assert wanted("small") == 1
    tick(t0 + timedelta(seconds=121))
    assert wanted("small") == 0


def test_lost_node_replicas_are_placed_elsewhere(settings: Any) -> None:
    settings.LLMGW_NODE_LOST_AFTER = 30
    join_node("a", [H100] * 2)
    join_node("b", [H100] * 2)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    now = timezone.now()
    reconciler.tick(now)
    first = Assignment.objects.get().node.name
    other = "b" if first == "a" else "a"
    Node.objects.filter(name=other).update(last_heartbeat=now + timedelta(seconds=40))
    result = reconciler.tick(now + timedelta(seconds=40))
    assert result.lost == [first]
    assert Node.objects.get(name=first).state == "lost"
    assert Assignment.objects.get().node.name == other
    assert wanted("chat") == 1


def test_a_restarted_control_plane_gives_nodes_a_full_grace_period(
    settings: Any, monkeypatch: Any
) -> None:
    """Silence while the control plane itself was down is not the nodes' silence."""
    settings.LLMGW_NODE_LOST_AFTER = 30
    join_node("a", [H100] * 2)
    join_node("b", [H100] * 2)
    heard = Node.objects.get(name="a").last_heartbeat
    # The control plane was down for 10 minutes and starts reconciling again.
    back = heard + timedelta(minutes=10)
    monkeypatch.setattr(reconciler, "_listening_since", None)
    reconciler.start_listening(back)
    Node.objects.filter(name="b").update(last_heartbeat=back + timedelta(seconds=29))
    assert reconciler.tick(back + timedelta(seconds=29)).lost == []
    assert Node.objects.get(name="a").state == "ready"
    # Still silent a full period after the control plane came back, while b is heard: lost.
    Node.objects.filter(name="b").update(last_heartbeat=back + timedelta(seconds=31))
    assert reconciler.tick(back + timedelta(seconds=31)).lost == ["a"]


def test_critical_evicts_opportunistic_and_the_evicted_comes_back() -> None:
    join_node("n1", [H100] * 2)
    store(gpu_model("cheap", **{"class": "opportunistic"}, scaling={"min": 1, "max": 1}))
    tick(at(2026, 11, 30, 12))
    cheap = Replica.objects.get(model_name="cheap")
    assert cheap.assignments.exists()
    store(gpu_model("vital", **{"class": "critical"}, scaling={"min": 1, "max": 1}))
    result = tick(at(2026, 11, 30, 12))
    assert result.evicted == [cheap.pk]
    cheap.refresh_from_db()
    assert not cheap.assignments.exists() and cheap.state == "pending"
    assert Replica.objects.get(model_name="vital").assignments.exists()
    # Room returns: the evicted replica is placed again.
    join_node("n2", [H100] * 2)
    tick(at(2026, 11, 30, 12))
    assert cheap.assignments.exists()


def test_changed_profile_marks_outdated_and_roll_replaces_when_ready() -> None:
    from catalog import services as catalog_services
    from catalog.choices import Surface
    from catalog.models import ServedModel

    join_node("n1", [H100] * 4)
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    tick(at(2026, 11, 30, 12))
    old = Replica.objects.get()
    m = ServedModel.objects.get(name="chat").to_spec()
    m.profiles[0].args = ["--enforce-eager"]
    catalog_services.save_model(m, catalog_services.Actor(None, Surface.CLI), replacing="chat")
    tick(at(2026, 11, 30, 12))
    assert Replica.objects.get().pk == old.pk  # not moved
    started = services.roll("chat")
    assert len(started) == 1
    tick(at(2026, 11, 30, 12))
    new = Replica.objects.get(pk=started[0])
    assert new.assignments.exists()
    assert Replica.objects.get(pk=old.pk).desired  # old keeps serving until new is ready
    Replica.objects.filter(pk=new.pk).update(state="ready")
    tick(at(2026, 11, 30, 12))
    assert not Replica.objects.get(pk=old.pk).desired


def test_only_one_leader_at_a_time() -> None:
    with reconciler.leadership() as first:
        assert first
        import threading

        seen = []

        def other() -> None:
            from django.db import connection

            with reconciler.leadership() as got:
                seen.append(got)
            connection.close()

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [False]
