"""gateway.shared: two gateway processes' admission, outliers and judge breakers sharing
through the real Redis (the run's own), one behind a FaultProxy the test cuts.

Each side is what a ``gateway serve`` process holds (an ``Admission``, ``Outliers``, a
``Breakers``) with its own ``Shared``; the processes themselves are in
tests/e2e/faults/test_shared_processes.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
import pytest_asyncio

from gateway.path.admission import Admission, Counts
from gateway.path.outliers import Outliers, Rules
from gateway.shared import Shared
from guard import breaker
from tests.faultproxy import FaultProxy
from tests.redisserver import url as redis_url

pytestmark = pytest.mark.asyncio

URL = redis_url(14)
SLO_MS = 1000.0


@dataclass
class Side:
    admission: Admission
    outliers: Outliers
    breakers: breaker.Breakers
    shared: Shared


def _side(url: str, now: float) -> Side:
    # A clock that stands still: the gate a test sets stays as it is (no step).
    a = Admission(window=10, queue=0, clock=lambda: now, counts=Counts())
    o = Outliers(Rules(after=2, base=30))
    b = breaker.Breakers(lambda: breaker.Config(failures=2, backoff=30, max_backoff=300))
    return Side(a, o, b, Shared(url, a, o, breakers=b, timeout=0.25))


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    parts = urlsplit(URL)
    p = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 6379)).start()
    yield p
    p.heal()
    p.stop()


@pytest_asyncio.fixture
async def sides(proxy: FaultProxy) -> AsyncIterator[tuple[Side, Side]]:
    """Two processes, the second reaching Redis through ``proxy``."""
    now = time.monotonic()
    one = _side(URL, now)
    two = _side(f"redis://{proxy.address}{urlsplit(URL).path}", now)
    one.shared.start()
    two.shared.start()
    try:
        yield one, two
    finally:
        await one.shared.stop()
        await two.shared.stop()


async def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it did not happen")
        await asyncio.sleep(0.01)


def _name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def _closed(sides: tuple[Side, ...], model: str, limit: int) -> None:
    for s in sides:
        now = s.admission._clock()
        s.admission.adopt(model, limit, now, now)


async def test_two_processes_admit_a_lower_band_within_one_allowance(
    sides: tuple[Side, Side],
) -> None:
    one, two = sides
    model = _name()
    _closed(sides, model, 3)
    tries = [s.admission.admit(model, "low", SLO_MS) for s in (one, two) for _ in range(5)]
    admitted = [d.admit for d in await asyncio.gather(*tries)]
    assert admitted.count(True) == 3, admitted
    # The top band is never held, nor counted against the allowance.
    assert (await two.admission.admit(model, "high", SLO_MS)).admit
    # One ends in the first process: its room is given back across both (the next pass).
    took = one.admission.state()[model]["lower"]
    giver = one if took else two
    giver.admission.release(model, True)
    taker = two if giver is one else one

    async def admits() -> bool:
        return (await taker.admission.admit(model, "low", SLO_MS)).admit

    # Within a few passes (0.25 s each) on a quiet machine; bounded generously for a
    # loaded one, where a pass and Redis's answer can each take seconds.
    deadline = time.monotonic() + 30
    while not await admits():
        assert time.monotonic() < deadline, "the room given back was not taken in the other"
        await asyncio.sleep(0.02)
    assert not await admits()


async def _admitted_within(side: Side, model: str, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not (await side.admission.admit(model, "low", SLO_MS)).admit:
        assert time.monotonic() < deadline, (f"{what}: not admitted within {seconds:g} s",
                                             side.admission.state()[model])  # fmt: skip
        await asyncio.sleep(0.02)


async def test_requests_that_end_between_two_passes_give_their_room_back(
    sides: tuple[Side, Side],
) -> None:
    """Short requests (each ended before the next pass, 0.25 s): taken in Redis one at a
    time, each given back by the pass of the process that took it though that pass never
    saw it in flight; else each leaves one taken for good, and the lower bands are refused
    in every process once they fill the allowance."""
    one, two = sides
    model = _name()
    _closed(sides, model, 1)
    for i in range(3):
        # Bounded generously for a loaded machine: on a quiet one, within a pass.
        await _admitted_within(one, model, 10, f"one's request {i + 1}")
        one.admission.release(model, True)  # at once: no pass between its take and its end
    await _admitted_within(two, model, 10, "two's request after them")
    assert not (await one.admission.admit(model, "low", SLO_MS)).admit  # the one room: two's


async def test_a_gate_closed_in_one_process_closes_in_the_other(
    sides: tuple[Side, Side],
) -> None:
    one, two = sides
    model = _name()
    for s in sides:
        assert (await s.admission.admit(model, "low", SLO_MS)).admit  # known, open
    s = one.admission
    before = s._models[model].gate
    s.adopt(model, 1, s._clock(), s._clock())
    one.shared.gate_changed(model, before, s._models[model].gate)
    await _eventually(lambda: two.admission.limit(model) == 1, 2, "the gate closed in two")


async def test_a_replica_ejected_by_one_process_is_out_in_the_other_within_a_second(
    sides: tuple[Side, Side],
) -> None:
    one, two = sides
    model, replica = _name(), 900_000 + uuid.uuid4().int % 100_000
    pool = (replica, replica + 1)
    assert one.outliers.failed(model, replica, pool) is None
    ejection = one.outliers.failed(model, replica, pool)
    assert ejection is not None
    start = time.monotonic()
    one.shared.ejected(model, replica, ejection)
    await _eventually(lambda: two.outliers.excluded(pool) == {replica}, 1, "it out in two")
    took = time.monotonic() - start
    assert took < 1, took
    # For as long as the first one said, within a pass.
    ends = two.outliers.current()[model][replica] - time.monotonic()
    assert 28 < ends <= 30, ends


async def test_a_judge_breaker_opened_in_one_process_is_open_in_the_other_and_closes_there(
    sides: tuple[Side, Side],
) -> None:
    one, two = sides
    judge = _name()
    one.breakers.failed(judge, "timeout")
    one.breakers.failed(judge, "timeout")
    assert one.breakers.state(judge).state == breaker.OPEN
    await _eventually(lambda: two.breakers.state(judge).state == breaker.OPEN, 2,
                      "the breaker open in two")  # fmt: skip
    assert two.breakers.admit(judge, 5) == breaker.SKIP
    assert two.breakers.state(judge).next_probe == one.breakers.state(judge).next_probe
    # The judge answers one's probe: closed in both.
    one.breakers.succeeded(judge)
    await _eventually(lambda: two.breakers.state(judge).state == breaker.CLOSED, 2,
                      "the breaker closed in two")  # fmt: skip


async def test_with_redis_cut_each_process_goes_on_alone_and_shares_again_after(
    sides: tuple[Side, Side], proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    one, two = sides
    model = _name()
    _closed(sides, model, 2)
    await _eventually(lambda: two.shared.passes > 0, 2, "a pass of two")
    proxy.refuse()
    # Two decides alone at once, within its own allowance: no wait on Redis past its bound.
    start = time.monotonic()
    alone = [(await two.admission.admit(model, "low", SLO_MS)).admit for _ in range(3)]
    assert time.monotonic() - start < 1.5
    assert alone == [True, True, False] and two.shared.away
    assert "alone while Redis does not answer" in caplog.text
    # One, with Redis, has its own allowance: it does not count two's.
    assert (await one.admission.admit(model, "low", SLO_MS)).admit
    # A breaker opened by one while two is alone: not shared until two is back.
    judge = _name()
    one.breakers.failed(judge, "timeout")
    one.breakers.failed(judge, "timeout")
    proxy.heal()
    await _eventually(lambda: not two.shared.away, 5, "two back")
    assert "shared in Redis again" in caplog.text
    await _eventually(lambda: two.breakers.state(judge).state == breaker.OPEN, 2,
                      "the breaker open in two once back")  # fmt: skip
    # Two's two in flight are in Redis again (its pass): one has no room left.
    await _eventually(lambda: one.admission.state()[model]["others"] == 2, 2,
                      "two's requests counted in one")  # fmt: skip
    assert not (await one.admission.admit(model, "low", SLO_MS)).admit


async def test_the_counts_of_a_process_gone_are_dropped(sides: tuple[Side, Side]) -> None:
    one, two = sides
    model = _name()
    _closed(sides, model, 2)
    assert (await two.admission.admit(model, "low", SLO_MS)).admit
    assert (await two.admission.admit(model, "low", SLO_MS)).admit
    await _eventually(lambda: one.admission.state()[model]["others"] == 2, 2,
                      "two's requests counted in one")  # fmt: skip
    assert not (await one.admission.admit(model, "low", SLO_MS)).admit
    # Two dies with its requests in flight: once its key is gone, one has the room again.
    await two.shared.stop()
    await _eventually(lambda: one.admission.state()[model]["others"] == 0, 5,
                      "two's counts dropped")  # fmt: skip
    assert (await one.admission.admit(model, "low", SLO_MS)).admit


async def test_a_normal_request_waiting_in_one_process_goes_before_a_low_one_in_the_other(
    sides: tuple[Side, Side],
) -> None:
    one, two = sides
    model = _name()
    _closed(sides, model, 1)
    assert (await two.admission.admit(model, "low", SLO_MS)).admit  # the one room, taken
    one.admission.queue = 3.0
    waiting = asyncio.ensure_future(one.admission.admit(model, "normal", SLO_MS))
    await _eventually(lambda: two.admission._models[model].others_waiting == {"normal": 1}, 2,
                      "one's waiting normal request counted in two")  # fmt: skip
    # Two's low request ends: the room is the waiting normal one's, not a new low one's.
    two.admission.release(model, True)
    assert not (await two.admission.admit(model, "low", SLO_MS)).admit
    assert (await asyncio.wait_for(waiting, 5)).admit


async def test_a_process_leaving_while_redis_hangs_is_gone_within_its_bound(
    sides: tuple[Side, Side], proxy: FaultProxy
) -> None:
    """Redis accepts and never answers: a process told to leave mid-pass still leaves (its
    pass, its last delete and its connection each end within their bound)."""
    _, two = sides
    await _eventually(lambda: two.shared.passes > 0, 2, "a pass of two")
    proxy.hang()
    passes = two.shared.passes
    # A pass waiting on the hung Redis (its answer not come): the process is told to leave.
    await _eventually(lambda: two.shared.away, 5, "two's pass meeting the hung Redis")
    assert two.shared.passes == passes
    start = time.monotonic()
    await asyncio.wait_for(two.shared.stop(), 10)
    assert time.monotonic() - start < 5


async def test_a_stop_whose_cancel_the_pass_swallows_still_ends_the_pass(
    sides: tuple[Side, Side],
) -> None:
    """Python 3.11's ``asyncio.wait_for`` returns instead of raising when a cancel comes
    just as what it waits for is done: the pass's loop went on after its stop, wrote its
    process's key again after the stop deleted it, and its counts came back in the other."""
    one, two = sides
    model = _name()
    _closed(sides, model, 2)
    assert (await two.admission.admit(model, "low", SLO_MS)).admit
    await _eventually(lambda: one.admission.state()[model]["others"] == 1, 2,
                      "two's request counted in one")  # fmt: skip
    task = two.shared._task
    assert task is not None
    # Two's loop waits for its next pass; a change wakes it, and the stop's cancel comes
    # after the wait is done and before the loop has run on (one turn of the event loop).

    def waiting() -> bool:
        awaited = getattr(task.get_coro(), "cr_await", None)
        return getattr(getattr(awaited, "cr_code", None), "co_name", "") == "wait_for" and not (
            two.shared._wake.is_set()
        )

    await _eventually(waiting, 5, "two's loop waiting for its next pass")
    two.shared._poke()
    await asyncio.sleep(0)
    await two.shared.stop()
    assert task.done()
    await _eventually(lambda: one.admission.state()[model]["others"] == 0, 5,
                      "two's counts dropped")  # fmt: skip
    assert (await one.admission.admit(model, "low", SLO_MS)).admit
