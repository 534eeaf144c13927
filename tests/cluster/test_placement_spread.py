"""Replicas of a model spread across nodes and racks, as Kubernetes'
topology spread does a deployment's pods; where they cannot, the placement says so.

Plain data, no database.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalog.spec import Model, Profile
from cluster.placement import (
    Assignment,
    Card,
    Node,
    PlacementProfile,
    Request,
    Running,
    place,
    requests_from_spec,
)

H100 = "nvidia-h100-80gb"
ONE = (PlacementProfile("h100", gpu_class=H100, gpus_per_node=1),)


def node(name: str, count: int = 2, rack: str = "", holds: frozenset[str] = frozenset()) -> Node:
    labels = {"llmgw.io/rack": rack} if rack else {}
    return Node(name, labels=labels, engines={"vllm": "0.11.0"},
                cards=[Card(i, H100) for i in range(count)], holds=holds)  # fmt: skip


def reqs(model: str, n: int, start: int = 0) -> list[Request]:
    return [Request(f"{model}/{k}", model, ONE, 2, -k) for k in range(start, start + n)]


def nodes_of(plan: object) -> list[str]:
    return [p.assignments[0].node for p in plan.placed]  # type: ignore[attr-defined]


def test_the_issues_case_a_min_2_model_gets_two_nodes() -> None:
    # Best fit alone put both on one node (the fewest free cards that suffice).
    plan = place([node("a"), node("b")], [], [], reqs("m", 2))
    assert sorted(nodes_of(plan)) == ["a", "b"]
    assert all(p.note == "" for p in plan.placed)


def test_a_replica_goes_beside_running_ones_only_when_no_other_node_has_room() -> None:
    running = [Running("r0", "m", "h100", 2, (Assignment("a", (0,)),))]
    assert nodes_of(place([node("a"), node("b")], [], running, reqs("m", 1, 1))) == ["b"]
    # b is full: a is the only room, and the note says why it shares.
    busy = Running("x", "other", "h100", 2, (Assignment("b", (0, 1)),))
    plan = place([node("a"), node("b")], [], [*running, busy], reqs("m", 1, 1))
    assert nodes_of(plan) == ["a"]
    assert plan.placed[0].note == "beside another replica of m on a: no other node has room for it"


def test_spread_beats_the_weights_being_held() -> None:
    held = frozenset({"org/m"})
    running = [Running("r0", "m", "h100", 2, (Assignment("a", (0,)),), "org/m")]
    p = (PlacementProfile("h100", gpu_class=H100, gpus_per_node=1, source="org/m"),)
    plan = place([node("a", holds=held), node("b")], [], running, [Request("m/1", "m", p)])
    assert nodes_of(plan) == ["b"]


def test_racks_where_labelled_then_nodes_in_them() -> None:
    nodes = [node("a1", rack="r1"), node("a2", rack="r1"), node("b1", rack="r2")]
    plan = place(nodes, [], [], reqs("m", 3))
    placed = nodes_of(plan)
    assert set(placed) == {"a1", "a2", "b1"} and placed[1] != placed[0]
    # The first two went to different racks.
    rack = {"a1": "r1", "a2": "r1", "b1": "r2"}
    assert rack[placed[0]] != rack[placed[1]]
    # Only r1 has room: the note names the rack.
    running = [Running("r0", "m", "h100", 2, (Assignment("b1", (0,)),))]
    full = [Running("x", "o", "h100", 2, (Assignment("b1", (1,)),))]
    plan = place(nodes[:1] + nodes[2:], [], running + full, reqs("m", 1, 1))
    assert nodes_of(plan) == ["a1"] and plan.placed[0].note == ""
    one_rack = [node("a1", rack="r1"), node("b1", rack="r1")]
    running = [Running("r0", "m", "h100", 2, (Assignment("b1", (0,)),))]
    plan = place(one_rack, [], running, reqs("m", 1, 1))
    assert nodes_of(plan) == ["a1"]
    assert plan.placed[0].note.startswith("in rack r1 beside another replica of m")


def test_a_catalog_models_replicas_spread() -> None:
    model = Model(name="chat", source="org/chat", profiles=[Profile(name="h100", gpu_class=H100)])
    plan = place([node("a", 4), node("b", 4), node("c", 4)], [], [], requests_from_spec(model, 3))
    assert sorted(nodes_of(plan)) == ["a", "b", "c"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=5),
    st.lists(st.integers(0, 2), max_size=5),
    st.integers(1, 6),
)
def test_spread_never_puts_two_replicas_on_a_node_while_another_node_fits(
    sizes: list[int], busy: list[int], wanted: int
) -> None:
    nodes = [node(f"n{k}", c) for k, c in enumerate(sizes)]
    running = [
        Running(f"x{k}", "other", "h100", 2, (Assignment(f"n{k}", tuple(range(b))),))
        for k, b in enumerate(busy[: len(sizes)])
        if 0 < b <= sizes[k]
    ]
    plan = place(nodes, [], running, reqs("m", wanted))
    on = Counter(nodes_of(plan))
    used = Counter()
    for r in running:
        used[r.assignments[0].node] += len(r.assignments[0].cards)
    for p in plan.placed:
        used[p.assignments[0].node] += 1
    room = {n.name for n in nodes if used[n.name] < len(n.cards)}
    if any(k >= 2 for k in on.values()):
        # A node got a second replica: every node without one was full by then (and is).
        assert not [n for n in room if on[n] == 0], (on, room)
    # Evenly: no node has two more than another node that still has room.
    for n in room:
        assert max(on.values(), default=0) <= on[n] + 1, (on, room)
