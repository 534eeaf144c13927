"""Request and token budgets per client key, per minute.

A fixed window of 60 s per key: a request takes one from the key's requests and its
prompt bound plus ``max_tokens`` (else the model's ``max_output``) from its tokens,
reserved up front, so a limit is not overshot by streams still running; the unused part
is not given back, which errs on the side of the limit. A request that gives neither
bound has the tokens its answer took beyond what was reserved ``charge``d when it ends.
Over a budget, the answer is 429 with ``Retry-After`` naming the seconds to the window's
end; a request that could never fit (``Gateway._budget``) is refused before.

``LocalLimits`` counts in this process (the embedded mode: one process). ``RedisLimits``
counts in Redis, so every gateway process shares one budget: one round trip per request
of a key that has a limit, none for keys without. The counts are this cluster's own
(under ``llmgw_core.rediskeys``' prefix): two clusters on one Redis keep separate budgets.

An owner's token budget (``Quota.tpm``: ``manage.py cluster quota set OWNER --tpm N``) is
shared by all its keys and every gateway process: ``reserve`` takes the request's bound
(its prompt by its bytes plus ``max_tokens``, else the model's ``max_output``) up front in
Redis with one script (read, compare, add: atomic), strictly (a reservation that would
pass the budget is refused, unless the minute has nothing yet), and ``settle`` gives back
(or takes) the difference with the real count (the engine's usage, prompt and answer)
when the answer ends. So N processes never let through more than the budget plus one
request's reservation, and the count is exact once settled. With Redis away: the same
local fallback as the keys' budgets (each process alone, then this minute's counts added
back; docs/gateway.md).

Redis away or hung never fails a request nor holds it past a bound: each call to Redis has
``SLOW_FACTOR`` times ``LLMGW_REDIS_TIMEOUT_MS`` (the whole call, connecting included; 1 s
by default). A slow answer is not an absent Redis: on a loaded machine an answer may take
a few hundred milliseconds, and it is waited for, so the budget stays shared. A call that
fails (a connection refused or cut) or has no answer within that bound turns the process
to counting in its own memory (a ``LocalLimits``) at once, for every request, until a
probe off the request path (a ping every ``PROBE_S``) gets an answer; then the counts this
process made in the current minute are added to Redis's and the budget is shared again.
The process's own count starts from the shared count it last saw for each budget this
minute (every take's answer carries it) plus what its calls still on their way ask for
(Redis may grant them: an answer landing after the fall back is kept and the count follows
it), never from zero: one process alone never grants more than the budget. It may grant
less: a call with no answer in time is counted here, and Redis may have applied it too
(each such call's amount at most twice). While away, each process counts from there alone
(N processes: up to N times what was left); back, the minute's counts from every process
are in Redis, so the rest of the minute errs on the side of the limit. Counted in
``llmgw_gateway_budget_local_total{kind}`` (requests and tokens counted here while away),
logged when it starts, once a minute while it lasts, and when it ends (docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.path import series
from llmgw_core import rediskeys

WINDOW = 60
# While Redis is away: how often it is asked again (off the path), how often it is said.
PROBE_S = 1.0
LOG_EVERY_S = 60.0
# How long a budget's call to Redis may take before Redis counts as away, in Redis
# timeouts (LLMGW_REDIS_TIMEOUT_MS): a loaded machine's slow answer is still an answer.
SLOW_FACTOR = 4
# Connections to Redis a process opens at most for its budgets (a call beyond waits for
# one, within the same bound).
MAX_CONNECTIONS = 512

log = logging.getLogger(__name__)


Slot = tuple[int | str, str, int]  # (key id or owner, kind, minute)


class LocalLimits:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counts: dict[Slot, int] = {}

    def add(self, slot: Slot, amount: int) -> None:
        """Add ``amount`` to a slot's count (below zero: take it off), never below zero."""
        self._counts[slot] = max(0, self._counts.get(slot, 0) + amount)

    async def take(self, key_id: int, kind: str, amount: int, limit: int) -> float | None:
        """Take ``amount``; return None, or the seconds to wait when over ``limit``."""
        if limit <= 0:
            return None
        now = self._clock()
        window = int(now // WINDOW)
        slot = (key_id, kind, window)
        used = self._counts.get(slot, 0)
        if used + amount > limit and used > 0:
            return (window + 1) * WINDOW - now
        self._counts[slot] = used + amount
        if len(self._counts) > 10000:
            self._counts = {k: v for k, v in self._counts.items() if k[2] >= window}
        return None

    async def charge(self, key_id: int, kind: str, amount: int) -> None:
        """Count ``amount`` already spent, over the limit or not."""
        slot = (key_id, kind, int(self._clock() // WINDOW))
        self._counts[slot] = self._counts.get(slot, 0) + amount

    # An owner's token budget, shared by all its keys: reserved up front, settled.
    async def reserve(self, owner: str, amount: int, limit: int) -> tuple[float | None, int]:
        """Reserve ``amount`` of ``owner``'s tokens this minute: (None, window) when
        reserved (settle it with ``window``), else (seconds to wait, window)."""
        now = self._clock()
        window = int(now // WINDOW)
        slot = (owner, "owner", window)
        used = self._counts.get(slot, 0)
        if used + amount > limit and used > 0:
            return (window + 1) * WINDOW - now, window
        self._counts[slot] = used + amount
        return None, window

    async def settle(self, owner: str, window: int, reserved: int, spent: int) -> None:
        """The answer ended having used ``spent``: the reservation's difference goes back
        to (or is taken from) the minute it was made in."""
        slot = (owner, "owner", window)
        if slot in self._counts or spent > reserved:
            self._counts[slot] = max(0, self._counts.get(slot, 0) + spent - reserved)


# A key's take and an owner's reservation, one rule: strict (past the limit is refused,
# unless the minute has nothing yet: one request larger than an owner's budget is refused
# before, at 400), so what N processes let through is never more than the limit plus one
# request's amount. It answers with the count: taken, the count after it (0 or more);
# refused, the count there is, negated (below 0).
_TAKE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local amount = tonumber(ARGV[1])
if used > 0 and used + amount > tonumber(ARGV[2]) then return -used end
local now = redis.call('INCRBY', KEYS[1], amount)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return now
"""
# The settlement: the difference, never below zero, on a key that still exists. It answers
# with the count after it, or -1 for a key gone (its minute over).
_SETTLE = """
if redis.call('EXISTS', KEYS[1]) == 0 and tonumber(ARGV[1]) <= 0 then return -1 end
local now = redis.call('INCRBY', KEYS[1], ARGV[1])
if now < 0 then redis.call('SET', KEYS[1], 0) now = 0 end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return now
"""


def timeout_setting() -> float:
    return settings.LLMGW_REDIS_TIMEOUT_MS / 1000


def _local_counter() -> Any:
    """``llmgw_gateway_budget_local_total{kind}``, in the gateway's metrics."""
    return series.fallback_counter(
        "budget_local",
        "budget takes counted in this process while Redis was away",
        "the budgets' fallback",
    )


class RedisLimits:
    """Budgets shared in Redis; counted in this process while Redis does not answer."""

    def __init__(
        self,
        url: str,
        clock: Callable[[], float] = time.time,
        timeout: float | None = None,
        probe_every: float = PROBE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        # How long one call may take before Redis counts as away: a slow answer is waited
        # for (``SLOW_FACTOR`` Redis timeouts), an absent Redis refuses at once.
        self.timeout = (timeout_setting() if timeout is None else timeout) * SLOW_FACTOR
        # No retries inside redis-py: one attempt, bounded; the fallback is the retry. The
        # blocking pool connects its new connections side by side (the plain pool connects
        # them one after another under its lock: on a loaded machine a burst of requests
        # queued behind each other's handshakes, and the last ones ran out of time), and
        # without the client's two SETINFO commands, one round trip less each.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=self.timeout,
            socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
            retry=Retry(NoBackoff(), 0), health_check_interval=0,
            lib_name=None, lib_version=None,
        )  # fmt: skip
        self._redis = aioredis.Redis(connection_pool=pool)
        self.prefix = rediskeys.prefix() + "gateway:"  # this cluster's budgets alone
        self._take = self._redis.register_script(_TAKE)
        self._settle = self._redis.register_script(_SETTLE)
        self._clock = clock
        self._monotonic = monotonic
        self.local = LocalLimits(clock)
        # The shared count each budget had at its last answer from Redis, this minute, and
        # the amounts of its calls on their way (asked, not answered: Redis may have
        # granted them): counting here counts on from both. ``_from`` is that part of the
        # local counts, so only what was counted here is added to Redis once it is back.
        self.seen: dict[Slot, int] = {}
        self.on_the_way: dict[Slot, int] = {}
        self._from: dict[Slot, int] = {}
        self.probe_every = probe_every
        # None while Redis answers; else when (monotonic) it stopped answering.
        self.away_since: float | None = None
        self.counted_here = 0  # takes and charges counted in this process while away
        self._probe: asyncio.Task[None] | None = None
        self._said_at = 0.0
        self._said_count = 0

    @property
    def away(self) -> bool:
        return self.away_since is not None

    def _name(self, key_id: int, kind: str, window: int) -> str:
        return f"{self.prefix}limit:{key_id}:{kind}:{window}"

    async def take(self, key_id: int, kind: str, amount: int, limit: int) -> float | None:
        if limit <= 0:
            return None
        if self.away_since is None:
            now = self._clock()
            window = int(now // WINDOW)
            name = self._name(key_id, kind, window)
            count = await self._call(
                (key_id, kind, window), amount,
                self._take(keys=[name], args=[amount, limit, WINDOW * 2]), abs,
            )  # fmt: skip
            if count is not None:
                return None if count >= 0 else (window + 1) * WINDOW - now
        self._counted_here(kind)
        return await self.local.take(key_id, kind, amount, limit)

    async def charge(self, key_id: int, kind: str, amount: int) -> None:
        """Count ``amount`` already spent, over the limit or not."""
        if self.away_since is None:
            slot = (key_id, kind, int(self._clock() // WINDOW))
            if await self._call(slot, amount, self._add(self._name(*slot), amount)) is not None:
                return
        self._counted_here(kind)
        await self.local.charge(key_id, kind, amount)

    def _owner_name(self, owner: str, window: int) -> str:
        return f"{self.prefix}owner:{owner}:tokens:{window}"

    async def reserve(self, owner: str, amount: int, limit: int) -> tuple[float | None, int]:
        """Reserve ``owner``'s tokens in Redis (one script: read, compare, add), shared by
        every process; counted here while Redis is away, as the keys' budgets are."""
        now = self._clock()
        window = int(now // WINDOW)
        if self.away_since is None:
            count = await self._call(
                (owner, "owner", window), amount,
                self._take(keys=[self._owner_name(owner, window)],
                           args=[amount, limit, WINDOW * 2]),
                abs,
            )  # fmt: skip
            if count is not None:
                return (None if count >= 0 else (window + 1) * WINDOW - now), window
        self._counted_here("owner")
        return await self.local.reserve(owner, amount, limit)

    async def settle(self, owner: str, window: int, reserved: int, spent: int) -> None:
        if spent == reserved:
            return
        if self.away_since is None:
            # A settlement that took more sets the count seen (it went up); -1: minute over.
            answer = await self._call(
                (owner, "owner", window), spent - reserved,
                self._settle(keys=[self._owner_name(owner, window)],
                             args=[spent - reserved, WINDOW * 2]),
                lambda count: count if count >= 0 else None,
            )  # fmt: skip
            if answer is not None:
                return
        self._counted_here("owner")
        await self.local.settle(owner, window, reserved, spent)

    async def _call(
        self, slot: Slot, amount: int, call: Awaitable[Any],
        shared: Callable[[int], int | None] = lambda count: count,
    ) -> int | None:  # fmt: skip
        """Ask Redis for ``slot``'s budget, within the bound: its answer, or None when it
        failed or had none in time (from then this process counts here). Until it is
        answered its ``amount`` is on its way (Redis may grant it); ``shared`` gives the
        shared count an answer carries (None: none)."""
        amount = max(0, amount)
        self.on_the_way[slot] = self.on_the_way.get(slot, 0) + amount
        try:
            answer = int(await asyncio.wait_for(call, self.timeout))
        except BaseException as exc:
            # No answer: counted here (the caller takes it locally), not on its way; Redis
            # may still have applied it, then it is counted twice, erring on the limit.
            self._answered(slot, amount, None)
            if not isinstance(exc, Exception):
                raise
            self._went_away(exc)
            return None
        self._answered(slot, amount, shared(answer))
        return answer

    def _answered(self, slot: Slot, amount: int, count: int | None) -> None:
        """A call for ``slot`` is back, with the shared ``count`` it carries (or None): it is
        no longer on its way; while this process counts here, the slot counts on from the
        new shared part (an answer landing after the fall back was granted by Redis)."""
        left = self.on_the_way.get(slot, 0) - amount
        if left > 0:
            self.on_the_way[slot] = left
        else:
            self.on_the_way.pop(slot, None)
        if count is not None:
            self._saw(slot, count)
        if self.away_since is not None:
            self._count_from(slot)

    def _count_from(self, slot: Slot) -> None:
        """Make ``slot``'s local count the shared part (the count last seen and what is on
        its way) plus what was counted here."""
        shared = self.seen.get(slot, 0) + self.on_the_way.get(slot, 0)
        self.local.add(slot, shared - self._from.get(slot, 0))
        self._from[slot] = shared

    async def _add(self, name: str, amount: int) -> int:
        return (await self._incr({name: amount}))[0]

    async def _incr(self, amounts: dict[str, int]) -> list[int]:
        """Add the amounts; return each name's count after it, in order."""
        async with self._redis.pipeline(transaction=True) as pipe:
            for name, amount in amounts.items():
                pipe.incrby(name, amount).expire(name, WINDOW * 2)
            answers = await pipe.execute()
        return [int(n) for n in answers[::2]]

    def _saw(self, slot: Slot, count: int) -> None:
        """Keep the shared count a budget had at Redis's answer (this minute's only): the
        highest seen, as answers to calls made side by side may come in any order (and a
        settlement's lower count would only let more through on a fall back)."""
        if count > self.seen.get(slot, -1):
            self.seen[slot] = count
        if len(self.seen) > 10000:
            window = int(self._clock() // WINDOW)
            self.seen = {k: v for k, v in self.seen.items() if k[2] >= window}

    def _counted_here(self, kind: str) -> None:
        self.counted_here += 1
        counter = _local_counter()
        if counter is not None:
            counter.labels(kind).inc()
        now = self._monotonic()
        if self.away_since is not None and now - self._said_at >= LOG_EVERY_S:
            self._said_at = now
            log.warning(
                "budgets are still counted by this gateway process alone: Redis has not "
                "answered for %.0f s (%d budget counts made here since it went away)",
                now - self.away_since, self.counted_here - self._said_count,
            )  # fmt: skip

    def _went_away(self, exc: BaseException) -> None:
        if self.away_since is not None:
            return
        self.away_since = self._monotonic()
        self._said_at = self.away_since
        self._said_count = self.counted_here
        # Counted here from the shared counts last seen this minute and what is on its way
        # to Redis, not from nothing.
        window = int(self._clock() // WINDOW)
        for slot in {*self.seen, *self.on_the_way}:
            if slot[2] == window:
                self._count_from(slot)
        log.warning(
            "budgets are counted by this gateway process alone while Redis does not answer "
            "(%s within %.0f ms); asking it again every %g s",
            said(exc), self.timeout * 1000, self.probe_every,
        )  # fmt: skip
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._until_back())

    async def _until_back(self) -> None:
        """Ping Redis off the request path until it answers; then share the budgets again."""
        while self.away_since is not None:
            await asyncio.sleep(self.probe_every)
            try:
                await asyncio.wait_for(self._redis.ping(), self.timeout)
            except Exception:
                continue
            await self._back()

    async def _back(self) -> None:
        """Redis answers: take this minute's counts made here to Redis, and count there again.

        The swap happens with no await between, so every take after it goes to Redis and
        every one before is in what is sent; older minutes are over and are dropped.
        """
        assert self.away_since is not None
        away_for = self._monotonic() - self.away_since
        window = int(self._clock() // WINDOW)
        counts, self.local._counts = self.local._counts, {}
        started, self._from = self._from, {}
        self.away_since = None
        # What was counted here: the local counts less the shared ones they started from.
        mine = {
            (self._owner_name(k, w) if kind == "owner" else self._name(k, kind, w)): added
            for (k, kind, w), n in counts.items()
            if w == window and (added := n - started.get((k, kind, w), 0)) > 0
        }
        try:
            if mine:
                await asyncio.wait_for(self._incr(mine), self.timeout)
        except Exception as exc:
            # Away again: keep what was counted here, beside what was counted meanwhile (on
            # the shared part, if another call met the bound first; else from here on).
            for slot, n in counts.items():
                self.local.add(slot, n - started.get(slot, 0))
            self._went_away(exc)
            return
        log.warning(
            "budgets are shared in Redis again after %.0f s (%d budget counts made by this "
            "process alone; this minute's, for %d key budgets, added to Redis's)",
            away_for, self.counted_here - self._said_count, len(mine),
        )  # fmt: skip
        self._said_count = self.counted_here


def said(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
