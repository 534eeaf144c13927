"""The live console's websocket when Redis is cut, and its cap per user.

Through the real ASGI application and the production channel layer (channels-redis) on the
local Redis, behind a FaultProxy the test cuts: a console opened while Redis is away or
hung is accepted and closed with 1013 (the page retries), never an error; one over
``LLMGW_WS_PER_USER`` is closed with 1008 and a reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from llmgw_admin.consumer import LAYER_AWAY, TOO_MANY
from tests.faultproxy import FaultProxy
from tests.redisserver import url as redis_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

URL = redis_url(15)
ORIGIN = (b"origin", b"http://localhost")
PATH = "/ws/live/nodes,models,judges/"


@pytest.fixture
def proxy(settings: Any) -> Iterator[FaultProxy]:
    parts = urlsplit(URL)
    p = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 6379)).start()
    settings.REDIS_URL = f"redis://{p.address}{parts.path}"
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": f"t-{uuid.uuid4().hex[:8]}"},
        }
    }
    channel_layers.backends.clear()
    yield p
    p.stop()
    channel_layers.backends.clear()


def _cookie(user: Any) -> tuple[bytes, bytes]:
    c = Client()
    c.force_login(user)
    return (b"cookie", f"sessionid={c.cookies['sessionid'].value}".encode())


async def _console(user: Any) -> WebsocketCommunicator:
    from llmgw_admin.asgi import application

    cookie = await sync_to_async(_cookie)(user)
    return WebsocketCommunicator(application, PATH, headers=[ORIGIN, cookie])


@pytest.mark.parametrize("fault", ["refuse", "hang"])
async def test_a_console_opened_while_redis_is_cut_is_told_to_retry_not_failed(
    proxy: FaultProxy, fault: str, viewer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    getattr(proxy, fault)()
    comm = await _console(viewer)
    start = time.monotonic()
    connected, _ = await comm.connect(timeout=10)  # an exception here is the old HTTP 500
    assert connected
    closed = await comm.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": LAYER_AWAY}, closed
    assert time.monotonic() - start < 8  # the join's 2 s bound, on a loaded machine
    await comm.wait(timeout=5)
    traced = [r.getMessage() for r in caplog.records if r.exc_info]
    assert traced == [], traced

    proxy.heal()
    # The page retries as it was told; once the hub has joined the layer again (its join
    # is retried on a back-off), a retry gets the snapshot.
    deadline = time.monotonic() + 30
    while True:
        comm = await _console(viewer)
        connected, _ = await comm.connect(timeout=10)
        assert connected
        first = await comm.receive_output(timeout=10)
        if first["type"] == "websocket.send":
            break
        assert first == {"type": "websocket.close", "code": LAYER_AWAY}, first
        assert time.monotonic() < deadline, "no console got its snapshot once Redis was back"
        await comm.wait(timeout=5)
        await asyncio.sleep(0.5)  # the page's own pause before it reconnects
    assert 'id="cluster-models"' in first["text"]  # the snapshot
    await comm.disconnect()


async def test_a_user_past_the_cap_is_refused_with_a_reason_until_one_closes(
    viewer: Any, operator: Any, settings: Any
) -> None:
    settings.LLMGW_WS_PER_USER = 3
    open_ = []
    for _ in range(3):
        comm = await _console(viewer)
        assert (await comm.connect(timeout=10))[0]
        assert 'id="cluster-nodes"' in await comm.receive_from(timeout=10)
        open_.append(comm)
    over = await _console(viewer)
    assert (await over.connect(timeout=10))[0]
    closed = await over.receive_output(timeout=10)
    assert closed["type"] == "websocket.close" and closed["code"] == TOO_MANY, closed
    assert "too many live consoles open: at most 3" in closed["reason"]
    await over.wait(timeout=5)
    # Another user is not counted against this one.
    other = await _console(operator)
    assert (await other.connect(timeout=10))[0]
    assert 'id="cluster-nodes"' in await other.receive_from(timeout=10)
    # One closed: the next one is let in.
    await open_.pop().disconnect()
    again = await _console(viewer)
    assert (await again.connect(timeout=10))[0]
    assert 'id="cluster-nodes"' in await again.receive_from(timeout=10)
    for comm in [*open_, other, again]:
        await comm.disconnect()


async def test_channels_redis_failures_are_a_line_a_minute_without_a_traceback() -> None:
    """channels-redis logs a failed receive with its traceback once a second while Redis is
    away; the settings' filter keeps one line a minute, and lets other errors through."""
    import redis

    from llmgw_admin.hub import LayerAway

    layer_away = LayerAway()

    def record(exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("channels_redis.pubsub", logging.ERROR, __file__, 1,
                                 "Unexpected exception in receive task", None,
                                 (type(exc), exc, None))  # fmt: skip

    kept = [r for r in (record(redis.ConnectionError("reset")) for _ in range(5))
            if layer_away.filter(r)]  # fmt: skip
    assert len(kept) == 1 and kept[0].exc_info is None
    assert kept[0].getMessage().startswith("Unexpected exception in receive task (ConnectionError")
    other = record(ValueError("a bug"))
    assert layer_away.filter(other) and other.exc_info is not None
    # The settings put it on channels-redis's logger.
    assert any(isinstance(f, LayerAway) for f in logging.getLogger("channels_redis.pubsub").filters)


async def test_a_console_that_leaves_before_it_is_accepted_is_no_error_and_not_counted(
    viewer: Any, settings: Any
) -> None:
    """A browser that gives up while its console is being opened (a slow database, Redis
    away: seen in tests/e2e/faults/test_redis.py) makes uvicorn refuse the accept with a
    RuntimeError, its disconnect already queued. That is no error of ours, and the console
    it never had is not counted against its user."""
    from llmgw_admin.asgi import application

    settings.LLMGW_WS_PER_USER = 1

    async def gone_before_accept(scope: Any, receive: Any, send: Any) -> Any:
        async def uvicorn_after_connection_lost(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.accept":
                raise RuntimeError(
                    "Expected ASGI message 'websocket.send' or 'websocket.close', "
                    "but got 'websocket.accept'."
                )
            await send(message)

        return await application(scope, receive, uvicorn_after_connection_lost)

    cookie = await sync_to_async(_cookie)(viewer)
    gone = WebsocketCommunicator(gone_before_accept, PATH, headers=[ORIGIN, cookie])
    # As uvicorn hands them over: the connect, then the disconnect it queued.
    await gone.send_input({"type": "websocket.connect"})
    await gone.send_input({"type": "websocket.disconnect", "code": 1006})
    await gone.wait(timeout=10)  # raises what the application raised, if it did
    # The user's one console is still free.
    comm = await _console(viewer)
    assert (await comm.connect(timeout=10))[0]
    assert 'id="cluster-nodes"' in await comm.receive_from(timeout=10)
    await comm.disconnect()
