"""A live console's connection written to directly: the same framed bytes to every console.

Through ASGI, each console's copy of a message went its own way down the stack: Channels'
send, the session middleware's, uvicorn's, the ``websockets`` protocol's state checks and
its frame built afresh, then the socket; about 80 µs of a core a console for every change
and heartbeat, most of a fan-out to 1,000 consoles (bench/live.py, docs/console.md). A
server-to-client frame is not masked, so one message's frame is the same bytes for every
console: it is built once (``text_frame``, kept for the next console that sends the same
text) and written to each console's socket as it is (``Wire.write``).

Only under the server ``llmgw_admin.server`` runs (uvicorn's ``websockets-sansio``
protocol): ``Wired`` notes the connection in the scope as ``WIRE``; anything else
(Channels' test communicator, another server) sends through ASGI as before.

A console that takes nothing (a browser that reads nothing, a frozen tab) never holds a
send: a write never waits. Its bytes wait in the process instead, and once more than
``WRITE_LIMIT`` of them wait when another message is due, its connection is cut
(``abort``: the page sees the socket drop and reconnects, its snapshot showing what it
missed); no message is ever awaited on its behalf.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

log = logging.getLogger(__name__)

# The scope's key for a console's ``Wire`` (set by ``Wired``).
WIRE = "llmgw.wire"
# Bytes of earlier messages a console may leave unread in the process before the next
# message: past it, the connection is cut. A snapshot larger than this still goes out
# whole (the bound is checked before each write).
WRITE_LIMIT = 1 << 20
# Frames kept by their text, and the longest text kept (a snapshot is sent once).
FRAMES_KEPT = 64
FRAME_KEPT_MAX = 1 << 16

_frames: dict[str, bytes] = {}


def frame(data: bytes) -> bytes:
    """Return a text message as one unmasked, final websocket frame (RFC 6455, 5.2)."""
    n = len(data)
    if n < 126:
        head = struct.pack("!BB", 0x81, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x81, 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 127, n)
    return head + data


def text_frame(text: str) -> bytes:
    """Return the frame of ``text``, built once for every console sending the same text."""
    framed = _frames.get(text)
    if framed is None:
        framed = frame(text.encode())
        if len(text) <= FRAME_KEPT_MAX:
            if len(_frames) >= FRAMES_KEPT:
                _frames.clear()
            _frames[text] = framed
    return framed


class Wire:
    """One console's connection, under uvicorn's sans-I/O websocket protocol."""

    def __init__(self, protocol: WebSocketsSansIOProtocol) -> None:
        self.protocol = protocol

    def write(self, framed: bytes) -> bool:
        """Write one frame without waiting; False when it was not: the connection is
        closing or closed, or was cut just now (``WRITE_LIMIT`` bytes unread)."""
        protocol = self.protocol
        transport = protocol.transport
        if (
            not protocol.handshake_complete
            or protocol.close_sent
            or transport.is_closing()
            or protocol.conn.state is not State.OPEN
        ):
            return False
        waiting = transport.get_write_buffer_size()
        if waiting > WRITE_LIMIT:
            log.warning(
                "a live console left %d bytes unread (over %d): its connection is cut, "
                "it reconnects",
                waiting, WRITE_LIMIT,
            )  # fmt: skip
            transport.abort()
            return False
        transport.write(framed)
        return True


class Wired:
    """ASGI middleware: note a websocket's connection in the scope (``WIRE``) when uvicorn's
    sans-I/O protocol serves it, for ``Wire``."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        protocol = getattr(send, "__self__", None)
        if scope["type"] == "websocket" and isinstance(protocol, WebSocketsSansIOProtocol):
            scope = {**scope, WIRE: Wire(protocol)}
        return await self.application(scope, receive, send)
