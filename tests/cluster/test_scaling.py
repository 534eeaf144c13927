"""Load scaling's pure core (cluster.scaling): bounds, windows, one step down at a time."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.scaling import (
    DEFAULT_CAPACITY,
    FIGURES_EVERY,
    MIN_SAMPLES,
    Load,
    Memory,
    capacity_of,
    decide,
    quantile_ms,
    words_of,
    worth_pushing,
)

UP, DOWN = 10.0, 60.0


def step(memory: Memory, load: Load, now: float, **kw: object) -> object:
    args = {"lo": 1, "hi": 4, "ready": memory.target or 1, "capacity": 4, "slo_ttft_ms": 0.0,
            "now": now, "up_after": UP, "down_after": DOWN} | kw  # fmt: skip
    return decide(memory, load, **args)  # type: ignore[arg-type]


def test_up_after_the_window_to_what_the_load_needs() -> None:
    mem = Memory(target=2)
    d = step(mem, Load(in_flight=14), 100.0, ready=2)
    assert d.target == 2 and d.step == ""
    assert "scaling up if it holds 10 s more" in d.reason
    d = step(d.memory, Load(in_flight=14), 105.0, ready=2)
    assert d.target == 2
    d = step(d.memory, Load(in_flight=14), 110.0, ready=2)
    assert (d.target, d.step) == (4, "up")
    assert d.reason == "scaled up to 4: 14 in flight over 2 replicas, capacity 4 each"


def test_a_burst_shorter_than_the_window_adds_nothing() -> None:
    d = step(Memory(target=1), Load(in_flight=9), 0.0)
    d = step(d.memory, Load(in_flight=9), 9.0)
    d = step(d.memory, Load(in_flight=2), 9.5)
    assert d.target == 1 and d.memory.over_since is None
    d = step(d.memory, Load(in_flight=9), 12.0)
    assert d.target == 1  # a new burst starts its own window


def test_holding_at_max_says_so() -> None:
    d = step(Memory(target=4), Load(in_flight=30), 0.0, ready=4)
    assert d.target == 4
    assert d.reason == "holding at max 4: 30 in flight over 4 replicas, capacity 4 each"
    slow = Load(in_flight=4, ttft_p99_ms=2300, samples=50)
    d = step(Memory(target=4), slow, 0.0, ready=4, slo_ttft_ms=1000)
    assert d.reason == "holding at max 4: TTFT p99 2.3 s over the 1 s slo"


def test_slow_scales_up_by_one_once_every_replica_is_ready() -> None:
    slow = Load(in_flight=3, ttft_p99_ms=3000, samples=MIN_SAMPLES)
    d = step(Memory(target=2), slow, 0.0, ready=1, slo_ttft_ms=1000)
    assert d.memory.over_since is None  # one still starting: not yet
    d = step(Memory(target=2), slow, 0.0, ready=2, slo_ttft_ms=1000)
    d = step(d.memory, slow, UP, ready=2, slo_ttft_ms=1000)
    assert (d.target, d.step) == (3, "up")
    assert "TTFT p99 3 s over the 1 s slo" in d.reason
    few = Load(in_flight=3, ttft_p99_ms=3000, samples=MIN_SAMPLES - 1)
    d = step(Memory(target=2), few, 0.0, ready=2, slo_ttft_ms=1000)
    assert d.memory.over_since is None  # too few requests to say


def test_down_one_at_a_time_each_after_its_own_quiet_window() -> None:
    d = step(Memory(target=3), Load(in_flight=1), 0.0, ready=3)
    assert d.target == 3 and "scaling down if quiet 60 s more" in d.reason
    d = step(d.memory, Load(in_flight=1), DOWN, ready=3)
    assert (d.target, d.step) == (2, "down")
    d = step(d.memory, Load(in_flight=1), DOWN + 1, ready=2)
    assert d.target == 2
    d = step(d.memory, Load(in_flight=1), 2 * DOWN, ready=2)
    assert (d.target, d.step) == (1, "down")
    d = step(d.memory, Load(), 10 * DOWN, ready=1)
    assert d.target == 1 and d.reason == "at min 1: no load"


def test_quiet_broken_starts_again() -> None:
    d = step(Memory(target=2), Load(in_flight=1), 0.0, ready=2)
    d = step(d.memory, Load(in_flight=6), 30.0, ready=2)  # fits 2, not 1: not quiet
    d = step(d.memory, Load(in_flight=1), 40.0, ready=2)
    d = step(d.memory, Load(in_flight=1), 70.0, ready=2)
    assert d.target == 2
    d = step(d.memory, Load(in_flight=1), 100.0, ready=2)
    assert d.target == 1


def test_waiting_requests_count() -> None:
    d = step(Memory(target=1), Load(waiting=9), 0.0, up_after=0.0)
    assert d.target == 3 and "0 in flight and 9 waiting" in d.reason


def test_a_target_outside_new_bounds_is_brought_inside() -> None:
    d = step(Memory(target=6), Load(in_flight=30), 0.0, hi=3, ready=6)
    assert d.target == 3
    d = step(Memory(target=1), Load(), 0.0, lo=2, hi=5, ready=1)
    assert d.target == 2 and "was 1" in d.reason


def test_a_closing_window_drops_what_only_its_min_held() -> None:
    held = Memory(target=3, lo=3)
    d = step(held, Load(in_flight=5), 0.0, lo=1, hi=4, ready=3)
    assert d.target == 2 and "(was 3; min 1, max 4 now)" in d.reason
    by_load = Memory(target=4, lo=3)  # one over the old min: the load's, goes slowly
    d = step(by_load, Load(in_flight=1), 0.0, lo=1, hi=4, ready=4)
    assert d.target == 4


def test_capacity_of_profiles() -> None:
    profiles = [("big", "sim", 6), ("small", "sim", 2), ("new", "vllm", 0)]
    assert capacity_of(profiles, ["big", "small"]) == (4, True)
    assert capacity_of(profiles, []) == (6, True)
    assert capacity_of(profiles, ["new"]) == (DEFAULT_CAPACITY["vllm"], False)
    assert capacity_of([], []) == (4, False)


def test_quantile() -> None:
    assert quantile_ms([10, 20], [0, 0, 0], 0.99) is None
    assert quantile_ms([10, 20], [50, 49, 1], 0.99) == 20
    assert quantile_ms([10, 20], [0, 0, 3], 0.5) == math.inf


loads = st.builds(
    Load,
    in_flight=st.integers(0, 200),
    waiting=st.integers(0, 50),
    ttft_p99_ms=st.none() | st.floats(0, 1e5),
    samples=st.integers(0, 100),
)


@settings(max_examples=300, deadline=None)
@given(
    lo=st.integers(0, 5),
    span=st.integers(0, 6),
    capacity=st.integers(0, 16),
    slo=st.sampled_from([0.0, 500.0, 2000.0]),
    ticks=st.lists(st.tuples(loads, st.floats(0, 30), st.integers(0, 12)), max_size=25),
    start=st.none() | st.integers(0, 15),
)
def test_never_outside_bounds_and_down_one_at_a_time(
    lo: int, span: int, capacity: int, slo: float, ticks: list, start: int | None
) -> None:
    hi = lo + span
    mem = Memory(target=start)
    now = 0.0
    for load, dt, ready in ticks:
        before = mem.target
        now += dt
        d = decide(mem, load, lo=lo, hi=hi, ready=ready, capacity=capacity, slo_ttft_ms=slo,
                   now=now, up_after=UP, down_after=DOWN)  # fmt: skip
        assert lo <= d.target <= hi
        assert d.memory.target == d.target
        assert d.reason
        held = lo if before is None else min(max(before, lo), hi)
        if d.step == "down":
            assert d.target == held - 1
            assert load.demand <= max(1, capacity) * d.target
        elif d.step == "up":
            assert d.target > held
        else:
            assert d.target == held
        mem = d.memory


@settings(max_examples=200, deadline=None)
@given(
    demand=st.integers(0, 200),
    capacity=st.integers(1, 16),
    hi=st.integers(1, 10),
)
def test_a_load_held_past_the_window_gets_what_it_needs(
    demand: int, capacity: int, hi: int
) -> None:
    mem = Memory(target=1)
    load = Load(in_flight=demand)
    d = decide(mem, load, lo=1, hi=hi, ready=1, capacity=capacity, slo_ttft_ms=0,
               now=0.0, up_after=UP, down_after=DOWN)  # fmt: skip
    d = decide(d.memory, load, lo=1, hi=hi, ready=1, capacity=capacity, slo_ttft_ms=0,
               now=UP, up_after=UP, down_after=DOWN)  # fmt: skip
    assert d.target == min(hi, max(1, math.ceil(demand / capacity)))


def test_a_reason_is_pushed_when_its_target_or_words_change_and_its_figures_now_and_then() -> None:
    a = "at 2, scaling down if quiet 50 s more (of 60 s): 3.8 in flight over 2 replicas"
    b = "at 2, scaling down if quiet 49 s more (of 60 s): 3.6 in flight over 2 replicas"
    assert words_of(a) == words_of(b)
    assert worth_pushing(None, (2, a), None, 0.0)  # nothing kept: at once
    assert worth_pushing((2, a), (3, a), 0.0, 0.5)  # the target moved
    assert worth_pushing((2, a), (2, "holding at max 2: 9 in flight"), 0.0, 0.5)  # words
    assert not worth_pushing((2, a), (2, a), 0.0, 100.0)  # nothing new
    assert not worth_pushing((2, a), (2, b), 0.0, FIGURES_EVERY - 0.1)  # figures: not yet
    assert worth_pushing((2, a), (2, b), 0.0, FIGURES_EVERY)


@settings(max_examples=200, deadline=None)
@given(
    figures=st.lists(st.floats(0, 50, allow_nan=False), min_size=2, max_size=200),
    tick=st.floats(0.1, 3.0),
)
def test_figures_alone_are_pushed_at_most_every_few_seconds(
    figures: list[float], tick: float
) -> None:
    """A model under load whose figures move every tick: pushes are FIGURES_EVERY apart."""
    reason = f"steady at 2: {figures[0]:.1f} in flight over 2 replicas"
    pushes = [0.0]
    for n, f in enumerate(figures[1:], start=1):
        now = n * tick
        new = f"steady at 2: {f:.1f} in flight over 2 replicas"
        if worth_pushing((2, reason), (2, new), pushes[-1], now):
            pushes.append(now)
        reason = new
    assert all(b - a >= FIGURES_EVERY for a, b in zip(pushes, pushes[1:], strict=False))
