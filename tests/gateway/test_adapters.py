"""Adapters on replicas that hold only a few: affinity while there is room, LRU unloads."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.path.adapters import Placer
from gateway.path.balance import Target


def test_a_replica_holding_the_adapter_takes_it_while_it_has_room() -> None:
    p = Placer()
    targets = [Target(1), Target(2)]
    first, _ = p.choose(targets, {}, "sql", 2)
    again, _ = p.choose(targets, {first.id: 1}, "sql", 2)
    assert again == first  # it has room: a second request there
    other, _ = p.choose(targets, {first.id: 6}, "sql", 2)
    assert other != first  # too busy: the other loads it too
    assert "sql" in p.holds(other.id)


def test_past_max_loaded_the_least_recently_used_is_unloaded() -> None:
    p = Placer()
    one = [Target(1)]
    assert p.choose(one, {}, "a", 2) == (one[0], None)
    assert p.choose(one, {}, "b", 2) == (one[0], None)
    p.choose(one, {}, "a", 2)  # a used again: b is now the oldest
    assert p.choose(one, {}, "c", 2) == (one[0], "b")
    assert p.holds(1) == ["a", "c"]


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=200),
    replicas=st.integers(1, 4),
    max_loaded=st.integers(1, 3),
)
def test_no_replica_ever_holds_more_than_max_loaded(
    names: list[str], replicas: int, max_loaded: int
) -> None:
    p = Placer()
    targets = [Target(i) for i in range(replicas)]
    in_flight: Counter[int] = Counter()
    for n, name in enumerate(names):
        target, evicted = p.choose(targets, in_flight, name, max_loaded)
        assert target is not None and name in p.holds(target.id)
        assert evicted != name
        assert all(len(p.holds(t.id)) <= max_loaded for t in targets)
        if n % 3 == 0:
            in_flight[target.id] += 1
