"""gateway.path.outliers: which replicas a gateway process leaves out of routing, over plain
data and a clock the test moves (hypothesis for the rules that must hold whatever
happens)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.path.outliers import MAX_TRACKED, Outliers, Rules, allowed, ejection_seconds

RULES = Rules(after=3, base=10.0, most=35.0, max_percent=50)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(rules: Rules = RULES) -> tuple[Outliers, Clock]:
    clock = Clock()
    return Outliers(rules, clock), clock


def fail(o: Outliers, replica: int, times: int, pool: tuple[int, ...] = (1, 2)) -> list:
    return [o.failed("m", replica, pool) for _ in range(times)]


def test_after_consecutive_failures_a_replica_is_out_for_base_seconds() -> None:
    o, clock = detector()
    assert fail(o, 1, 2) == [None, None]
    assert o.excluded((1, 2)) == frozenset()
    ejection = o.failed("m", 1, (1, 2))
    assert ejection is not None
    assert (ejection.model, ejection.replica, ejection.seconds, ejection.failures) == (
        "m",
        1,
        10.0,
        3,
    )
    assert ejection.until == clock.now + 10
    assert o.excluded((1, 2)) == {1}
    assert o.current() == {"m": {1: clock.now + 10}}
    clock.now += 9.9
    assert o.excluded((1, 2)) == {1}
    clock.now += 0.1
    assert o.excluded((1, 2)) == frozenset()  # back on its own
    assert o.current() == {}


def test_an_answer_under_500_resets_the_count() -> None:
    o, _ = detector()
    fail(o, 1, 2)
    o.succeeded(1)
    assert fail(o, 1, 2) == [None, None]
    assert o.failed("m", 1, (1, 2)) is not None
    assert not o.replicas or 2 not in o.replicas


def test_each_ejection_in_a_row_is_longer_up_to_the_most() -> None:
    o, clock = detector()
    lengths = []
    for _ in range(5):
        ejection = fail(o, 1, 3)[-1]
        assert ejection is not None
        lengths.append(ejection.seconds)
        clock.now = ejection.until  # back, and failing again at once
    assert lengths == [10.0, 20.0, 30.0, 35.0, 35.0]


def test_time_in_routing_forgives_a_step_per_base() -> None:
    o, clock = detector()
    assert fail(o, 1, 3)[-1].seconds == 10
    clock.now += 10
    assert fail(o, 1, 3)[-1].seconds == 20
    clock.now += 20 + 10  # back, then 10 s in routing: one step forgiven
    assert fail(o, 1, 3)[-1].seconds == 20
    clock.now += 20 + 100  # a long while in routing: all forgiven
    assert fail(o, 1, 3)[-1].seconds == 10


def test_a_failure_of_a_replica_already_out_changes_nothing() -> None:
    """A request sent to it before it was ejected fails after: not a second ejection."""
    o, clock = detector()
    first = fail(o, 1, 3)[-1]
    assert fail(o, 1, 5) == [None] * 5
    assert o.current() == {"m": {1: first.until}}


def test_one_replica_is_never_ejected() -> None:
    o, _ = detector()
    assert fail(o, 1, 20, pool=(1,)) == [None] * 20
    assert o.excluded((1,)) == frozenset()


def test_at_most_the_share_and_never_all() -> None:
    o, _ = detector()
    assert fail(o, 1, 3)[-1] is not None
    # The other of two fails as often: it stays in, and is tried.
    assert fail(o, 2, 10) == [None] * 10
    assert o.excluded((1, 2)) == {1}
    # Of ten replicas, half may be out.
    o, _ = detector()
    pool = tuple(range(10))
    out = [r for r in pool if fail(o, r, 3, pool)[-1] is not None]
    assert out == [0, 1, 2, 3, 4]
    assert o.excluded(pool) == set(out)


def test_a_pool_that_shrinks_keeps_one_in() -> None:
    """Two of four out; the pool is now the two out and one more: one of them comes back
    at once (the one due soonest)."""
    o, clock = detector()
    pool = (1, 2, 3, 4)
    fail(o, 1, 3, pool)
    clock.now += 1
    fail(o, 2, 3, pool)
    assert o.excluded(pool) == {1, 2}
    assert o.excluded((1, 2, 3)) == {2}
    assert o.excluded((1, 2)) == {2}


def test_after_zero_never_ejects() -> None:
    o, _ = detector(Rules(after=0))
    assert fail(o, 1, 50) == [None] * 50


def test_memory_is_bounded() -> None:
    o, _ = detector()
    for replica in range(MAX_TRACKED + 500):
        o.failed("m", replica, (replica, -1))
    assert len(o.replicas) <= MAX_TRACKED


@given(st.integers(0, 500), st.integers(0, 100))
def test_allowed_bounds(replicas: int, percent: int) -> None:
    n = allowed(replicas, percent)
    if replicas <= 1:
        assert n == 0
    else:
        assert 1 <= n <= replicas - 1
        assert n == max(1, min(replicas - 1, replicas * percent // 100))


@given(st.integers(1, 100), st.floats(0.1, 100), st.floats(0.1, 1000))
def test_ejection_length_grows_and_is_capped(level: int, base: float, most: float) -> None:
    rules = Rules(base=base, most=most)
    assert ejection_seconds(level, rules) <= most
    assert ejection_seconds(level + 1, rules) >= ejection_seconds(level, rules)
    assert ejection_seconds(level, rules) == min(most, base * level)


# A sequence of what can happen: an attempt fails or succeeds on a replica, time passes,
# routing asks; run against the rules that must hold throughout.
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("fail"), st.integers(0, 5)),
        st.tuples(st.just("ok"), st.integers(0, 5)),
        st.tuples(st.just("wait"), st.floats(0, 50)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(
    EVENTS,
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 100),
    st.floats(0.5, 20),
    st.floats(0.5, 100),
)
def test_whatever_happens(
    events: list, size: int, after: int, percent: int, base: float, most: float
) -> None:
    rules = Rules(after=after, base=base, most=most, max_percent=percent)
    o, clock = detector(rules)
    pool = tuple(range(size))
    streak = dict.fromkeys(pool, 0)  # failures in a row while in routing (the reference)
    for kind, value in events:
        if kind == "wait":
            clock.now += value
        elif value in pool:
            before = o.excluded(pool)
            if kind == "ok":
                o.succeeded(value)
                if value not in before:
                    streak[value] = 0
            else:
                ejection = o.failed("m", value, pool)
                if value not in before:
                    streak[value] += 1
                if ejection is not None:
                    # Only after `after` failures in a row, for within the bounds.
                    assert value not in before
                    assert streak[value] >= after
                    assert 0 < ejection.seconds <= max(base, min(most, base * ejection.level))
                    assert ejection.until == clock.now + ejection.seconds
                    streak[value] = 0
                elif value not in before and streak[value] >= after and size > 1:
                    # Not ejected though due: only because as many are out as may be.
                    others = o.excluded(pool) - {value}
                    assert len(others) >= allowed(size, percent)
        out = o.excluded(pool)
        assert len(out) <= allowed(size, percent)
        assert len(out) < size  # never all of a model
        assert o.out() == o.current()  # the read another thread makes says the same
        for until in o.current().get("m", {}).values():
            assert until > clock.now
            assert until - clock.now <= max(base, most) + 1e-6
        for replica in out:
            assert o.ejected[replica].until > clock.now
    # Left alone for the longest ejection, every replica is back.
    clock.now += max(base, most) + 1
    assert o.excluded(pool) == frozenset()
    assert o.current() == {}
