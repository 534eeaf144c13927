"""gateway.path.admission: the gate by priority band, over plain data and a clock the test
moves (hypothesis for the rules that hold whatever the figures)."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.path.admission import (
    BANDS,
    BATCH,
    BETA,
    HEADROOM,
    MARGIN,
    QUIET,
    RECENT,
    STEP,
    Admission,
    Counts,
    Decision,
    Gate,
    Listener,
    Reading,
    decide,
    held_for,
    reason,
)
from gateway.records.observe import Done

WINDOW = 10.0
SLO = 1000.0
ms = st.one_of(st.none(), st.floats(min_value=0, max_value=1e5, allow_nan=False))
bands = st.sampled_from(BANDS)
recents = st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False), max_size=RECENT)
idles = st.sampled_from([0.0, 0.5, STEP, 100.0])
batch_idles = st.sampled_from([0.0, 0.5, STEP, 5.0, WINDOW, float("inf")])
# First-token times about the thresholds (HEADROOM, QUIET, the slo), few bits each, so
# a long history stays within what hypothesis draws at once.
marks = st.sampled_from([0.0, 100.0, 499.0, 500.0, 799.0, 800.0, 1000.0, 1001.0, 5000.0])
readings = st.builds(Reading, st.one_of(st.none(), marks),
                     st.lists(marks, max_size=RECENT).map(tuple), st.sampled_from([0.0, 100.0, SLO]),
                     st.integers(0, 20), idles, st.integers(0, 4), batch_idles)  # fmt: skip
# A loaded machine can stall one draw of a long history past hypothesis's bound (each is
# small: a few marks a step), as the catalog's schedule tests allow too.
LOADED = settings(suppress_health_check=[HealthCheck.too_slow])
steps = st.lists(st.tuples(readings, bands, st.integers(0, 5), st.floats(0, 30)), max_size=40)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def admission(**kw: object) -> tuple[Admission, Clock]:
    clock = Clock()
    return Admission(window=WINDOW, clock=clock, wall=clock, counts=Counts(), **kw), clock


@LOADED
@given(steps)
def test_the_top_band_is_never_held_and_a_lower_band_never_past_its_allowance(
    history: list[tuple[Reading, str, int, float]],
) -> None:
    gate, now = Gate(), 0.0
    for r, band, ahead, dt in history:
        now += dt
        before = gate
        gate, decision = decide(gate, band, r, now, WINDOW, ahead)
        if band == "high":
            assert decision.admit
        if r.over and not r.batch_in_window:
            assert gate.limit is not None  # past the slo: the lower bands are capped
        if before.limit is None and gate.limit is not None:
            # The batch yielded entirely first: no line of it here for a step.
            assert not r.batch and r.batch_idle >= STEP
        if gate.limit is None and band in ("normal", "low"):
            assert decision.admit  # a live band is held only once it has an allowance
        if decision.admit and band in ("normal", "low") and gate.limit is not None:
            assert r.lower + ahead < gate.limit
        if band == BATCH and decision.admit:
            # Only in what live traffic leaves: no live cap, none of it waiting.
            assert gate.limit is None and not ahead
            assert gate.batch is None or r.batch < gate.batch
        if gate.limit is not None:
            assert gate.batch == 0  # the batch is held while a live band is capped
        assert decision.limit == gate.allowance(band)
        assert gate.limit is None or gate.limit >= 0
        assert gate.batch is None or gate.batch >= 0


@LOADED
@given(steps, st.lists(st.tuples(ms, st.integers(0, 20), st.floats(0.01, 3)), min_size=1,
                       max_size=40))  # fmt: skip
def test_a_window_within_the_slo_and_no_lower_band_kept_waiting_opens_the_gate(
    history: list[tuple[Reading, str, int, float]], calm: list[tuple[float | None, int, float]]
) -> None:
    gate, now = Gate(), 0.0
    for r, band, ahead, dt in history:
        now += dt
        gate, _ = decide(gate, band, r, now, WINDOW, ahead)
    start = now
    for p99, lower, dt in calm:  # only the top band asks; the p99 within the slo
        now += dt
        clean = None if p99 is None else min(p99, SLO)
        gate, decision = decide(gate, "high", Reading(clean, (), SLO, lower), now, WINDOW)
        assert decision.admit
    now = max(now, start + WINDOW + 1e-9 * start)  # (a float sum of the gaps)
    gate, _ = decide(gate, "high", Reading(SLO, (), SLO), now, WINDOW)
    assert gate.limit is None
    assert decide(gate, "low", Reading(SLO, (), SLO, 50), now, WINDOW)[1].admit
    assert decide(gate, "normal", Reading(SLO, (), SLO, 50), now, WINDOW)[1].admit


@given(st.integers(0, 30), recents, st.integers(0, 30), idles)
def test_the_allowance_halves_past_the_slo_grows_by_one_with_headroom_and_waits_between(
    limit: int, recent: list[float], lower: int, idle: float
) -> None:
    gate = Gate(limit, pressed=100.0, stepped=100.0)
    r = Reading(SLO * 2, tuple(recent), SLO, lower, idle)
    soon, _ = decide(gate, "low", r, 100.0 + STEP / 2, WINDOW)
    assert soon.limit == limit  # at most one change a step
    later, _ = decide(gate, "low", r, 100.0 + STEP, WINDOW)
    wanting = lower >= limit
    if wanting and idle >= STEP:
        assert later.limit == limit + 1  # nothing in flight here for a step
    elif recent and max(recent) > SLO:
        assert later.limit == int(limit * BETA)
    elif wanting and len(recent) == RECENT and max(recent) < HEADROOM * SLO:
        assert later.limit == limit + 1
    else:
        assert later.limit == limit  # the dead band, no one wanting, or too little heard


@given(st.one_of(st.none(), st.integers(0, 30)), recents, st.integers(0, 8), idles,
       st.booleans())  # fmt: skip
def test_the_batch_allowance_yields_at_the_slo_halves_past_quiet_and_grows_when_quiet(
    batch: int | None, recent: list[float], in_flight: int, idle: float, wanting: bool
) -> None:
    gate = Gate(None, pressed=0.0, stepped=100.0, batch=batch)
    r = Reading(None, tuple(recent), SLO, 0, idle, in_flight, 0.0)
    soon, _ = decide(gate, BATCH if wanting else "high", r, 100.0 + STEP / 2, WINDOW)
    later, _ = decide(gate, BATCH if wanting else "high", r, 100.0 + STEP, WINDOW)
    wants = wanting and not gate.room(BATCH, r)
    assert soon.limit is None and later.limit is None  # live traffic is never capped here
    start = in_flight if batch is None else batch
    if not recent:
        assert soon.batch is None and later.batch is None  # no live traffic to keep fast
    elif max(recent) > SLO:
        assert soon.batch == 0 and later.batch == 0  # at once, whatever the step
    else:
        if batch is None and max(recent) >= QUIET * SLO:
            assert soon.batch == later.batch == int(start * BETA)  # an uncapped one at once
            return
        assert soon.batch == batch  # at most one change a step
        if max(recent) >= QUIET * SLO:
            assert later.batch == int(start * BETA)
        elif wants and (len(recent) == RECENT or idle >= STEP):
            assert later.batch == start + 1
        else:
            assert later.batch == start


@given(st.one_of(st.none(), st.integers(0, 30)), st.lists(marks, min_size=1, max_size=RECENT),
       st.integers(0, 8), idles, st.booleans(), marks, marks, st.sampled_from([0.0, MARGIN, 0.5]),
       st.floats(0, 3 * STEP))  # fmt: skip
def test_the_batch_allowance_never_grows_while_live_first_tokens_are_past_their_base(
    batch: int | None, recent: list[float], in_flight: int, idle: float, wanting: bool,
    base: float, live: float, margin: float, later: float,
) -> None:  # fmt: skip
    gate = Gate(None, pressed=0.0, stepped=100.0, batch=batch)
    r = Reading(None, tuple(recent), SLO, 0, idle, in_flight, 0.0, base, live, margin)
    after, _ = decide(gate, BATCH if wanting else "high", r, 100.0 + later, WINDOW)
    assert after.limit is None  # live traffic is never capped here
    start = in_flight if batch is None else batch
    if live > base * (1 + margin):
        assert after.batch is not None and after.batch <= start
    elif max(recent) <= SLO and max(recent) < QUIET * SLO and later >= STEP and wanting \
            and not gate.room(BATCH, r):  # fmt: skip
        assert after.batch == start + 1  # within the base while a line waits: one more


gates = st.builds(Gate, st.one_of(st.none(), st.integers(0, 10)), st.floats(0, 30),
                  st.floats(0, 30), st.one_of(st.none(), st.integers(0, 10)))  # fmt: skip
live_bands = st.sampled_from(["normal", "low"])


@LOADED
@given(gates, readings, live_bands, st.integers(0, 5), st.floats(0, 40), st.integers(1, 8))
def test_batch_lines_in_flight_never_hold_back_a_live_band(
    gate: Gate, r: Reading, band: str, ahead: int, now: float, lines: int
) -> None:
    """Whatever the gate and the figures, a live lower band (``low`` as much as ``normal``)
    admitted with no batch line in flight is admitted with batch lines in flight (the
    model then busy with them: never idle, though nothing live runs)."""
    alone = r._replace(batch=0, live_idle=r.idle)
    beside = r._replace(batch=lines, batch_idle=0.0, idle=0.0, live_idle=r.idle)
    if decide(gate, band, alone, now, WINDOW, ahead)[1].admit:
        assert decide(gate, band, beside, now, WINDOW, ahead)[1].admit


@LOADED
@given(gates, readings, st.integers(1, 5), st.floats(0, 40))
def test_a_batch_line_never_goes_in_while_a_live_band_waits(
    gate: Gate, r: Reading, ahead: int, now: float
) -> None:
    """A ``normal`` or ``low`` request waiting at the door (``ahead``) keeps every batch
    line out, whatever the batch's own allowance."""
    assert not decide(gate, BATCH, r, now, WINDOW, ahead)[1].admit


