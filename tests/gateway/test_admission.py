"""gateway.admission: the gate by priority band, over plain data and a clock the test
moves (hypothesis for the rules that hold whatever the figures)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from gateway.admission import (
    BANDS,
    Admission,
    Counts,
    Decision,
    Gate,
    Listener,
    decide,
    held_for,
    reason,
)
from gateway.observe import Done

WINDOW = 10.0
p99s = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False))
slos = st.sampled_from([0.0, 100.0, 500.0, 1000.0])
bands = st.sampled_from(BANDS)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admission(**kw: object) -> tuple[Admission, Clock]:
    clock = Clock()
    return Admission(window=WINDOW, clock=clock, wall=clock, counts=Counts(), **kw), clock


@given(st.lists(st.tuples(p99s, slos, st.floats(0, 30)), max_size=40), bands)
def test_the_top_band_is_always_admitted_and_a_held_band_holds_every_band_below(
    steps: list[tuple[float | None, float, float]], band: str
) -> None:
    gate, now = Gate(), 0.0
    for p99, slo, dt in steps:
        now += dt
        gate, decision = decide(gate, band, p99, slo, now, WINDOW)
        assert 0 <= gate.level <= 2
        assert not gate.holds("high")
        held = [b for b in BANDS if gate.holds(b)]
        assert held == list(BANDS[len(BANDS) - len(held) :])  # the lowest bands, in order
        assert decision.admit == (band not in held)


@given(st.lists(st.tuples(p99s, st.floats(0, 30)), max_size=40), slos, p99s)
def test_within_the_slo_the_gate_opens_at_once_for_every_band(
    steps: list[tuple[float | None, float]], slo: float, recovered: float | None
) -> None:
    gate, now = Gate(), 0.0
    for p99, dt in steps:
        now += dt
        gate = gate.step(p99, slo, now, WINDOW)
    if recovered is not None and slo and recovered > slo:
        recovered = slo
    gate = gate.step(recovered, slo, now + 1, WINDOW)
    assert gate.level == 0
    assert all(not gate.holds(b) for b in BANDS)


@given(st.lists(st.floats(0, 30), min_size=1, max_size=40))
def test_past_the_slo_low_is_held_first_and_normal_only_a_window_later(gaps: list[float]) -> None:
    gate, now = Gate(), 0.0
    gate = gate.step(2000.0, 1000.0, now, WINDOW)
    assert (gate.level, gate.holds("low"), gate.holds("normal")) == (1, True, False)
    start = now
    for dt in gaps:
        now += dt
        gate = gate.step(2000.0, 1000.0, now, WINDOW)
        assert gate.holds("low")
        assert gate.holds("normal") == (now - start >= WINDOW)


def test_no_slo_or_no_sample_admits_everyone() -> None:
    a, _ = admission()
    assert a.check("m", "low", 0) == Decision(True, 0, None, 0.0)
    assert a.check("m", "low", 1000).admit  # nothing seen yet


def test_a_slow_window_holds_low_then_normal_and_opens_a_window_after_the_load_falls() -> None:
    a, clock = admission()
    for _ in range(50):
        a.record("m", 3.0)  # 3 s to the first token, slo 1 s
    assert a.p99("m") == 3000.0
    assert a.check("m", "high", 1000).admit
    assert not a.check("m", "low", 1000).admit
    assert a.check("m", "normal", 1000).admit
    clock.now += WINDOW
    a.record("m", 3.0)
    assert not a.check("m", "normal", 1000).admit
    assert a.check("m", "high", 1000).admit
    # The load falls: fast answers only from now; the slow seconds age out of the window.
    fell = clock.now
    while not a.check("m", "low", 1000).admit:
        a.record("m", 0.05)
        clock.now += 0.5
        assert clock.now - fell <= WINDOW + 1, "held longer than a window after the load fell"
    assert a.check("m", "normal", 1000).admit and a.level("m") == 0


def test_another_models_figures_hold_nothing_here() -> None:
    a, _ = admission()
    for _ in range(10):
        a.record("slow", 5.0)
    assert not a.check("slow", "low", 1000).admit
    assert a.check("fast", "low", 1000).admit


def test_a_held_request_waits_then_is_refused_and_counted() -> None:
    a, clock = admission(queue=0.3)
    for _ in range(10):
        a.record("m", 5.0)

    async def go() -> tuple[Decision, Decision]:
        held = await a.admit("m", "low", 1000)
        top = await a.admit("m", "high", 1000)
        return held, top

    held, top = asyncio.run(go())
    assert not held.admit and top.admit
    taken = a.counts.take(int(clock.now) + 1)
    assert taken == {int(clock.now): {"m": {"low": [0, 1], "high": [1, 0]}}}
    text = reason("low", "m", held, WINDOW)
    assert "'low' band" in text and "TTFT p99 5000 ms" in text and "slo 1000 ms" in text


def test_a_held_request_goes_in_when_the_gate_opens_while_it_waits() -> None:
    clock = Clock()
    a = Admission(window=1.0, queue=5.0, clock=clock, wall=clock, counts=Counts())
    a.record("m", 5.0)

    async def go() -> Decision:
        waiter = asyncio.create_task(a.admit("m", "low", 1000))
        await asyncio.sleep(0.15)
        assert not waiter.done()
        clock.now += 2  # the slow second leaves the window
        a.record("m", 0.01)
        return await asyncio.wait_for(waiter, 2.0)

    assert asyncio.run(go()).admit


def test_the_queue_is_bounded() -> None:
    a, _ = admission(queue=5.0, queue_max=2)
    a.record("m", 5.0)

    async def go() -> list[bool]:
        waiting = [asyncio.create_task(a.admit("m", "low", 1000)) for _ in range(2)]
        await asyncio.sleep(0.05)
        third = await asyncio.wait_for(a.admit("m", "low", 1000), 1.0)  # refused at once
        still = [not w.done() for w in waiting]  # the two queued wait on
        for w in waiting:
            w.cancel()
        return [third.admit, *still]

    assert asyncio.run(go()) == [False, True, True]


def test_the_listener_takes_the_wait_at_the_door_off_the_ttft() -> None:
    a, _ = admission()
    listener = Listener(a)

    def done(ttft: float | None, status: int = 200) -> Done:
        return Done(model="m", status=status, owner="", key="k", seconds=1.0, ttft=ttft,
                    tokens_in=1, tokens_out=1, replica=1, stream=True)  # fmt: skip

    held_for.set(2.95)
    listener.request(done(3.0))  # 50 ms at the engine
    listener.request(done(None))
    listener.request(done(9.0, status=500))
    assert a.p99("m") == 50.0
