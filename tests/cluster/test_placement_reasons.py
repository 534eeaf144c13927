"""Placement's reasons name the constraint that bound: every condition, and every pair.

Plain data, no database. A base node fits the base profile; ``spoil`` makes it miss one
condition (or several). The reason for a request that fits nowhere must name the
condition the closest node misses, and between nodes as close, the first in
``cluster.placement._CONDITIONS``.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from cluster.placement import (
    _CONDITIONS,
    Assignment,
    Card,
    Domain,
    Node,
    PlacementProfile,
    Request,
    Running,
    place,
)

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
SINGLE = [c for c in _CONDITIONS if c != "label"]
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
    "engine": lambda r: r == f"no node with {L4} cards has engine vllm",
    "version": lambda r: r.startswith(f"no node with {L4} cards has engine vllm 0.11 (found"),
    "selector": lambda r: r == f"no node with {L4} cards matches node_selector zone=z1",
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


@pytest.mark.parametrize(("first", "second"), list(itertools.permutations(SINGLE, 2)))
def test_of_two_nodes_each_missing_one_the_first_condition_is_told(first: str, second: str) -> None:
    text = reason((first,), (second,))
    expect = min(first, second, key=_CONDITIONS.index)
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
    assert said(text) == [alone], text


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
    # Either would bind; the class comes first.
    text = reason((), ("free",), ("class",), profile=p)
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
