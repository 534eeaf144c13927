"""Header and body read timeouts on the listeners (``gateway.listener``), over real sockets
against real uvicorn: 300 connections holding half their headers and 30 sending their
bodies slowly are all closed once the timeouts pass, while the server goes on answering;
an answer that takes longer than the timeouts once the body arrived is not cut."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from gateway import listener
from llmgw_core import lean

HEADER, BODY = 1.0, 1.5


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the whole body (as the gateway does), then answer slowly when asked to."""
    read = await lean.read_body(receive, 1 << 20)
    if read is None:
        return  # the client went away (or was sent away)
    if scope["path"] == "/slow":
        await asyncio.sleep(BODY + HEADER + 0.5)  # longer than either timeout
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"read %d" % len(read[0])})


def _serve(protocol: Any) -> Iterator[tuple[str, int]]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                            http=protocol, timeout_keep_alive=75, backlog=2048)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield "127.0.0.1", port
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def timed() -> Iterator[tuple[str, int]]:
    yield from _serve(listener.protocol(HEADER, BODY))


def _closed_within(socks: list[socket.socket], seconds: float) -> tuple[int, list[bytes]]:
    """How many of ``socks`` the server closed within ``seconds``, and what it sent them."""
    selector = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    for s in socks:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
        got[s] = b""
    closed = 0
    deadline = time.monotonic() + seconds
    while closed < len(socks) and time.monotonic() < deadline:
        for found, _ in selector.select(timeout=0.1):
            s = found.fileobj
            try:
                data = s.recv(65536)  # type: ignore[union-attr]
            except ConnectionResetError:
                data = b""
            if data:
                got[s] += data  # type: ignore[index]
                continue
            selector.unregister(s)
            closed += 1
    selector.close()
    return closed, [got[s] for s in socks]


def test_half_headers_and_slow_bodies_are_closed_after_their_timeouts(
    timed: tuple[str, int],
) -> None:
    host, port = timed
    silent, partial, slow = [], [], []
    for n in range(300):
        s = socket.create_connection((host, port))
        if n % 2:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-A: ")
            partial.append(s)
        else:
            silent.append(s)  # connected, never a byte
    for _ in range(30):
        s = socket.create_connection((host, port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Length: 1000\r\n\r\n" + b"x" * 10)  # fmt: skip
        slow.append(s)
    # The server still answers meanwhile.
    assert httpx.post(f"http://{host}:{port}/", content=b"hi", timeout=10).text == "read 2"
    # Generous bound: the timeouts are 1 s and 1.5 s; a loaded machine is slow, not 30 s late.
    closed, sent = _closed_within(silent + partial + slow, 30)
    assert closed == 330, f"{330 - closed} of 330 connections still open"
    # A slow body is told why; half headers are not a request to answer.
    assert all(b" 408 " in s.split(b"\r\n", 1)[0] for s in sent[300:]), sent[300]
    assert all(s == b"" for s in sent[:300])


def test_a_slow_answer_after_a_whole_body_is_not_cut(timed: tuple[str, int]) -> None:
    host, port = timed
    got = httpx.post(f"http://{host}:{port}/slow", content=b"x" * 100, timeout=30)
    assert (got.status_code, got.text) == (200, "read 100")


def test_both_servers_use_the_timed_protocol(settings: Any) -> None:
    from gateway import server as gateway_server
    from llmgw_admin import server as web_server

    settings.LLMGW_HTTP_HEADER_TIMEOUT, settings.LLMGW_HTTP_BODY_TIMEOUT = 7, 9
    for config in (web_server.config("127.0.0.1", 0), gateway_server.config()):
        assert issubclass(config.http, listener.TimedHttp)
        assert (config.http.header_timeout, config.http.body_timeout) == (7, 9)
