"""The Traffic page's first render shows the streams the process hears, not "No traffic":
the hub keeps the gateways' seconds as they arrive, whether or not a Traffic page is open,
and a process that has not heard the gateways for a whole span says it is listening."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

import llmgw_admin.consumer  # noqa: F401  (has the hub keep the gateways' seconds)
from gateway import live as gateway_live
from gateway.records.traffic import EDGES_MS, GROUP, TYPE, Window
from llmgw_admin.hub import Hub

pytestmark = pytest.mark.django_db(transaction=True)


def second(model: str, at: int) -> dict[str, Any]:
    zeros = [0] * (len(EDGES_MS) + 1)
    return {"process": "gw-1", "second": at, "model": model, "requests": 12, "errors": 0,
            "refusals": 0, "tokens_out": 240, "ttft": [12, *zeros[1:]], "tpot": zeros}  # fmt: skip


class Console:
    async def handle_event(self, event: dict[str, Any]) -> None: ...

    def beat(self) -> bool:
        return False

    async def layer_lost(self) -> None: ...

    async def behind(self) -> None: ...


@pytest.mark.asyncio
async def test_the_hub_keeps_the_gateways_seconds_with_no_traffic_page_open(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REDIS_URL = ""
    window = Window()
    monkeypatch.setattr(gateway_live, "WINDOW", window)
    monkeypatch.setattr(gateway_live, "_rendered", None)
    hub = Hub()
    page = Console()
    await hub.join(page, [GROUP])  # a Traffic page opened, then left
    hub.leave(page)
    window.listen(time.time() - 10)
    now = int(time.time())
    await get_channel_layer().group_send(GROUP, {"type": TYPE, "id": "t", "models": [
        second("chat", now - 1)]})  # fmt: skip
    try:
        async with asyncio.timeout(2):
            while not window.items:
                await asyncio.sleep(0.01)
    finally:
        hub.task.cancel()
        hub.beat.cancel()
    html = await sync_to_async(gateway_live.render_traffic)(now + 0.5)
    await sync_to_async(lambda: connection.close())()  # the render thread's, before teardown
    assert 'data-traffic="chat"' in html and "No traffic" not in html


def test_an_empty_window_says_no_traffic_only_once_heard_for_a_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    window = Window()
    monkeypatch.setattr(gateway_live, "WINDOW", window)
    monkeypatch.setattr(gateway_live, "_rendered", None)
    now = time.time()
    assert "Listening to the gateways" in gateway_live.render_traffic(now)
    assert "No traffic" not in gateway_live.render_traffic(now)
    window.listen(now - 10)
    monkeypatch.setattr(gateway_live, "_rendered", None)
    assert "No traffic in the last 5 seconds" in gateway_live.render_traffic(now)