def test_a_batch_that_slows_live_traffic_past_its_base_gives_way_well_inside_the_slo() -> None:
    """Live first tokens at 100 ms alone; beside a batch line at 200 ms, a fifth of the
    slo: the batch's allowance halves (as it would not by the slo alone), and grows again
    once live traffic is back at its base."""
    a, clock = admission()
    for _ in range(6):
        a.record("m", 0.1)
        clock.now += 0.1
    a._take("m", BATCH)  # a batch line in flight
    assert a.check("m", BATCH, SLO).limit == 1  # capped at what is in flight
    for _ in range(5):
        clock.now += 0.1
        a.record("m", 0.2)  # live first tokens beside it: twice as slow, still 20 % of the slo
    assert a.state()["m"]["batch_base_ms"] == 100.0  # measured without the batch alone
    clock.now += STEP
    held = a.check("m", BATCH, SLO)
    assert not held.admit and held.limit == 0  # past base × (1 + margin): it gives way
    a.release("m", False, True)
    clock.now += 0.5
    for _ in range(9):
        clock.now += 0.1
        a.record("m", 0.1)  # live traffic back at its base
    clock.now += STEP
    d = a.check("m", BATCH, SLO)
    assert d.admit and d.limit == 1  # one more a step while live stays within its base


def test_the_base_is_the_lowest_minute_of_the_last_ten_and_outlives_a_batch_that_never_stops() -> (
    None
):
    a, clock = admission()
    clock.now = 60_000.0  # a minute's start
    for ms in (0.1, 0.2):  # a minute at 100 ms, then one at 200 ms
        for _ in range(5):
            a.record("m", ms)
            clock.now += 1
        clock.now += 55
    assert a.state()["m"]["batch_base_ms"] == 100.0
    a._take("m", BATCH)  # then a batch line in flight for good: nothing more to measure
    clock.now += 8 * 60
    a.record("m", 0.5)
    assert a.state()["m"]["batch_base_ms"] == 200.0  # the 100 ms minute is ten ago
    clock.now += 60 * 60
    a.record("m", 0.5)
    assert a.state()["m"]["batch_base_ms"] == 200.0  # the newest there was, not none


