"""Budgets in Redis while Redis is away or hung: the real Redis behind a FaultProxy.

A request's budget check never fails and never waits past the limiter's timeout: it
counts in the process while Redis does not answer, and shares the budget again (with
what it counted meanwhile) once a ping off the request path gets an answer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import redis

from gateway.path.limits import WINDOW, RedisLimits
from llmgw_core import rediskeys
from tests.faultproxy import FaultProxy
from tests.gateway.harness import Harness, model, wait
from tests.redisserver import url as redis_url

# About 32 s for the file's 11 tests in a full run (load 2 to 10): listed with the
# long files, so that it starts early rather than end the run alone (tests/conftest.py).
pytestmark = pytest.mark.takes(2.9)

URL = redis_url(15)
TIMEOUT = 0.2
# A loaded machine: each answer of Redis held longer than its timeout, which a budget's call
# still waits for (SLOW_FACTOR timeouts: 1 s here, for a new connection's two round trips).
SLOW_TIMEOUT = 0.25
SLOWER = 0.3
# Generous: a loaded 2-core machine adds scheduling delay, never a second.
BOUND = TIMEOUT + 1.5


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    parts = urlsplit(URL)
    p = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 6379)).start()
    yield p
    p.stop()


def _through(proxy: FaultProxy) -> str:
    return f"redis://{proxy.address}{urlsplit(URL).path}"


async def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it did not happen")
        await asyncio.sleep(0.01)


async def _timed(call: Awaitable[float | None]) -> tuple[float | None, float]:
    start = time.monotonic()
    result = await call
    return result, time.monotonic() - start


def _in_redis(key: int, kind: str, now: float) -> int:
    value = redis.Redis.from_url(URL, socket_timeout=5).get(
        f"{rediskeys.prefix()}gateway:limit:{key}:{kind}:{int(now // WINDOW)}"
    )
    return int(value or 0)


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["refuse", "hang"])
async def test_redis_away_or_hung_counts_here_within_the_timeout_and_shares_again_after(
    proxy: FaultProxy, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = [time.time() // WINDOW * WINDOW + 1.0]  # early in a minute: no window ends mid-test
    limits = RedisLimits(_through(proxy), clock=lambda: now[0], timeout=TIMEOUT, probe_every=0.1)
    key = 10**9 + secrets.randbelow(10**9)
    assert await limits.take(key, "requests", 1, 5) is None  # through Redis
    assert _in_redis(key, "requests", now[0]) == 1 and not limits.away

    caplog.set_level(logging.WARNING, logger="gateway.path.limits")
    getattr(proxy, fault)()
    # The first call meets the fault and is answered within the timeout, from here.
    wait, took = await _timed(limits.take(key, "requests", 1, 5))
    assert wait is None and took < BOUND, f"{fault}: the budget check took {took:.2f} s"
    assert limits.away
    # Then every call is counted here without asking Redis: the budget still holds.
    results = []
    for _ in range(5):
        result, took = await _timed(limits.take(key, "requests", 1, 5))
        assert took < BOUND
        results.append(result)
    # Counted on from the shared count it last saw (1), not from nothing: with the call
    # that met the fault, 4 more of the 5 fit.
    assert results[:3] == [None] * 3 and results[3] == pytest.approx(WINDOW - 1.0)
    assert results[4] == pytest.approx(WINDOW - 1.0)
    await limits.charge(key, "tokens", 7)
    assert limits.counted_here == 7
    said = [r.getMessage() for r in caplog.records if "alone" in r.getMessage()]
    assert len(said) == 1, said  # said once, not per request

    proxy.heal()
    await _eventually(
        lambda: any("shared in Redis again" in r.getMessage() for r in caplog.records),
        10, "the limiter to use Redis again",
    )  # fmt: skip
    assert not limits.away
    # This minute's counts made here are in Redis now: 1 before + 4 taken here (hung, the
    # call that met the bound may reach Redis as it heals: counted there and here, 6).
    assert _in_redis(key, "requests", now[0]) in ((5,) if fault == "refuse" else (5, 6))
    assert _in_redis(key, "tokens", now[0]) == 7
    assert await limits.take(key, "requests", 1, 5) == pytest.approx(WINDOW - 1.0)


@pytest.mark.asyncio
async def test_a_redis_that_never_answered_counts_here_from_the_first_request(
    proxy: FaultProxy,
) -> None:
    proxy.hang()
    limits = RedisLimits(_through(proxy), timeout=TIMEOUT, probe_every=0.1)
    wait, took = await _timed(limits.take(1, "requests", 1, 1))
    assert wait is None and took < BOUND and limits.away
    assert (await limits.take(1, "requests", 1, 1)) is not None  # the limit, counted here


@pytest.mark.asyncio
async def test_slow_answers_keep_the_budget_shared_between_processes(proxy: FaultProxy) -> None:
    # A loaded machine: every answer from Redis takes longer than the Redis timeout. Two
    # gateway processes ask a 30-a-minute key's budget 30 times each, at once: a slow
    # answer is waited for (not taken for an absent Redis with a fresh budget of its own),
    # so no more than 30 get through, however they are spread.
    now = [time.time() // WINDOW * WINDOW + 1.0]
    one, two = (
        RedisLimits(_through(proxy), clock=lambda: now[0], timeout=SLOW_TIMEOUT, probe_every=0.1)
        for _ in range(2)
    )
    key = 10**9 + secrets.randbelow(10**9)
    # Each process's connections open, as a gateway's are once it has served a while.
    warm = 10**9 + secrets.randbelow(10**9)
    await asyncio.gather(*(limits.take(warm, "requests", 1, 1000) for limits in (one, two)
                           for _ in range(30)))  # fmt: skip
    assert await one.take(key, "requests", 1, 30) is None
    proxy.slow(SLOWER)
    answers = await asyncio.gather(
        *(limits.take(key, "requests", 1, 30) for limits in (one, two) for _ in range(30))
    )
    assert sum(a is None for a in answers) == 29
    assert not one.away and not two.away
    assert _in_redis(key, "requests", now[0]) == 30


@pytest.mark.asyncio
async def test_a_process_that_falls_back_counts_on_from_the_shared_count_it_saw(
    proxy: FaultProxy,
) -> None:
    now = [time.time() // WINDOW * WINDOW + 1.0]
    limits = RedisLimits(_through(proxy), clock=lambda: now[0], timeout=TIMEOUT, probe_every=60)
    key = 10**9 + secrets.randbelow(10**9)
    for _ in range(10):
        assert await limits.take(key, "requests", 1, 30) is None
    proxy.refuse()
    answers = [await limits.take(key, "requests", 1, 30) for _ in range(30)]
    assert limits.away
    # 10 shared, then 20 here: the key's 30, not 30 more.
    assert sum(a is None for a in answers) == 20
    assert all(a == pytest.approx(WINDOW - 1.0) for a in answers[20:])


@pytest.mark.asyncio
async def test_answers_still_on_their_way_when_a_process_falls_back_are_not_granted_twice(
    proxy: FaultProxy,
) -> None:
    # A loaded machine: three takes of a 30-a-minute key are on their way to Redis (applied
    # there, their answers slow but within the bound) when a fourth call meets the bound and
    # the process falls back to counting here. The three are granted by Redis when their
    # answers land: what is left here is three less, not the 20 the last count seen left.
    now = [time.time() // WINDOW * WINDOW + 1.0]
    # Each call's bound 4 s (4 times a Redis timeout of 1 s); every answer held 3 s.
    limits = RedisLimits(_through(proxy), clock=lambda: now[0], timeout=1.0, probe_every=60)
    key = 10**9 + secrets.randbelow(10**9)
    warm = 10**9 + secrets.randbelow(10**9)
    await asyncio.gather(*(limits.take(warm, "requests", 1, 1000) for _ in range(4)))
    for _ in range(10):
        assert await limits.take(key, "requests", 1, 30) is None
    proxy.slow(3.0)
    on_their_way = [asyncio.ensure_future(limits.take(key, "requests", 1, 30)) for _ in range(3)]
    await _eventually(lambda: _in_redis(key, "requests", now[0]) == 13, 5, "the three applied")
    limits.timeout = 0.1  # the fourth call has no answer within its bound
    assert await limits.take(key, "requests", 1, 30) is None
    assert limits.away and not any(t.done() for t in on_their_way)
    here = []
    while len(here) < 40 and (not here or here[-1] is None):
        here.append(await limits.take(key, "requests", 1, 30))
    assert await asyncio.gather(*on_their_way) == [None] * 3
    granted = 10 + 3 + 1 + sum(a is None for a in here)
    assert granted == 30, f"{granted} granted on a key of 30 a minute"
    assert await limits.take(key, "requests", 1, 30) == pytest.approx(WINDOW - 1.0)


def _another_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process from here on as one of another cluster's: another database, the same
    Redis (a key's id is a row number: both clusters have a key 1, 2, ...)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    monkeypatch.setitem(settings.DATABASES, "default", {**db, "NAME": f"{db['NAME']}_other"})


@pytest.mark.asyncio
async def test_two_clusters_on_one_redis_keep_separate_budgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = time.time() // WINDOW * WINDOW + 1.0
    here = RedisLimits(URL, clock=lambda: now, timeout=1)
    key, owner = 10**9 + secrets.randbelow(10**9), f"team:{secrets.token_hex(4)}"
    _another_cluster(monkeypatch)
    there = RedisLimits(URL, clock=lambda: now, timeout=1)
    # Here, the key's 2 a minute and the owner's 100 tokens spent.
    assert [await here.take(key, "requests", 1, 2) for _ in range(3)] == [
        None, None, pytest.approx(WINDOW - 1.0)
    ]  # fmt: skip
    assert (await here.reserve(owner, 100, 100))[0] is None
    assert (await here.reserve(owner, 1, 100))[0] is not None
    # There, the same key id and owner have all of their own.
    assert [await there.take(key, "requests", 1, 2) for _ in range(2)] == [None, None]
    assert (await there.reserve(owner, 100, 100))[0] is None
    assert not here.away and not there.away


# Through the gateway, as a client sees it: a key with both budgets, Redis cut.


@pytest.fixture
def gateway_h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_a_key_with_a_budget_is_served_while_redis_is_away_or_hung(
    gateway_h: Harness, proxy: FaultProxy, fault: str, settings: Any
) -> None:
    from gateway.path.table import Key, digest

    settings.LLMGW_REDIS_TIMEOUT_MS = int(TIMEOUT * 1000)
    h = gateway_h
    h.gateway.limits = RedisLimits(_through(proxy))
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    secret = "llmgw-ck-budgeted-" + secrets.token_hex(4)
    h.keys[digest(secret)] = Key(10**9 + secrets.randbelow(10**9), "budgeted", "team:t", (),
                                 None, rpm=1000, tpm=100000)  # fmt: skip
    h.refresh()
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=10)

    def ask(stream: bool) -> float:
        start = time.monotonic()
        messages = [{"role": "user", "content": "hi"}]
        if stream:
            assert list(client.chat.completions.create(model="m", messages=messages, stream=True))
        else:
            assert client.chat.completions.create(model="m", messages=messages).choices
        return time.monotonic() - start

    ask(False)
    getattr(proxy, fault)()
    took = [ask(stream) for stream in (False, True) * 4]
    assert max(took) < BOUND + 1, f"{fault}: the slowest request took {max(took):.2f} s"
    assert h.gateway.limits.away
    from gateway.records import metrics

    counted = [line for line in metrics.scrape().decode().splitlines()
               if line.startswith('llmgw_gateway_budget_local_total{kind="requests"}')]  # fmt: skip
    assert counted and float(counted[0].split()[-1]) >= 8, counted
    proxy.heal()
    wait(lambda: not h.gateway.limits.away, 10, "budgets shared in Redis again")
    ask(False)


@pytest.mark.parametrize("fault", ["slow", "refuse"])
def test_a_30_a_minute_key_lets_30_through_with_redis_slow_or_gone_midway(
    gateway_h: Harness, proxy: FaultProxy, fault: str, settings: Any
) -> None:
    """The budget a client meets: 40 requests on a key of 30 a minute, 10 and then 30 at
    once with Redis answering slower than its timeout (a loaded machine) or gone: 30 are
    answered, the rest get 429."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.path.table import Key, digest

    settings.LLMGW_REDIS_TIMEOUT_MS = int(SLOW_TIMEOUT * 1000)
    h = gateway_h
    h.gateway.limits = RedisLimits(_through(proxy), probe_every=60)
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    secret = "llmgw-ck-thirty-" + secrets.token_hex(4)
    h.keys[digest(secret)] = Key(10**9 + secrets.randbelow(10**9), "thirty", "team:t", (),
                                 None, rpm=30)  # fmt: skip
    h.refresh()
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=20)

    def ask(_: int) -> int:
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except openai.RateLimitError:
            return 429
        return 200

    if time.time() % WINDOW > WINDOW - 20:  # a minute's end mid-test would start a new budget
        wait(lambda: time.time() % WINDOW < 5, 25, "the next minute")
    with ThreadPoolExecutor(8) as pool:  # the gateway's connections to Redis open
        statuses = list(pool.map(ask, range(10)))
    if fault == "refuse":
        proxy.refuse()
    else:
        proxy.slow(SLOWER)
    with ThreadPoolExecutor(8) as pool:
        statuses += list(pool.map(ask, range(30)))
    assert set(statuses) == {200, 429}
    granted = statuses.count(200)
    if fault == "refuse" or not h.gateway.limits.away:
        assert granted == 30, granted
        assert h.gateway.limits.away == (fault == "refuse")
    else:
        # A loaded machine held a call past its bound (4 Redis timeouts) and the process
        # counts here: never more than the 30, and fewer by at most the calls that met the
        # bound (Redis may have applied them: counted there and here), 8 at once at most.
        assert 30 - 8 <= granted <= 30, granted
