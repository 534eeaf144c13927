"""A console that has closed drops what was on its way to it: uvicorn refuses a send after
the close with a RuntimeError, which the hub logged with its traceback whenever Redis went
away (the console closes with LAYER_AWAY while an event is being rendered for it)."""

from __future__ import annotations

import asyncio
from typing import Any

from llmgw_admin.consumer import LAYER_AWAY, LiveConsumer


def test_a_closed_console_sends_nothing_more() -> None:
    async def scenario() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def base_send(message: dict[str, Any]) -> None:
            if sent and sent[-1]["type"] == "websocket.close":
                raise RuntimeError("Unexpected ASGI message 'websocket.send', after sending "
                                   "'websocket.close'.")  # fmt: skip
            sent.append(message)

        console = LiveConsumer()
        console.base_send = base_send
        console.ready = asyncio.Event()
        console.ready.set()
        await console.send(text_data="before")
        await console.close(code=LAYER_AWAY)
        await console.send(text_data="an event rendered meanwhile")
        await console.handle_event({"type": "cluster.nodes_changed", "id": "1"})
        return sent

    sent = asyncio.run(scenario())
    assert [m["type"] for m in sent] == ["websocket.send", "websocket.close"]
