"""Placement with its indexes and memos gives the plan the reference gave, on random clusters.

The reference (``tests/cluster/placement_reference``) is placement before it was made to
grow with the work: the same placements, evictions and reasons, word for word, are held
here on clusters short of room and packed with lower classes, so nothing a person reads
changed. Plain data, no database.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.placement import (
    Card,
    Domain,
    Node,
    PlacementProfile,
    Plan,
    Request,
    Running,
    place,
)
from tests.cluster.placement_reference.placing import place as reference_place

H100 = "nvidia-h100-80gb"
A100 = "nvidia-a100-80gb"
L4 = "nvidia-l4-24gb"
MIG = "nvidia-a100-80gb-mig-1g.10gb"
SOURCES = [f"org/m{k}" for k in range(6)]


def make_node(i: int, rng: random.Random, racks: int) -> Node:
    """Return a random node: H100, A100, L4, MIG or CPU, in one of a few racks."""
    kind = rng.randrange(5)
    labels = {"llmgw.io/rack": f"r{rng.randrange(racks)}", "llmgw.io/site": "dc1"}
    if rng.random() < 0.1:
        del labels["llmgw.io/rack"]
    engines = {"vllm": rng.choice(["0.11.0", "0.10.2"]), "sim": "1"}
    cards: list[Card] = []
    if kind == 0:
        # Cards of one node drawing differently: a replica's derived watts read the
        # lowest free cards, which change as others are taken.
        cards = [Card(c, H100, 81559, rng.choice([300, 700])) for c in range(rng.choice([2, 4, 8]))]
        labels["gpu"] = "big"
    elif kind == 1:
        cards = [Card(c, A100, 81920, 400) for c in range(rng.choice([4, 8]))]
    elif kind == 2:
        cards = [Card(c, L4, 23034, 72) for c in range(rng.choice([1, 2, 4]))]
        engines["llamacpp"] = "b4567"
    elif kind == 3:
        cards = [Card(c, A100, 81920, 400) for c in range(3)]
        cards += [Card(10 + k, MIG, 9856, 57, mig_of=1 + k // 7) for k in range(14)]
    else:
        engines = {"llamacpp": "b4567", "sim": "1"}
        labels["tier"] = "cpu"
    return Node(
        name=f"n{i:03d}",
        labels=labels,
        cpu_cores=rng.choice([0, 16, 32, 64]),
        memory_mb=rng.choice([0, 64_000, 256_000]),
        disk_free_mb=rng.choice([0, 30_000, 400_000]),
        engines=engines,
        cards=cards,
        holds={s for s in SOURCES if rng.random() < 0.2},
        schedulable=rng.random() > 0.1,
        simulated=rng.random() < 0.05,
    )


def make_profile(rng: random.Random, name: str) -> PlacementProfile:
    """Return a random profile: whole cards, multi-node, MIG, L4, CPU or sim."""
    kind = rng.randrange(6)
    common = {
        "priority": rng.randrange(3),
        "source": rng.choice(SOURCES),
        "min_disk_gb": rng.choice([0, 0, 20, 100]),
        "min_memory_gb": rng.choice([0, 0, 16, 128]),
    }
    if kind == 0:
        return PlacementProfile(
            name,
            gpu_class=rng.choice([H100, A100]),
            gpus_per_node=rng.choice([1, 2, 4, 8]),
            engine_version=rng.choice(["", "0.11"]),
            **common,
        )
    if kind == 1:
        return PlacementProfile(
            name,
            gpu_class=H100,
            gpus_per_node=rng.choice([2, 4]),
            nodes=rng.choice([2, 3]),
            keep_within=rng.choice(["rack", "site", ""]),
            power_watts=rng.choice([0, 3000]),
            node_selector=rng.choice([{}, {"gpu": "big"}]),
            **common,
        )
    if kind == 2:
        return PlacementProfile(name, gpu_class=MIG, gpus_per_node=rng.choice([1, 2]), **common)
    if kind == 3:
        return PlacementProfile(name, engine="llamacpp", gpu_class=L4, gpus_per_node=1, **common)
    if kind == 4:
        return PlacementProfile(
            name,
            engine="llamacpp",
            cpu_cores=rng.choice([4, 8, 32]),
            node_selector=rng.choice([{}, {"tier": "cpu"}]),
            **common,
        )
    return PlacementProfile(name, engine="sim", gpu_class=rng.choice([L4, MIG]), **common)


def make_requests(rng: random.Random, count: int, prefix: str) -> list[Request]:
    """Return random requests of every class, a few models with several replicas."""
    out = []
    for k in range(count):
        model = f"{prefix}{rng.randrange(max(count // 2, 1))}"
        profiles = tuple(make_profile(rng, f"p{j}") for j in range(rng.choice([1, 1, 2])))
        out.append(
            Request(f"{prefix}{k}", model, profiles, rng.choice([1, 2, 3]), rng.randrange(2))
        )
    return out


def cluster(seed: int, size: int, wanted: int, packed: bool):
    """Return nodes, domains, running replicas and requests drawn from a seed."""
    rng = random.Random(seed)
    racks = max(size // 4, 1)
    nodes = [make_node(i, rng, racks) for i in range(size)]
    domains = [Domain("rack", f"r{r}", rng.choice([0, 2_000, 6_000])) for r in range(racks)]
    filler = make_requests(rng, size * (3 if packed else 1), "old")
    earlier = reference_place(nodes, domains, [], filler)
    running = [
        Running(
            f"run-{p.key}" if k % 2 else k,
            p.model,
            p.profile,
            rng.choice([1, 1, 2, 3]),
            p.assignments,
            p.source,
        )
        for k, p in enumerate(earlier.placed)
    ]
    requests = make_requests(rng, wanted, "m")
    if running and rng.random() < 0.3:
        r = requests[0]
        protect = frozenset(x.id for x in rng.sample(running, min(3, len(running))))
        requests[0] = Request(r.key, r.model, r.profiles, 3, r.priority, protect)
    return nodes, domains, running, requests


def same(a: Plan, b: Plan) -> None:
    """Hold two plans equal, part by part, so a failure names the part."""
    assert a.placed == b.placed
    assert a.evictions == b.evictions
    assert a.unplaced == b.unplaced


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(1, 40),
    wanted=st.integers(1, 60),
    packed=st.booleans(),
)
def test_the_plan_is_the_reference_plan(seed: int, size: int, wanted: int, packed: bool) -> None:
    """Placements, evictions and reasons match the reference's on a random cluster."""
    nodes, domains, running, requests = cluster(seed, size, wanted, packed)
    same(
        place(nodes, domains, running, requests), reference_place(nodes, domains, running, requests)
    )


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32),
    size=st.integers(2, 40),
    wanted=st.integers(1, 60),
    packed=st.booleans(),
)
def test_the_plan_is_the_reference_plan_with_caps_on_racks_and_rows(
    seed: int, size: int, wanted: int, packed: bool
) -> None:
    """Nodes in rows across racks, both capped, and multi-node replicas kept within a row:
    a group's power is shared with nodes of other groups, and the plan is still the
    reference's."""
    nodes, domains, running, requests = cluster(seed, size, wanted, packed)
    rng = random.Random(seed + 1)
    rows = max(len(domains) // 2, 1)
    nodes = [
        replace(n, labels={**n.labels, "llmgw.io/row": f"w{rng.randrange(rows)}"}) for n in nodes
    ]
    domains = domains + [Domain("row", f"w{k}", rng.choice([0, 3_000, 9_000])) for k in range(rows)]
    requests = [
        replace(
            r,
            profiles=tuple(
                replace(p, keep_within="row") if p.nodes > 1 and rng.random() < 0.6 else p
                for p in r.profiles
            ),
        )
        for r in requests
    ]
    same(
        place(nodes, domains, running, requests), reference_place(nodes, domains, running, requests)
    )


def test_a_packed_cluster_evicts_and_leaves_some_unplaced_as_the_reference_does() -> None:
    """A cluster packed with lower classes, short of room: evictions and reasons alike."""
    nodes, domains, running, requests = cluster(7, 40, 120, True)
    plan = place(nodes, domains, running, requests)
    assert plan.evictions and plan.unplaced and plan.placed
    same(plan, reference_place(nodes, domains, running, requests))


def test_a_shape_that_drew_too_much_fits_once_a_hungrier_card_is_taken() -> None:
    """Power derived from the lowest free card: once another replica takes a 700 W card,
    the same shape reads the 100 W one and fits under the cap it was over before."""
    nodes = [
        Node(
            "n1",
            labels={"llmgw.io/rack": "r1"},
            engines={"vllm": "0.11.0"},
            cards=[Card(0, H100, 81559, 700), Card(1, H100, 81559, 100)],
        )
    ]
    domains = [Domain("rack", "r1", 650)]
    hungry = PlacementProfile("x", gpu_class=H100, gpus_per_node=1)
    requests = [
        Request("a/0", "a", (hungry,), 3),
        Request("b/0", "b", (PlacementProfile("y", gpu_class=H100, power_watts=50),), 2, 1),
        Request("c/0", "c", (PlacementProfile("z", gpu_class=H100, gpus_per_node=1),), 2, 0),
    ]
    plan = place(nodes, domains, [], requests)
    assert [(p.key, p.assignments[0].cards) for p in plan.placed] == [("b/0", (0,)), ("c/0", (1,))]
    assert [u.key for u in plan.unplaced] == ["a/0"]
    same(plan, reference_place(nodes, domains, [], requests))


def test_a_node_that_gains_room_completes_a_multi_node_group_as_the_reference_does() -> None:
    """A two-node replica (keep_within site) that fit nowhere is placed once a node gains
    room, beside a node whose room did not change: every node is walked again, not only
    the one that gained (found on a cluster of 116 nodes)."""
    nodes, domains, running, requests = cluster(10812, 116, 116, False)
    plan = place(nodes, domains, running, requests)
    assert "m98" in {p.key for p in plan.placed}
    same(plan, reference_place(nodes, domains, running, requests))


def test_replicas_of_a_multi_node_model_fill_one_rack_after_another() -> None:
    """Three replicas of a two-node model kept within a rack, three racks of two nodes:
    each replica takes a rack of its own, in order, as the reference places them (the
    racks not yet walked when the first replica found room are not known to be full)."""
    nodes = [
        Node(
            f"n{r}{k}",
            labels={"llmgw.io/rack": f"r{r}"},
            engines={"vllm": "0.11.0"},
            cards=[Card(c, H100, 81559, 700) for c in range(8)],
        )
        for r in range(3)
        for k in range(2)
    ]
    wide = PlacementProfile("tp16", gpu_class=H100, gpus_per_node=8, nodes=2, keep_within="rack")
    requests = [Request(f"big/{n}", "big", (wide,), 3, -n) for n in range(3)]
    plan = place(nodes, [], [], requests)
    assert [[a.node for a in p.assignments] for p in plan.placed] == [
        ["n00", "n01"],
        ["n10", "n11"],
        ["n20", "n21"],
    ]
    same(plan, reference_place(nodes, [], [], requests))
