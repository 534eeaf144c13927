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
of a key that has a limit, none for keys without.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WINDOW = 60


class LocalLimits:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counts: dict[tuple[int, str, int], int] = {}

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


_TAKE = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local amount = tonumber(ARGV[1])
if used > 0 and used + amount > tonumber(ARGV[2]) then return 0 end
redis.call('INCRBY', KEYS[1], amount)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class RedisLimits:
    def __init__(self, url: str, clock: Callable[[], float] = time.time) -> None:
        import redis.asyncio as aioredis

        self._redis = aioredis.from_url(url)
        self._take = self._redis.register_script(_TAKE)
        self._clock = clock

    async def take(self, key_id: int, kind: str, amount: int, limit: int) -> float | None:
        if limit <= 0:
            return None
        now = self._clock()
        window = int(now // WINDOW)
        name = f"llmgw:gateway:limit:{key_id}:{kind}:{window}"
        ok = await self._take(keys=[name], args=[amount, limit, WINDOW * 2])
        if ok:
            return None
        return (window + 1) * WINDOW - now

    async def charge(self, key_id: int, kind: str, amount: int) -> None:
        """Count ``amount`` already spent, over the limit or not."""
        name = f"llmgw:gateway:limit:{key_id}:{kind}:{int(self._clock() // WINDOW)}"
        async with self._redis.pipeline(transaction=True) as pipe:
            await pipe.incrby(name, amount).expire(name, WINDOW * 2).execute()