def test_past_the_slo_beside_a_batch_the_batch_yields_before_the_live_bands_are_capped() -> None:
    r = Reading(2000.0, (2000.0,), SLO, lower=4, batch=2, batch_idle=0.0)
    gate, d = decide(Gate(), "normal", r, 0.0, WINDOW)
    assert d.admit and gate.limit is None and gate.batch == 0
    assert not decide(gate, BATCH, r, 0.1, WINDOW)[1].admit  # the batch is held
    # The batch's lines end; a step on, first tokens are fast again: nothing capped.
    fast = Reading(2000.0, (80.0,) * RECENT, SLO, lower=4, batch=0, batch_idle=STEP)
    gate, d = decide(gate, "low", fast, STEP + 0.1, WINDOW)
    assert d.admit and gate.limit is None
    # Still slow a step after the batch's last line: now the live lower bands are capped.
    slow = fast._replace(recent=(2000.0,))
    gate, d = decide(gate, "low", slow, 2 * STEP + 0.2, WINDOW)
    assert gate.limit == 2 and not d.admit


def test_past_the_slo_the_allowance_starts_at_half_those_in_flight() -> None:
    gate, d = decide(Gate(), "low", Reading(2000.0, (), SLO, lower=5), 0.0, WINDOW)
    assert gate.limit == 2 and not d.admit  # 5 in flight of an allowance of 2
    gate, d = decide(Gate(), "low", Reading(2000.0, (), SLO, lower=1), 0.0, WINDOW)
    assert gate.limit == 0 and not d.admit


