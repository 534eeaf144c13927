"""Placement's indexes agree with the plain rules they stand for, on random clusters.

The nodes that suit a profile are found from indexes of engines and labels, and the
best-fit order is kept as replicas take and give back cards (a node moves once per
replica, not once per card). Each is held here to what the plain rule gives: every
node checked one by one, the order built afresh. Plain data, no database.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.placement import PlacementProfile
from cluster.placement.state import State
from tests.cluster.test_placement_equivalence import cluster, make_node, make_profile

SELECTORS = [{}, {"gpu": "big"}, {"tier": "cpu"}, {"gpu": ""}, {"tier": "cpu", "gpu": "big"}]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32), size=st.integers(1, 40))
def test_the_nodes_that_suit_a_profile_are_those_each_node_says_it_suits(
    seed: int, size: int
) -> None:
    """Engine, version and node selector by the indexes match every node checked alone."""
    rng = random.Random(seed)
    nodes = [make_node(i, rng, max(size // 4, 1)) for i in range(size)]
    for k, n in enumerate(nodes):
        if rng.random() < 0.2:
            # An empty label value, which a selector asking for "" matches.
            nodes[k] = replace(n, labels={**n.labels, "gpu": ""})
    state = State(nodes, [], 10.0)
    for j in range(20):
        p = make_profile(rng, f"p{j}")
        p = PlacementProfile(
            p.name,
            engine=p.engine,
            engine_version=rng.choice(["", "0.1", "0.11", "0.10.2", "b4567", "1"]),
            gpu_class=p.gpu_class,
            node_selector=rng.choice(SELECTORS),
        )
        plain = frozenset(i for i in range(len(nodes)) if state.static_ok(i, p))
        assert state.eligible(p) == plain


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32), size=st.integers(1, 30), packed=st.booleans())
def test_the_best_fit_order_kept_through_takes_and_gives_is_the_order_built_afresh(
    seed: int, size: int, packed: bool
) -> None:
    """After replicas take cards and running ones give theirs back, the best-fit order
    of every class and of CPU profiles is the one built from what is free then."""
    nodes, domains, running, requests = cluster(seed, size, 30, packed)
    rng = random.Random(seed)
    state = State(nodes, domains, 10.0)
    state.hold(running)
    state.walk(state.need(PlacementProfile("x")))  # builds the order
    for req in requests:
        p = req.profiles[0]
        need = state.need(p)
        free = [i for i in state.walk(need) if state.fits(i, need)]
        if len(free) >= need.n:
            state.commit(need, rng.sample(free, need.n))
        if running and rng.random() < 0.3:
            r = running.pop(rng.randrange(len(running)))
            state.release(r)
    kept = {
        cls: (b.keys[:], {k: g[:] for k, g in b.groups.items()})
        for cls, b in state.class_buckets.items()
    }
    cpu = (state.cpu_buckets.keys[:], {k: g[:] for k, g in state.cpu_buckets.groups.items()})
    state._bucket()
    for cls, b in state.class_buckets.items():
        assert kept.get(cls) == (b.keys, b.groups)
    assert set(kept) == set(state.class_buckets)
    assert cpu == (state.cpu_buckets.keys, state.cpu_buckets.groups)
