"""One channel-layer subscription per process, shared by that process's live consoles.

With a subscription per console, the Redis layer delivers (and the process decodes) every
event once per open console: about 1 ms each on these machines (facts.md), so a change
took over 100 ms to reach the hundredth console. The hub subscribes the process once per
group and hands each event to the consoles of that group in the process, which render it
once between them (llmgw_admin.consumer) and send it. Events are handled in the order they
arrive, each console's copy before the next event.

While the layer's Redis is away, events are dropped where they are published, and nothing
says so to the consoles: the hub pings Redis every second, and when it does not answer
tells each console to reconnect (closed with 1013, "try again later"), so the page says it
is not live; consoles are let in again only once Redis answers, and each reconnect brings
a fresh snapshot, showing what changed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from llmgw_core import events

log = logging.getLogger(__name__)

# How often the hub asks Redis whether it is there, and how long it waits for the answer.
PING_S = 1.0
PING_TIMEOUT_S = 2.0


class Member(Protocol):
    async def handle_event(self, event: dict[str, Any]) -> None: ...

    async def layer_lost(self) -> None: ...


class Hub:
    """The consoles of one event loop (one server process), by group."""

    def __init__(self) -> None:
        self.members: dict[str, set[Member]] = defaultdict(set)
        self.subscribed: set[str] = set()
        self.channel: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()
        # Whether the layer's Redis failed to answer its last ping (or a receive failed).
        self.away = False
        self.watch: asyncio.Task[None] | None = None

    async def join(self, member: Member, groups: list[str]) -> None:
        """Add a console to the groups; raises when the layer cannot subscribe (Redis away)."""
        layer = get_channel_layer()
        if settings.REDIS_URL and (self.watch is None or self.watch.done()):
            self.watch = asyncio.get_running_loop().create_task(self._watch(layer))
        async with self.lock:
            if self.task is None or self.task.done():
                self.channel = await layer.new_channel("live-hub.")
                self.subscribed = set()
                self.task = asyncio.get_running_loop().create_task(self._run(layer))
            for group in groups:
                if group not in self.subscribed:
                    await layer.group_add(group, self.channel)
                    self.subscribed.add(group)
                self.members[group].add(member)

    def leave(self, member: Member) -> None:
        for group in self.members.values():
            group.discard(member)

    async def _run(self, layer: Any) -> None:
        channel = self.channel
        while True:
            try:
                event = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.away:
                    log.warning("the live hub could not receive (%s); retrying", exc)
                await self._away()
                await asyncio.sleep(1)
                continue
            group = events.GROUP_OF_TYPE.get(event.get("type", ""))
            members = list(self.members.get(group, ())) if group else []
            results = await asyncio.gather(
                *(m.handle_event(event) for m in members), return_exceptions=True
            )
            for r in results:
                if isinstance(r, Exception):
                    log.warning("a live console failed to take an event", exc_info=r)

    async def _watch(self, layer: Any) -> None:
        """Ping Redis every second; tell the consoles when it is away, subscribe again when back."""
        from redis.asyncio import Redis

        client = Redis.from_url(settings.REDIS_URL, socket_timeout=PING_TIMEOUT_S)
        try:
            while True:
                await asyncio.sleep(PING_S)
                try:
                    await asyncio.wait_for(client.ping(), PING_TIMEOUT_S)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not self.away:
                        log.warning("the live hub's Redis is away (%s): consoles not live", exc)
                    await self._away()
                    continue
                if self.away:
                    await self._back(layer)
        finally:
            await client.aclose()

    async def _away(self) -> None:
        """Close every console (1013): events are being dropped; they reconnect later."""
        self.away = True
        async with self.lock:
            members = {m for group in self.members.values() for m in group}
            self.members.clear()
        for member in members:
            try:
                await member.layer_lost()
            except Exception:
                log.warning("a live console could not be told to reconnect", exc_info=True)

    async def _back(self, layer: Any) -> None:
        """Redis answers again: subscribe again (a Redis that restarted forgot the groups)."""
        try:
            async with self.lock:
                for group in self.subscribed:
                    await layer.group_add(group, self.channel)
        except Exception as exc:
            log.warning("the live hub could not subscribe again yet (%s)", exc)
            return
        self.away = False
        log.warning("the live hub's Redis is back: consoles reconnect and resynchronise")


class LayerAway(logging.Filter):
    """channels-redis logs each failed receive with its traceback, once a second per layer
    while Redis is away (``channels_redis.pubsub``): keep one line a minute, with the
    error and without the traceback; the hub says when Redis goes and comes back.
    Connected in the settings' ``LOGGING``."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._said = -self.EVERY_S

    def filter(self, record: logging.LogRecord) -> bool:
        from redis.exceptions import RedisError

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, RedisError | OSError | TimeoutError):
            return True
        now = time.monotonic()
        if now - self._said < self.EVERY_S:
            return False
        self._said = now
        said = record.getMessage()
        record.msg = "%s (%s: %s); said once a minute while Redis does not answer"
        record.args = (said, type(exc).__name__, exc)
        record.exc_info = None
        record.exc_text = None
        return True


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    """Return this event loop's hub (one per server process; tests run several loops)."""
    loop = asyncio.get_running_loop()
    h = _hubs.get(loop)
    if h is None:
        for old in [lp for lp in _hubs if lp.is_closed()]:
            del _hubs[old]
        h = _hubs[loop] = Hub()
    return h
