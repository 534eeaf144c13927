"""``GET /healthz`` (``gateway.path.health``) turning ready in one process: 503 while the
gateway's state has not read its table, 200 from its first read on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from gateway.path.health import HealthRoute, verdict
from gateway.path.table import Table
from gateway.records.state import State


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


def test_the_verdict_for_every_state() -> None:
    assert verdict(False, False, None, 300) == (503, b'{"status":"starting"}')
    assert verdict(True, False, 0.2, 300) == (200, b'{"status":"ok"}')
    assert verdict(True, True, 12.7, 300) == (200, b'{"status":"stale","age":12}')
    assert verdict(True, True, 300.0, 300) == (200, b'{"status":"stale","age":300}')
    assert verdict(True, True, 300.5, 300) == (503, b'{"status":"stale","age":300}')


class Database:
    """A loader that answers, refuses (raises at once) or hangs, as told."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.release = threading.Event()

    def __call__(self) -> Table:
        if self.mode == "refuse":
            raise ConnectionError("connection refused")
        if self.mode == "hang":
            self.release.wait(30)
        return Table()


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_a_state_that_cannot_read_again_is_stale_with_its_age_then_503_past_the_limit(
    fault: str, settings: Any
) -> None:
    settings.LLMGW_GATEWAY_STALE_LIMIT = 2
    database = Database()
    state = State(loader=database, interval=0.05, record_demand=lambda model: None,
                  read_timeout=0.2)  # fmt: skip

    async def scenario() -> None:
        app = HealthRoute(_not_for_me, state)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            state.start(asyncio.get_running_loop())
            assert await state.first_load(10)
            assert (await client.get("/healthz")).content == b'{"status":"ok"}'
            table = state.table
            database.mode = fault

            async def answer() -> tuple[int, dict[str, Any]]:
                got = await client.get("/healthz")
                return got.status_code, got.json()

            async def until(what: str, check: Any) -> tuple[int, dict[str, Any]]:
                for _ in range(1000):
                    got = await answer()
                    if check(got):
                        return got
                    await asyncio.sleep(0.01)
                raise AssertionError(f"/healthz never said {what}; last {got}")

            status, body = await until("stale", lambda g: g[1]["status"] == "stale")
            assert status == 200 and 0 <= body["age"] <= 2
            assert state.table is table  # the last table still serves
            status, body = await until("503", lambda g: g[0] == 503)
            assert body["status"] == "stale" and body["age"] >= 2
            assert state.failures >= 1
            database.mode = "ok"
            database.release.set()
            status, body = await until("ok", lambda g: g[1]["status"] == "ok")
            assert status == 200 and not state.stale
        state.stop()

    asyncio.run(scenario())