def test_normal_goes_before_low_within_the_allowance() -> None:
    gate = Gate(limit=2, pressed=0.0, stepped=0.0)
    r = Reading(500.0, (700.0,), SLO, lower=1)
    assert decide(gate, "normal", r, 0.5, WINDOW, ahead=0)[1].admit
    assert not decide(gate, "low", r, 0.5, WINDOW, ahead=1)[1].admit  # a normal waits
    assert decide(gate, "low", r, 0.5, WINDOW, ahead=0)[1].admit


def test_no_slo_or_no_sample_admits_everyone() -> None:
    a, _ = admission()
    assert a.check("m", "low", 0) == Decision(True, None, None, 0.0)
    assert a.check("m", "low", 1000).admit  # nothing seen yet


def overload(a: Admission, clock: Clock, seconds: float) -> list[float]:
    """A model whose TTFT is 200 ms per request in flight, offered a high band that keeps
    two requests in flight and a low band that keeps five asking; slo 1000 ms. Each tick
    of 0.25 s the requests in flight give their first token and end; the high band's
    TTFTs are returned."""
    highs: list[float] = []
    end = clock.now + seconds
    while clock.now < end:
        admitted = []
        for band in ["high"] * 2 + ["low"] * 5:
            if a.check("m", band, 1000).admit:
                a._take("m", band)
                admitted.append(band)
        ttft = 0.2 * len(admitted)
        for band in admitted:
            a.record("m", ttft)
            a.release("m", band != "high")
            if band == "high":
                highs.append(ttft)
        clock.now += 0.25
    return highs


def test_under_a_sustained_overload_the_top_band_keeps_its_slo_with_no_flapping() -> None:
    a, clock = admission()
    first = overload(a, clock, 1.0)
    assert max(first) > 1.0  # the overload: everyone in, 1.4 s
    assert a.limit("m") is not None
    steady = overload(a, clock, 5 * WINDOW)
    assert max(steady) <= 1.0, max(steady)  # five windows on, never past it again
    # The low band got what fits: 2 high + 3 low in flight is 1.0 s, within the slo.
    assert a.limit("m") is not None and a.limit("m") <= 3


def test_both_bands_back_within_a_window_after_the_load_falls() -> None:
    a, clock = admission()
    for _ in range(50):
        a.record("m", 3.0)  # 3 s to the first token, slo 1 s
    assert a.p99("m") == 3000.0
    assert a.check("m", "high", 1000).admit
    assert not a.check("m", "low", 1000).admit and a.limit("m") == 0
    # The load falls: a fast answer a second from the top band; the low band asks too.
    fell = clock.now
    while not a.check("m", "low", 1000).admit:
        a.record("m", 0.05)
        clock.now += 1.0
        assert clock.now - fell <= RECENT + STEP + 1, "held long after the load fell"
    while a.limit("m") is not None:
        a.check("m", "high", 1000)
        clock.now += 1.0
        assert clock.now - fell <= 2 * WINDOW + 1, "still capped long after the load fell"


def test_with_nothing_in_flight_for_a_step_the_allowance_grows() -> None:
    a, clock = admission()
    for _ in range(5):
        a.record("m", 3.0)
    a._take("m", "high")
    assert not a.check("m", "low", 1000).admit
    clock.now += 5 * STEP
    assert not a.check("m", "low", 1000).admit  # the top band is in flight: no room
    a.release("m", False)
    clock.now += STEP / 2
    assert not a.check("m", "low", 1000).admit  # a gap between two of its requests
    clock.now += STEP / 2
    assert a.check("m", "low", 1000).admit  # nothing in flight here for a step


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
    assert "at most 0 in flight" in text


def test_a_held_request_goes_in_when_a_lower_one_ends_while_it_waits() -> None:
    clock = Clock()
    a = Admission(window=WINDOW, queue=5.0, clock=clock, wall=clock, counts=Counts())
    a.record("m", 0.6)

    async def go() -> Decision:
        for _ in range(2):
            a._take("m", "low")
        a.record("m", 5.0)  # past the slo: an allowance of one, two in flight
        assert a.check("m", "high", 1000).admit and a.limit("m") == 1
        waiter = asyncio.create_task(a.admit("m", "low", 1000))
        await asyncio.sleep(0.15)
        assert not waiter.done()
        a.release("m", True)
        await asyncio.sleep(0.15)
        assert not waiter.done()  # one in flight of one
        a.release("m", True)
        return await asyncio.wait_for(waiter, 2.0)

    assert asyncio.run(go()).admit


