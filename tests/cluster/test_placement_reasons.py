"""Placement's reasons name the constraint that bound: every condition, and every pair.

Plain data, no database. A base node fits the base profile; ``spoil`` makes it miss one
condition (or several). The reason for a request that fits nowhere must name the
condition the closest node misses, and between nodes as close, the first in
``cluster.placement.reasons.CONDITIONS``.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.placement import (
    Assignment,
    Card,
    Domain,
    Node,
    PlacementProfile,
    Request,
    Running,
    place,
)
from cluster.placement.reasons import CONDITIONS

L4 = "nvidia-l4-24gb"
H100 = "nvidia-h100-80gb"
GB = 1024

PROFILE = PlacementProfile(
    "l4",
    engine="vllm",
    engine_version="0.11",
    gpu_class=L4,
    gpus_per_node=2,
    node_selector={"zone": "z1"},
    min_memory_gb=40,
    cpu_cores=8,
    min_disk_gb=100,
    power_watts=500,
    source="org/m",
)

# The conditions a single-node profile can miss (keep_within's label needs several nodes).
SINGLE = [c for c in CONDITIONS if c != "label"]
# Conditions of one chain: a node missing the first is not said to miss the next.
CHAINS = [{"real", "engine", "version"}, {"class", "count", "free"}]


def base(name: str) -> Node:
    return Node(
        name,
        labels={"zone": "z1", "llmgw.io/rack": name},
        cpu_cores=16,
        memory_mb=64 * GB,
        disk_free_mb=200 * GB,
        engines={"vllm": "0.11.0"},
        cards=tuple(Card(i, L4, 23034, 72) for i in range(4)),
    )


def spoil(n: Node, *conds: str) -> tuple[Node, list[Running], list[Domain]]:
    """Return the node made to miss these conditions, with what it then runs and caps."""
    running: list[Running] = []
    cap = 10_000.0
    for c in conds:
        if c == "ready":
            n = replace(n, schedulable=False)
        elif c == "real":
            n = replace(n, simulated=True)
        elif c == "class":
            n = replace(n, cards=tuple(Card(i, H100, 81559, 700) for i in range(4)))
        elif c == "count":
            n = replace(n, cards=(Card(0, L4, 23034, 72),))
        elif c == "engine":
            n = replace(n, engines={"sglang": "0.5"})
        elif c == "version":
            n = replace(n, engines={"vllm": "0.10.2"})
        elif c == "selector":
            n = replace(n, labels={**n.labels, "zone": "z2"})
        elif c == "free":
            running.append(
                Running(f"{n.name}-busy", "other", "p", 3, (Assignment(n.name, (0, 1, 2)),))
            )
        elif c == "memory":
            n = replace(n, memory_mb=32 * GB)
        elif c == "cores":
            n = replace(n, cpu_cores=4)
        elif c == "disk":
            n = replace(n, disk_free_mb=50 * GB)
        elif c == "power":
            cap = 400.0
        else:  # pragma: no cover - a condition this test does not know
            raise AssertionError(c)
    return n, running, [Domain("rack", n.name, cap)]


# How each condition's reason reads.
SAYS: dict[str, Any] = {
    "ready": lambda r: "take no new replicas" in r or r == "no node is ready for new replicas",
    "real": lambda r: "only simulated nodes" in r and "not vllm" in r,
    "class": lambda r: r == f"no node has {L4} cards",
    "count": lambda r: r.startswith(f"needs 2 {L4} on one node; the largest node has 1"),
    # "No node with L4 cards has ..." only where it is true of every node with them;
    # else the closest nodes are named (another node has it, and misses something else).
    "engine": lambda r: r == f"no node with 2 {L4} has engine vllm"
    or (r.startswith("the nodes closest to fit (") and r.endswith(") lack engine vllm")),
    "version": lambda r: r.startswith(f"no node with 2 {L4} has engine vllm 0.11 (found")
    or (r.startswith("the nodes closest to fit (") and " lack engine vllm 0.11 (found" in r),
    "selector": lambda r: r == f"no node with 2 {L4} matches node_selector zone=z1"
    or (r.startswith("the nodes closest to fit (") and r.endswith("lack node_selector zone=z1")),
    "free": lambda r: r == f"needs 2 free {L4} on one node; the best node has 1",
    "memory": lambda r: r.startswith("needs 40 GB memory"),
    "cores": lambda r: r.startswith("needs 8 CPU cores"),
    "disk": lambda r: r.startswith("needs 100 GB disk"),
    "power": lambda r: r.startswith("power cap of rack"),
}


def reason(*spoiled: tuple[str, ...], profile: PlacementProfile = PROFILE) -> str:
    nodes, running, domains = [], [], []
    for k, conds in enumerate(spoiled):
        n, r, d = spoil(base(f"n{k}"), *conds)
        nodes.append(n)
        running += r
        domains += d
    plan = place(nodes, domains, running, [Request("m/0", "m", (profile,))])
    assert not plan.placed, plan
    (u,) = plan.unplaced
    return u.reason


def said(text: str) -> list[str]:
    return [c for c, test in SAYS.items() if test(text)]


def test_the_base_node_fits() -> None:
    plan = place(
        [base("n0")], [Domain("rack", "n0", 10_000)], [], [Request("m/0", "m", (PROFILE,))]
    )
    assert plan.placed and not plan.unplaced


@pytest.mark.parametrize("cond", SINGLE)
def test_a_node_missing_one_condition_is_told_by_it(cond: str) -> None:
    text = reason((cond,))
    assert said(text) == [cond], text


# The cards: a reason never says no node has them (or enough of them on one) where a
# node has, so a node missing only them is told after one that has them.
HARD = ("class", "count")
# The order in which the nodes fall out when none misses only one condition.
STAGED = ["ready", "real", "class", "count", "engine", "version", "selector", "label"]
STAGED += ["free", "memory", "cores", "disk", "power"]


@pytest.mark.parametrize(("first", "second"), list(itertools.permutations(SINGLE, 2)))
def test_of_two_nodes_each_missing_one_the_first_condition_is_told(first: str, second: str) -> None:
    text = reason((first,), (second,))
    if {first, second} == set(HARD):
        expect = "count"  # the node with one L4 has the class: it needs more of them
    elif first in HARD or second in HARD:
        expect = second if first in HARD else first  # the other node has the cards
    else:
        expect = min(first, second, key=CONDITIONS.index)
    assert said(text) == [expect], text


def _pairs() -> list[tuple[str, str, str]]:
    out = []
    for a, b in itertools.combinations(SINGLE, 2):
        if any(a in chain and b in chain for chain in CHAINS):
            continue
        out += [(a, b, c) for c in SINGLE if c not in (a, b)]
    return out


@pytest.mark.parametrize(("a", "b", "alone"), _pairs())
def test_the_node_missing_least_binds(a: str, b: str, alone: str) -> None:
    # One node misses two conditions, another only one: the one it misses is told,
    # wherever the two come in the order.
    text = reason((a, b), (alone,))
    expect = alone
    if (alone == "class" and "class" not in (a, b)) or (alone == "count" and not {a, b} & {*HARD}):
        # The node missing two has the cards: its misses are told, the first to bind.
        expect = min(a, b, key=STAGED.index)
    assert said(text) == [expect], text


def test_the_issues_case_a_vllm_profile_on_a_simulated_l4_node() -> None:
    # This machine's real agent (CPU only) and a simulated L4 node with 2 of 4 cards free:
    # the L4 cards are there and free; what binds is that the node runs only sim engines.
    local = Node("local", cpu_cores=8, memory_mb=16 * GB, engines={"llamacpp": "b1", "sim": "1"})
    sim = Node(
        "sim-1",
        engines={"vllm": "0.11.0", "sim": "1"},
        cards=tuple(Card(i, L4, 23034, 72) for i in range(4)),
        simulated=True,
    )
    busy = Running("r", "other", "p", 2, (Assignment("sim-1", (0, 1)),))
    p = PlacementProfile("l4", engine="vllm", gpu_class=L4, gpus_per_node=1)
    plan = place([local, sim], [], [busy], [Request("m/0", "m", (p,))])
    assert plan.unplaced[0].reason == (
        f"only simulated nodes have 1 free {L4} (sim-1), and they run only sim profiles, not vllm"
    )


def test_several_nodes_missing_several_fall_back_to_the_first_stage_that_empties() -> None:
    # Nobody misses only one: the walk through the conditions names the one where the
    # last node fell out (n0 has no L4 cards; n1 has them, but not the engine).
    text = reason(("class", "memory"), ("engine", "cores"))
    assert said(text) == ["engine"], text


def test_multi_node_profiles_name_the_binding_condition_with_what_was_found() -> None:
    p = replace(PROFILE, nodes=2)
    text = reason((), ("free",), profile=p)
    assert text == f"needs 2 nodes each with 2 free {L4}; found 1"
    # Two nodes have the cards: room binds.
    text = reason((), ("free",), ("class",), profile=p)
    assert text == f"needs 2 nodes each with 2 free {L4}; found 1"
    text = reason((), ("class",), ("class",), profile=p)
    assert text == f"needs 2 nodes each with {L4}; found 1"
    text = reason((), ("real",), profile=p)
    assert text.startswith("needs 2 nodes each with real cards; found 1")
    # keep_within's label: the unlabelled node is what binds.
    p = replace(PROFILE, nodes=2, keep_within="row")
    n0, n1 = base("n0"), base("n1")
    labelled = replace(n0, labels={**n0.labels, "llmgw.io/row": "a"})
    plan = place(
        [labelled, n1],
        [Domain("rack", "n0", 10_000), Domain("rack", "n1", 10_000)],
        [],
        [Request("m/0", "m", (p,))],
    )
    assert plan.unplaced[0].reason == (
        "keep_within row: needs 2 nodes each with a llmgw.io/row label; found 1"
    )


# Issue 17: "no node has nvidia-l4-24gb cards" was shown where nodes had the class but
# none ran the profile's engine or none was free; a model no node could ever run was not
# told apart from one waiting for room.

CPU_NODE = Node("cpu", cpu_cores=16, memory_mb=64 * GB, engines={"vllm": "0.11.0"})
ONE_L4 = PlacementProfile("l4", engine="vllm", gpu_class=L4, gpus_per_node=1)


def unplaced(nodes: list[Node], running: list[Running] = (), domains: list[Domain] = (),
             profile: PlacementProfile = ONE_L4) -> Any:  # fmt: skip
    plan = place(nodes, domains, list(running), [Request("m/0", "m", (profile,))])
    assert not plan.placed, plan
    return plan.unplaced[0]


def test_nodes_with_the_class_but_not_the_engine_name_the_engine() -> None:
    l4 = replace(base("l4"), engines={"sglang": "0.5"})
    u = unplaced([CPU_NODE, l4])
    assert u.reason == f"no node with {L4} cards has engine vllm"
    assert u.never == f"no node with {L4} cards has engine vllm"


def test_nodes_with_the_class_none_free_name_free_cards_and_are_not_never() -> None:
    busy = Running("b", "other", "p", 3, (Assignment("n0", (0, 1, 2, 3)),))
    u = unplaced([CPU_NODE, base("n0")], [busy])
    assert u.reason == f"needs 1 free {L4} on one node; the best node has 0"
    assert u.never == ""  # room comes back when the other model goes


def test_a_cordoned_node_with_the_class_is_named_and_is_not_never() -> None:
    u = unplaced([CPU_NODE, replace(base("n0"), schedulable=False)])
    assert u.reason.startswith("only nodes that take no new replicas"), u.reason
    assert "n0" in u.reason and u.never == ""


def test_a_simulated_node_with_the_class_is_never_for_a_real_engine() -> None:
    u = unplaced([CPU_NODE, replace(base("n0"), simulated=True)])
    assert u.never.startswith(f"only simulated nodes have 1 free {L4} (n0)"), u.never


@pytest.mark.parametrize(
    ("nodes", "domains", "profile", "says"),
    [
        ([CPU_NODE], [], ONE_L4, f"no node has {L4} cards"),
        ([base("n0")], [], replace(ONE_L4, gpus_per_node=8),
         f"needs 8 {L4} on one node; the largest node has 4"),
        ([replace(base("n0"), engines={"sglang": "0.5"})], [], ONE_L4,
         f"no node with {L4} cards has engine vllm"),
        ([base("n0")], [], replace(ONE_L4, min_memory_gb=512),
         "needs 512 GB memory; the largest node has 64 GB"),
        ([base("n0")], [], replace(ONE_L4, node_selector={"zone": "z9"}),
         f"no node with {L4} cards matches node_selector zone=z9"),
        ([base("n0"), base("n1")], [], replace(ONE_L4, nodes=2, keep_within="row"),
         "keep_within row: needs 2 nodes each with a llmgw.io/row label; found 0"),
        ([base("n0")], [Domain("rack", "n0", 50)], replace(ONE_L4, power_watts=400),
         "power cap of rack n0 (50 W) would be exceeded: 0 W used, needs 400 W"),
    ],
    ids=["class", "count", "engine", "memory", "label", "keep_within", "power"],
)  # fmt: skip
def test_a_model_no_node_could_ever_run_says_so_naming_what_is_missing(
    nodes: list[Node], domains: list[Domain], profile: PlacementProfile, says: str
) -> None:
    # Every node empty and taking replicas would still not do: never, with the reason.
    busy = [Running(f"b{n.name}", "o", "p", 3, (Assignment(n.name, (0,)),)) for n in nodes]
    u = unplaced([replace(n, schedulable=False) for n in nodes], busy, domains, profile)
    assert u.never == says, u.never
    assert u.told == f"no node in this cluster can run it: {says}"


def test_a_model_waiting_for_room_is_not_never() -> None:
    busy = Running("b", "other", "p", 3, (Assignment("n0", (0, 1, 2, 3)),))
    u = unplaced([base("n0")], [busy])
    assert u.never == "" and u.told == u.reason


def test_an_empty_cluster_is_not_never() -> None:
    u = unplaced([])
    assert u.never == "" and u.reason == "no node is ready for new replicas"


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], list[Running]]:
    nodes, running = [], []
    for k in range(draw(st.integers(1, 4))):
        cls = draw(st.sampled_from([L4, H100, ""]))
        count = draw(st.integers(1, 4)) if cls else 0
        n = Node(
            f"n{k}",
            labels={"zone": draw(st.sampled_from(["z1", "z2"]))},
            memory_mb=draw(st.sampled_from([32, 64])) * GB,
            engines=draw(st.sampled_from([{"vllm": "0.11.0"}, {"sglang": "0.5"}])),
            cards=tuple(Card(i, cls, 23034, 72) for i in range(count)),
            schedulable=draw(st.booleans()),
            simulated=draw(st.booleans()) and draw(st.booleans()),
        )
        nodes.append(n)
        busy = draw(st.integers(0, count))
        if busy:
            running.append(Running(f"r{k}", "o", "p", 3, (Assignment(n.name, tuple(range(busy))),)))
    return nodes, running


@settings(max_examples=400, deadline=None)
@given(clusters(), st.integers(1, 3), st.sampled_from([0, 40]), st.booleans())
def test_a_reason_naming_a_missing_thing_is_true_of_every_node(
    case: tuple[list[Node], list[Running]], g: int, mem: int, zoned: bool
) -> None:
    nodes, running = case
    p = replace(ONE_L4, gpus_per_node=g, min_memory_gb=mem,
                node_selector={"zone": "z1"} if zoned else {})  # fmt: skip
    plan = place(nodes, [], running, [Request("m/0", "m", (p,))])
    if plan.placed:
        return
    u = plan.unplaced[0]
    seen = [(n.name, len(n.cards), n.cards[:1], dict(n.engines), n.schedulable, n.simulated)
            for n in nodes]  # fmt: skip
    for text in (u.reason, u.never):
        with_class = [n for n in nodes if any(c.gpu_class == L4 for c in n.cards)]
        if f"no node has {L4} cards" in text:
            assert not with_class, (text, seen)
        enough = [n for n in nodes if sum(c.gpu_class == L4 for c in n.cards) >= g]
        q = f"{L4} cards" if g == 1 else f"{g} {L4}"
        if f"no node with {q} has engine vllm" in text:
            assert all("vllm" not in n.engines for n in enough if not n.simulated), (text, seen)
        if "the largest node has" in text and f"{L4} on one node" in text:
            most = max(sum(c.gpu_class == L4 for c in n.cards) for n in nodes)
            assert text.endswith(f"the largest node has {most}"), (text, seen)
    # Never only where an empty cluster taking replicas on every node would not fit it.
    empty = [replace(n, schedulable=True) for n in nodes]
    could = place(empty, [], [], [Request("m/0", "m", (p,))]).placed
    assert bool(u.never) == (not could and bool(nodes)), (u, could)
