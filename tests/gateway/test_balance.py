"""Routing choices: least busy per weight, prefix affinity with bounded load, canaries."""

from __future__ import annotations

import math
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.path import balance
from gateway.path.balance import LEAST, PREFIX, Ring, Target, in_canary, least_busy, pick


def test_least_busy_counts_requests_per_unit_of_weight() -> None:
    small, big = Target(1, 1.0), Target(2, 3.0)
    # 2 in flight on a weight-1 replica weighs more than 4 on a weight-3 one.
    assert least_busy([small, big], {1: 2, 2: 4}) == big
    assert least_busy([small, big], {1: 0, 2: 4}) == small


def test_a_weight_of_zero_counts_as_one() -> None:
    assert Target(1, 0.0).capacity == 1.0
    assert least_busy([Target(1, 0.0), Target(2, 1.0)], {1: 0, 2: 1}).id == 1


def test_excluded_replicas_are_never_chosen() -> None:
    ring = Ring([Target(1), Target(2)])
    for key in ("a", "b", "c", None):
        assert pick(ring, {}, key, exclude={1}).id == 2
        assert pick(ring, {}, key, exclude={1, 2}) is None


def test_ties_are_broken_at_random_so_processes_do_not_herd() -> None:
    targets = [Target(i) for i in range(4)]
    rng = random.Random(7)
    chosen = {least_busy(targets, {}, rng=rng).id for _ in range(200)}
    assert chosen == {0, 1, 2, 3}


def test_the_same_conversation_goes_to_the_same_replica() -> None:
    ring = Ring([Target(i) for i in range(5)])
    for n in range(50):
        key = f"conversation {n}"
        first = pick(ring, {}, key)
        assert all(pick(ring, {}, key) == first for _ in range(3))


def test_conversations_spread_over_every_replica() -> None:
    ring = Ring([Target(i) for i in range(4)])
    counts = Counter(pick(ring, {}, f"c{n}").id for n in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    # Virtual nodes keep each share near a quarter.
    assert max(counts.values()) < 1.5 * min(counts.values())


def test_weight_draws_conversations_in_proportion() -> None:
    ring = Ring([Target(1, 1.0), Target(2, 3.0)])
    counts = Counter(pick(ring, {}, f"c{n}").id for n in range(4000))
    assert 2.7 < counts[2] / counts[1] < 3.3


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(1, 10**9), min_size=1, max_size=6, unique=True),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 6.0]), min_size=6, max_size=6),
)
def test_each_replica_draws_its_weights_share_of_many_keys_whatever_its_id(
    ids: list[int], weights: list[float]
) -> None:
    """Over many conversations each replica's share is within 10 % of its weight's share,
    whatever the replicas' ids (a ring of virtual nodes gave 2.5:1 to 3.5:1 for 3:1).

    A small share of 20,000 keys is a small sample: a weight of 0.5 beside 6, 6 and 1
    expects 741 keys, give or take 27 by chance alone. So the bound is 10 % or five of
    those chance deviations, whichever is wider (a run in CI drew 840 there; 200,000 keys
    drew 7,559 and 7,476 of the 7,407 expected)."""
    targets = [Target(i, w) for i, w in zip(ids, weights, strict=False)]
    ring = Ring(targets)
    keys = 20_000
    counts = Counter(pick(ring, {}, f"conversation {n}").id for n in range(keys))
    total = sum(t.capacity for t in targets)
    for t in targets:
        share = t.capacity / total
        expected = keys * share
        chance = math.sqrt(keys * share * (1 - share))
        bound = max(0.1 * expected, 5 * chance)
        assert abs(counts[t.id] - expected) <= bound, (t, counts, expected)


def test_a_weighty_replica_keeps_its_conversations_at_a_few_in_flight() -> None:
    """The bound's floor is in proportion to weight: a process with a few requests in
    flight does not move a weight-3 replica's conversations to its weight-1 neighbour."""
    ring = Ring([Target(1, 3.0), Target(2, 1.0)])
    keys = [f"c{n}" for n in range(400)]
    big = [k for k in keys if pick(ring, {}, k).id == 1]
    assert big
    for k in big:
        assert pick(ring, {1: 5, 2: 0}, k).id == 1  # up to 6 on it, 2 on the other
        assert pick(ring, {1: 6, 2: 0}, k).id == 2  # past its floor and its share