def test_a_waiting_normal_request_goes_in_before_a_low_one_that_waited_first() -> None:
    """The wiring that counts the normal band's waiting requests ahead of a low one
    (``Admission._ahead`` into ``decide``): both wake when room opens, the low one first,
    and the one place goes to the normal one."""
    clock = Clock()
    a = Admission(window=WINDOW, queue=5.0, clock=clock, wall=clock, counts=Counts())
    a.record("m", 0.6)

    async def waiting(n: int) -> None:
        while a.state()["m"]["waiting"] < n:
            await asyncio.sleep(0)

    async def go() -> None:
        for _ in range(2):
            a._take("m", "low")
        a.record("m", 5.0)  # past the slo: an allowance of one, two in flight
        assert a.check("m", "high", 1000).admit and a.limit("m") == 1
        low = asyncio.create_task(a.admit("m", "low", 1000))
        await asyncio.wait_for(waiting(1), 2.0)
        normal = asyncio.create_task(a.admit("m", "normal", 1000))
        await asyncio.wait_for(waiting(2), 2.0)
        a.release("m", True)
        a.release("m", True)  # one place: both look again, the low one first
        assert (await asyncio.wait_for(normal, 2.0)).admit
        assert not low.done() and a.state()["m"]["lower"] == 1
        a.release("m", True)  # the normal one ends: now the low one
        assert (await asyncio.wait_for(low, 2.0)).admit

    asyncio.run(go())


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


def test_batch_lines_waiting_never_take_a_low_requests_place_in_the_queue() -> None:
    """The queue's bound counts live requests for a live one: with the queue full of batch
    lines waiting, a ``low`` request still waits for room (not refused at once) and goes in
    ahead of them; a further batch line is refused at once."""
    a, clock = admission(queue=5.0, queue_max=2)
    a.record("m", 5.0)  # past the slo: the live lower bands capped, the batch at 0

    async def queued(n: int) -> None:
        while a.state()["m"]["waiting"] < n:
            await asyncio.sleep(0)

    async def go() -> None:
        lines = [asyncio.create_task(a.admit("m", BATCH, 1000)) for _ in range(2)]
        await asyncio.wait_for(queued(2), 2.0)
        assert not (await asyncio.wait_for(a.admit("m", BATCH, 1000), 1.0)).admit
        low = asyncio.create_task(a.admit("m", "low", 1000))
        await asyncio.wait_for(queued(3), 2.0)  # waiting, not refused
        clock.now += STEP  # nothing live in flight for a step: room for one
        assert (await asyncio.wait_for(low, 2.0)).admit
        assert not any(line.done() for line in lines)  # the batch lines wait on
        for line in lines:
            line.cancel()

    asyncio.run(go())


def test_a_batch_line_left_in_flight_does_not_keep_the_live_allowance_from_growing() -> None:
    """Another gateway process caps the model while a batch line runs here: with nothing
    live in flight for a step, a waiting ``low`` request gets its room as it would with
    the batch line ended."""
    a, clock = admission()
    for _ in range(5):
        a.record("m", 0.6)  # within the slo, not under its headroom: no room to grow on
    a._take("m", BATCH)
    a.adopt("m", 0, clock.now, clock.now)  # capped elsewhere, at 0
    assert not a.check("m", "low", 1000).admit
    clock.now += STEP
    assert a.check("m", "low", 1000).admit


def test_the_listener_takes_the_wait_off_the_ttft_and_the_request_out_of_flight() -> None:
    a, _ = admission()
    listener = Listener(a)

    def done(ttft: float | None, status: int = 200) -> Done:
        return Done(model="m", status=status, owner="", key="k", seconds=1.0, ttft=ttft,
                    tokens_in=1, tokens_out=1, replica=1, stream=True)  # fmt: skip

    async def go() -> None:
        assert (await a.admit("m", "low", 1000)).admit
        assert a.state()["m"]["lower"] == 1 and a.state()["m"]["busy"] == 1
        held_for.set(2.95)
        listener.request(done(3.0))  # 50 ms at the engine
        assert a.state()["m"]["lower"] == 0 and a.state()["m"]["busy"] == 0

    asyncio.run(go())
    listener.request(done(None))
    listener.request(done(9.0, status=500))
    assert a.p99("m") == 50.0
