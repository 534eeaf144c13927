"""The live consoles' frames written straight to their connections (``llmgw_admin.wire``),
under the server the web process runs (uvicorn, its sans-I/O websocket protocol) on real
sockets: each frame is one a websocket client reads back as the text sent; a console that
reads nothing is cut once its unread bytes pass the bound, while the console beside it
goes on hearing every heartbeat and change; and its page, which reconnects, is let in.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import uvicorn
import websockets
from asgiref.sync import sync_to_async
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from cluster import services
from llmgw_admin import consumer as consumer_module
from llmgw_admin import server, wire
from llmgw_admin.hub import BEAT, hub
from tests.cluster.helpers import join_node
from tests.llmgw_admin.test_live_ws import _cookie, redis_layer  # noqa: F401 (autouse)


def _read_frame(data: bytes) -> Frame:
    """Parse one frame as a websocket client does (``websockets``' own parser)."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        return done.value
    raise AssertionError("the frame was not complete")


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_a_frame_is_read_back_by_a_websocket_client_as_the_text_sent(size: int) -> None:
    text = "é" * (size // 4) + "x" * (size - 2 * (size // 4))  # ``size`` bytes in UTF-8
    read = _read_frame(wire.text_frame(text))
    assert read.opcode is Opcode.TEXT and read.fin
    assert read.data.decode() == text


@pytest_asyncio.fixture
async def served() -> AsyncIterator[int]:
    """The web process's server (``llmgw_admin.server.config``) on this test's event loop."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = server.config("127.0.0.1", port)
    uv = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(uv.serve(sockets=[sock]))
    async with asyncio.timeout(20):
        while not uv.started:
            await asyncio.sleep(0.01)
    yield port
    uv.should_exit = True
    async with asyncio.timeout(20):
        await task
    sock.close()


async def _console(port: int, user: Any, rcvbuf: int | None = None) -> Any:
    """A console's socket, signed in as ``user``; ``rcvbuf``: its receive buffer (small: a
    client that reads nothing fills it at once)."""
    name, value = await sync_to_async(_cookie)(user)
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    origin = f"http://127.0.0.1:{port}"
    return await websockets.connect(
        f"ws://127.0.0.1:{port}/ws/live/nodes/", sock=sock, open_timeout=10,
        additional_headers={name.decode(): value.decode(), "Origin": origin},
        ping_interval=None, max_queue=4,
    )  # fmt: skip


async def _members(count: int) -> list[Any]:
    """The hub's consoles once there are ``count`` of them, each sent its snapshot."""
    async with asyncio.timeout(10):
        while True:
            members = list(hub().boxes)
            if len(members) == count and all(m.ready.is_set() for m in members):
                return members
            await asyncio.sleep(0.01)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_console_that_reads_nothing_is_cut_and_the_other_hears_everything(
    served: int, viewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "WRITE_LIMIT", 16_384)
    monkeypatch.setattr(consumer_module, "BEAT_QUIET_S", 0.0)  # every heartbeat said
    node, _ = await sync_to_async(join_node)("gpu-w", ["nvidia-l4-24gb"])
    reader = await _console(served, viewer)
    assert f'id="cluster-node-{node.pk}"' in await asyncio.wait_for(reader.recv(), 10)
    stalled = await _console(served, viewer, rcvbuf=4096)  # never read from here on
    (far,) = [m for m in await _members(2) if m.scope["client"][1] == stalled.local_address[1]]
    # Its socket's buffer in the server's kernel kept small, as a slow link's fills: on
    # loopback the kernel would take megabytes first.
    far.wire.protocol.transport.get_extra_info("socket").setsockopt(
        socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
    )

    # Heartbeats handed to every console as the hub hands them, a burst at a time: the
    # reader takes each burst whole, while the stalled console's bytes pile up in the
    # process until it is cut.
    for _ in range(2000):
        for _ in range(20):
            hub().deliver({"type": BEAT})
        for _ in range(20):
            assert await asyncio.wait_for(reader.recv(), 5) == consumer_module.BEAT_TEXT
        if far not in hub().boxes:
            break
    assert far not in hub().boxes and len(hub().boxes) == 1

    # The reader still hears a change; the stalled socket was cut (no close handshake).
    await sync_to_async(services.set_cordon)(node, True)
    async with asyncio.timeout(10):
        while 'data-role="node-state">cordoned<' not in (frame := await reader.recv()):
            assert frame == consumer_module.BEAT_TEXT
    with pytest.raises(websockets.ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                await stalled.recv()
    # Its page reconnects and is let in, showing the change.
    again = await _console(served, viewer)
    assert 'data-role="node-state">cordoned<' in await asyncio.wait_for(again.recv(), 10)
    for ws in (reader, stalled, again):
        await ws.close()