def test_a_removed_replica_moves_only_its_own_conversations() -> None:
    before = Ring([Target(i) for i in range(5)])
    after = Ring([Target(i) for i in range(4)])
    moved = 0
    for n in range(2000):
        a, b = pick(before, {}, f"c{n}"), pick(after, {}, f"c{n}")
        if a.id != 4:
            moved += a != b
    assert moved == 0


def test_a_busy_replica_sheds_its_affinity_past_the_bound() -> None:
    ring = Ring([Target(i) for i in range(4)])
    key = "hot conversation"
    home = pick(ring, {}, key)
    # Its home is far past its share of what is in flight: the walk goes on.
    in_flight = {home.id: 10, **{t.id: 1 for t in ring.targets if t != home}}
    assert pick(ring, in_flight, key) != home
    # Within the bound (no more than a quarter over the mean), affinity holds.
    in_flight = {home.id: 4, **{t.id: 4 for t in ring.targets if t != home}}
    assert pick(ring, in_flight, key) == home


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]), min_size=1, max_size=8),
    keys=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=400),
)
def test_affinity_never_takes_a_replica_past_its_bounded_share(
    weights: list[float], keys: list[str]
) -> None:
    """Requests that stay in flight: a replica chosen by affinity stays within its bound."""
    targets = [Target(i, w) for i, w in enumerate(weights)]
    ring = Ring(targets)
    in_flight: Counter[int] = Counter()
    total_capacity = sum(t.capacity for t in targets)
    for key in keys:
        total = sum(in_flight.values())
        target = pick(ring, in_flight, key, profile=PREFIX, rng=random.Random(1))
        assert target is not None
        least = min(t.capacity for t in targets)
        bound = max(
            balance.FLOOR * target.capacity / least,
            balance.LOAD_FACTOR * (total + 1) * target.capacity / total_capacity,
        )
        fallback = not any(
            balance.within_bound(
                t, in_flight, total, total_capacity, floor=balance.FLOOR, least=least
            )
            for t in targets
        )
        assert fallback or in_flight[target.id] + 1 <= bound
        in_flight[target.id] += 1


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]), min_size=1, max_size=8),
    picks=st.integers(1, 300),
)
def test_least_busy_always_takes_the_lowest_load_per_weight(
    weights: list[float], picks: int
) -> None:
    targets = [Target(i, w) for i, w in enumerate(weights)]
    ring = Ring(targets)
    in_flight: Counter[int] = Counter()
    for n in range(picks):
        target = pick(ring, in_flight, f"k{n}", profile=LEAST, rng=random.Random(n))
        lowest = min((in_flight[t.id] + 1) / t.capacity for t in targets)
        assert (in_flight[target.id] + 1) / target.capacity == lowest
        in_flight[target.id] += 1


@given(key=st.text(min_size=1), percent=st.integers(0, 100))
def test_canary_is_sticky_per_conversation(key: str, percent: int) -> None:
    assert in_canary(key, percent) == in_canary(key, percent)
    if percent == 0:
        assert not in_canary(key, percent)
    if percent == 100:
        assert in_canary(key, percent)


def test_canary_takes_its_percent_of_conversations() -> None:
    share = sum(in_canary(f"c{n}", 10) for n in range(10000)) / 10000
    assert 0.08 < share < 0.12


def test_a_light_replica_keeps_a_second_conversation_of_a_process() -> None:
    """Weights 6 and 2 (a capacity bench's): a process with one request on the light
    replica still sends it the next conversation that hashes to it. With a floor of one,
    a process with two to four in flight passed it over whenever two hashed to it, and it
    drew 19 % of an end-to-end test's answers for its 25 %."""
    ring = Ring([Target(1, 6.0), Target(2, 2.0)])
    light = [k for k in (f"c{n}" for n in range(400)) if pick(ring, {}, k).id == 2]
    assert light
    for k in light:
        assert pick(ring, {2: 1}, k).id == 2
        assert pick(ring, {1: 2, 2: 1}, k).id == 2
