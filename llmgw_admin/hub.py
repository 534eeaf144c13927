"""One channel-layer subscription per process, shared by that process's live consoles.

With a subscription per console, the Redis layer delivers (and the process decodes) every
event once per open console: about 1 ms each on these machines (facts.md), so a change
took over 100 ms to reach the hundredth console. The hub subscribes the process once per
group and hands each event to the consoles of that group in the process, which render it
once between them (llmgw_admin.consumer) and send it. Events are handled in the order they
arrive, each console's copy before the next event.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any, Protocol

from channels.layers import get_channel_layer

from cluster import events

log = logging.getLogger(__name__)


class Member(Protocol):
    async def handle_event(self, event: dict[str, Any]) -> None: ...


class Hub:
    """The consoles of one event loop (one server process), by group."""

    def __init__(self) -> None:
        self.members: dict[str, set[Member]] = defaultdict(set)
        self.subscribed: set[str] = set()
        self.channel: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    async def join(self, member: Member, groups: list[str]) -> None:
        layer = get_channel_layer()
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
            except Exception:
                log.warning("the live hub could not receive; retrying", exc_info=True)
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
