"""Nodes' silence: lost, or held when most fall silent at once (cluster.silence), counted
from when heartbeats could be heard (cluster.marks.listening)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import agentbeat, marks, reconciler
from cluster.models import Assignment, Node
from cluster.silence import MASS_SILENCE, Silence, judge
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import inventory, join_node

H100 = "nvidia-h100-80gb"
T = datetime(2026, 11, 30, 12, tzinfo=ZoneInfo("UTC"))


def beats(silent: int, heard: int) -> list[tuple[str, datetime | None]]:
    """``silent`` nodes last heard 60 s before T, ``heard`` nodes heard at T."""
    return [(f"s{i}", T - timedelta(seconds=60)) for i in range(silent)] + [
        (f"h{i}", T) for i in range(heard)
    ]


# (silent, heard) → "lost" or "held", as Kubernetes' zone states decide it: no node heard
# (full disruption) or more than 2 silent and at least 55% (partial) hold; else lost.
@pytest.mark.parametrize(
    ("silent", "heard", "outcome"),
    [
        (1, 0, "held"),  # the only node: the control plane's silence as likely as its own
        (1, 1, "lost"),
        (2, 0, "held"),
        (2, 1, "lost"),  # 67%, but only 2: a small cluster loses nodes
        (3, 1, "held"),  # 75% and more than 2
        (3, 2, "held"),  # 60%
        (3, 3, "lost"),  # 50%
        (2, 2, "lost"),
        (4, 0, "held"),
        (6, 4, "held"),
        (5, 5, "lost"),
        (1, 9, "lost"),
        (55, 45, "held"),  # exactly the threshold
        (54, 46, "lost"),
    ],
)
def test_silent_nodes_are_lost_unless_most_fell_silent_at_once(
    silent: int, heard: int, outcome: str
) -> None:
    verdict = judge(beats(silent, heard), T, 30)
    names = tuple(f"s{i}" for i in range(silent))
    if outcome == "lost":
        assert verdict == Silence(lost=names)
    else:
        assert verdict.held == names and not verdict.lost
        assert "control plane" in verdict.why and "30 s" in verdict.why


def test_nodes_falling_silent_together_are_held_though_a_heartbeat_apart() -> None:
    """They cross LLMGW_NODE_LOST_AFTER one after another: the first are not lost alone."""
    staggered = [
        ("a", T - timedelta(seconds=4.6)),
        ("b", T - timedelta(seconds=4.2)),
        ("c", T - timedelta(seconds=3.7)),
        ("d", T - timedelta(seconds=3.2)),
    ]
    verdict = judge(staggered, T, 4)
    assert verdict.held == ("a", "b") and not verdict.lost
    # Quiet for less than half the period is still heard: two of four silent are lost.
    verdict = judge([*staggered[:2], ("c", T - timedelta(seconds=1.9)), ("d", T)], T, 4)
    assert verdict.lost == ("a", "b")


def test_nobody_silent_is_neither_lost_nor_held() -> None:
    assert judge(beats(0, 4), T, 30) == Silence()
    assert judge([], T, 30) == Silence()


def test_silence_counts_from_when_heartbeats_could_be_heard() -> None:
    nodes = [("old", T - timedelta(hours=1)), ("never", None), ("fresh", T + timedelta(seconds=2))]
    # Without a start, the old and the never-heard node are silent: 2 of 3 is no disruption.
    assert judge(nodes, T + timedelta(seconds=3), 4) == Silence(lost=("old", "never"))
    # Heard from T on: nobody has been silent for 4 s yet.
    assert judge(nodes, T + timedelta(seconds=3), 4, listening_since=T) == Silence()
    # 5 s after: two silent and the third quiet for 3 s, all at once: held, not lost.
    later = judge(nodes, T + timedelta(seconds=5), 4, listening_since=T)
    assert later.held == ("old", "never") and not later.lost
    # A heartbeat newer than the start counts from itself.
    newer = [("n", T + timedelta(seconds=12)), ("m", T + timedelta(seconds=2))]
    assert judge(newer, T + timedelta(seconds=13), 4, listening_since=T) == Silence(lost=("m",))


@given(
    st.lists(st.one_of(st.none(), st.integers(0, 120)), max_size=30),
    st.one_of(st.none(), st.integers(0, 120)),
    st.integers(1, 60),
)
def test_silence_judgement_properties(
    ages: list[int | None], since_age: int | None, lost_after: int
) -> None:
    """Every silent node is lost or held, never both; held only in a disruption."""
    nodes = [(f"n{i}", None if a is None else T - timedelta(seconds=a)) for i, a in enumerate(ages)]
    since = None if since_age is None else T - timedelta(seconds=since_age)
    verdict = judge(nodes, T, lost_after, since)

    def silent_for(last: datetime | None) -> float:
        heard = last if since is None or (last is not None and last >= since) else since
        return float("inf") if heard is None else (T - heard).total_seconds()

    expected = [name for name, last in nodes if silent_for(last) > lost_after]
    quiet = sum(1 for _, last in nodes if silent_for(last) > lost_after / 2)
    disrupted = quiet == len(nodes) or (quiet > 2 and quiet / len(nodes) >= MASS_SILENCE)
    assert not (verdict.lost and verdict.held)
    assert list(verdict.lost or verdict.held) == expected
    assert bool(verdict.held) == (bool(expected) and disrupted)
    assert bool(verdict.why) == bool(verdict.held)


@pytest.fixture
def four_nodes(settings: Any) -> dict[str, str]:
    """Four nodes, each running one replica of a model (min 4); their node tokens."""
    settings.LLMGW_NODE_LOST_AFTER = 4
    tokens = {name: join_node(name, [H100] * 2)[1] for name in ("a", "b", "c", "d")}
    store(gpu_model("chat", scaling={"min": 4, "max": 4}))
    Node.objects.update(last_heartbeat=T)
    reconciler.tick(T)
    assert Assignment.objects.count() == 4
    return tokens


@pytest.mark.django_db
def test_a_web_process_down_loses_no_node_and_keeps_every_replica(
    four_nodes: dict[str, str],
) -> None:
    """The web process hears heartbeats: while it is down every node falls silent at once."""
    placed = set(Assignment.objects.values_list("replica_id", "node__name"))
    result = reconciler.tick(T + timedelta(seconds=40))
    assert result.lost == [] and sorted(result.held) == sorted(four_nodes)
    for node in Node.objects.all():
        assert node.health == "not_ready" and "control plane" in node.reason
    assert set(Assignment.objects.values_list("replica_id", "node__name")) == placed
    # Still down: nothing changes, and the nodes are not pushed again.
    again = reconciler.tick(T + timedelta(seconds=60))
    assert again.lost == [] and again.held == [] and again.placed == []


@pytest.mark.django_db
def test_nodes_returning_after_the_web_process_get_a_full_grace_period(
    four_nodes: dict[str, str],
) -> None:
    """Silence counts from the web process's start: the nodes still retrying are not lost
    for the silence that was the control plane's."""
    reconciler.tick(T + timedelta(seconds=40))  # the outage: all held
    back = T + timedelta(seconds=40)
    marks.listening(at=back)
    # Two agents are heard again at once; two are still in their back-off.
    Node.objects.filter(name__in=["a", "b"]).update(last_heartbeat=back, health="ready")
    result = reconciler.tick(back + timedelta(seconds=3))
    assert result.lost == [] and Assignment.objects.count() == 4
    # A full LLMGW_NODE_LOST_AFTER after the web process came back, 2 of 4 still silent
    # is no disruption: they are lost and their replicas placed again.
    Node.objects.filter(name__in=["a", "b"]).update(last_heartbeat=back + timedelta(seconds=5))
    result = reconciler.tick(back + timedelta(seconds=5))
    assert sorted(result.lost) == ["c", "d"]


@pytest.mark.django_db
def test_one_silent_node_among_heard_ones_is_still_lost(four_nodes: dict[str, str]) -> None:
    Node.objects.exclude(name="d").update(last_heartbeat=T + timedelta(seconds=40))
    result = reconciler.tick(T + timedelta(seconds=40))
    assert result.lost == ["d"] and result.held == []
    assert Node.objects.get(name="d").health == "lost"


@pytest.mark.django_db
def test_a_held_node_comes_back_ready_with_its_first_heartbeat(four_nodes: dict[str, str]) -> None:
    reconciler.tick(T + timedelta(seconds=40))
    assert Node.objects.get(name="a").health == "not_ready"
    agentbeat.heartbeat_by_token(four_nodes["a"], inventory([H100] * 2, hostname="a"))
    node = Node.objects.get(name="a")
    assert (node.health, node.reason) == ("ready", "")
    assert Assignment.objects.filter(node=node).count() == 1
