"""``GET /healthz`` (``gateway.health``) turning ready in one process: 503 while the
gateway's state has not read its table, 200 from its first read on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from gateway.health import HealthRoute
from gateway.state import State
from gateway.table import Table


async def _not_for_me(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b"the gateway"})


def test_healthz_is_503_until_the_first_read_then_200() -> None:
    release = threading.Event()

    def loader() -> Table:
        release.wait(30)  # the database is slow to answer the first time
        return Table()

    state = State(loader=loader, record_demand=lambda model: None)

    async def scenario() -> None:
        app = HealthRoute(_not_for_me, state)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            # The first check starts the reader when nothing else had.
            before = await client.get("/healthz")
            assert (before.status_code, before.content) == (503, b'{"status":"starting"}')
            release.set()
            assert await state.first_load(10)
            after = await client.get("/healthz")
            assert (after.status_code, after.content) == (200, b'{"status":"ok"}')
            # Anything else is the gateway's, the credential checks with it.
            assert (await client.get("/healthz/")).status_code == 418
            assert (await client.get("/v1/models")).status_code == 418
        state.stop()

    asyncio.run(scenario())
