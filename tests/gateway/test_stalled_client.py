"""A client that stops reading its answer (its socket's buffers full): the gateway's
send to it waited for ever, holding the request and the engine's generation. Past
``LLMGW_HTTP_SEND_TIMEOUT`` (``Options.send_timeout``) it is taken as gone: its answer
ends, the engine's connection is closed, and it is counted as 499."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gateway import listener, server
from gateway.path.cycle import ClientStalled, Cycle
from tests.gateway.harness import KEY, Harness, model, wait


@pytest.fixture(params=["uvicorn's", "gateway serve's"])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Served by uvicorn's own HTTP protocol, and by ``gateway serve``'s (the read
    timeouts', writing a loop pass's writes in one call: ``gateway.server.Writes``)."""
    harness = Harness()
    if request.param == "gateway serve's":
        harness.http = server.coalescing(listener.protocol(10, 60))
    yield harness
    harness.close()


def test_a_client_that_stops_reading_is_given_up_on_and_the_engine_stopped(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.gateway.options.send_timeout = 1.0
    engine = h.engine("e", words=400_000)  # tens of megabytes: more than any buffer holds
    h.serve([model("m")], [(1, "m", engine)])
    body = json.dumps({"model": "m", "stream": True,
                       "messages": [{"role": "user", "content": "talk"}]}).encode()  # fmt: skip
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", h.port))
    try:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        # The answer begins; the client reads nothing more from now on.
        assert client.recv(15) == b"HTTP/1.1 200 OK"
        with caplog.at_level("INFO", logger="gateway"):
            wait(lambda: "the client took none of its answer for 1 s: given up" in caplog.text,
                 30, "the stalled client given up on")  # fmt: skip
        # The engine's connection was closed: it stopped generating, well short of the end.
        wait(lambda: not h.gateway.in_flight, 10, "the request to end")
    finally:
        client.close()


def test_a_send_that_waits_goes_on_when_the_client_takes_it_and_ends_when_it_leaves() -> None:
    """``Cycle.body`` runs a send until it waits (most never do) and only then times it:
    a send that waits for the client finishes once the client takes the bytes, one the
    client does not take in time is ``ClientStalled``, and a request cancelled while it
    waits (the client went away) cancels the send itself."""

    async def scenario() -> list[str]:
        seen: list[str] = []
        full, taken = asyncio.Event(), asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            if message["body"] != b"at once":
                full.set()  # the client's socket is full: the send waits
                try:
                    await taken.wait()
                except asyncio.CancelledError:
                    seen.append(f"{message['body'].decode()}: cancelled")
                    raise
            seen.append(f"{message['body'].decode()}: sent")

        cycle = Cycle(send)
        cycle.send_wait = 30.0
        async with asyncio.timeout(10):
            await cycle.body(b"at once")
            waiting = asyncio.ensure_future(cycle.body(b"taken"))
            await full.wait()
            taken.set()
            await waiting
            full.clear()
            taken.clear()
            left = asyncio.ensure_future(cycle.body(b"gone"))
            await full.wait()
            left.cancel()
            with pytest.raises(asyncio.CancelledError):
                await left
            cycle.send_wait = 0.05
            with pytest.raises(ClientStalled):
                await cycle.body(b"stalled")
        assert cycle.stalled
        return seen

    assert asyncio.run(scenario()) == [
        "at once: sent", "taken: sent", "gone: cancelled", "stalled: cancelled",
    ]  # fmt: skip
