"""The live hub hands each console its events on its own: one console that never takes an
event (it joined and never became ready: its snapshot's send failed as the browser left)
holds nobody else's, is dropped within its bound and told to reconnect; every console
hears the hub's heartbeat, sent through the layer, and stops hearing it when the hub's
receive loop stops.

Through the in-memory channel layer the embedded mode runs, with stand-in consoles.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import get_channel_layer

from llmgw_admin import hub as hub_module
from llmgw_admin.hub import BEAT, Hub

pytestmark = pytest.mark.asyncio

GROUP = "cluster.nodes"


def nodes_changed(n: int) -> dict[str, Any]:
    return {"type": "cluster.nodes_changed", "id": f"e{n}", "nodes": [n]}


class Console:
    """A member that takes events once ready (``ready`` set), noting what it heard."""

    def __init__(self, ready: bool = True) -> None:
        self.ready = asyncio.Event()
        if ready:
            self.ready.set()
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.told: asyncio.Event = asyncio.Event()

    async def handle_event(self, event: dict[str, Any]) -> None:
        # Unbounded on purpose: the console that never becomes ready, which the hub must
        # not wait on (the test bounds its own waits; pytest-timeout bounds the rest).
        await self.ready.wait()
        self.events.put_nowait(event)

    def beat(self) -> bool:
        return False  # taken in turn, as an event

    async def layer_lost(self) -> None:
        self.told.set()

    async def behind(self) -> None:
        self.told.set()

    async def next(self, type_: str, timeout: float = 1.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                if event["type"] == type_:
                    return event


async def test_a_console_that_never_becomes_ready_holds_no_one_elses_events(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REDIS_URL = ""
    monkeypatch.setattr(hub_module, "TAKE_TIMEOUT_S", 1.0)
    hub = Hub()
    stuck, live = Console(ready=False), Console()
    await hub.join(stuck, [GROUP])
    await hub.join(live, [GROUP])
    layer = get_channel_layer()
    try:
        for n in range(3):
            await layer.group_send(GROUP, nodes_changed(n))
            # Each event reaches the ready console within a second, in order.
            assert (await live.next("cluster.nodes_changed"))["nodes"] == [n]
        # The stuck one is dropped within its bound and told to reconnect.
        await asyncio.wait_for(stuck.told.wait(), 3)
        assert stuck not in hub.boxes and all(stuck not in g for g in hub.members.values())
        assert live in hub.boxes and not live.told.is_set()
        await layer.group_send(GROUP, nodes_changed(9))
        assert (await live.next("cluster.nodes_changed"))["nodes"] == [9]
    finally:
        hub.task.cancel()
        hub.beat.cancel()


async def test_a_console_too_far_behind_is_dropped_at_once(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REDIS_URL = ""
    monkeypatch.setattr(hub_module, "QUEUE_SIZE", 3)
    hub = Hub()
    stuck, live = Console(ready=False), Console()
    await hub.join(stuck, [GROUP])
    await hub.join(live, [GROUP])
    layer = get_channel_layer()
    try:
        for n in range(6):
            await layer.group_send(GROUP, nodes_changed(n))
        # Its queue (3) held the rest: one taken and waiting, three queued, the fifth over.
        await asyncio.wait_for(stuck.told.wait(), 1)
        assert stuck not in hub.boxes
        assert [(await live.next("cluster.nodes_changed"))["nodes"] for _ in range(6)] == [
            [n] for n in range(6)
        ]
    finally:
        hub.task.cancel()
        hub.beat.cancel()


async def test_every_console_hears_the_heartbeat_until_the_hub_stops(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REDIS_URL = ""
    monkeypatch.setattr(hub_module, "BEAT_S", 0.1)
    hub = Hub()
    nodes, judges = Console(), Console()
    await hub.join(nodes, [GROUP])
    await hub.join(judges, ["guard.judges"])
    try:
        for console in (nodes, judges):
            await console.next(BEAT)
            await console.next(BEAT)
        # The receive loop stops (as a hub that froze): no more heartbeats.
        hub.task.cancel()
        await asyncio.gather(hub.task, return_exceptions=True)
        for console in (nodes, judges):
            while not console.events.empty():
                console.events.get_nowait()
        with pytest.raises(TimeoutError):
            await nodes.next(BEAT, timeout=0.5)
    finally:
        hub.task.cancel()
        hub.beat.cancel()
