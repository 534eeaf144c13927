"""Header and body read timeouts on every listener (the web process, ``gateway serve``).

uvicorn closes a kept-alive connection idle for ``timeout_keep_alive`` seconds, but has no
bound on how long a request's headers or body take to arrive: a client that opens a
connection and sends nothing, half its headers, or its body a byte at a time holds a
socket and (for a body) a request for as long as it likes; a few hundred such sockets
starve a process. ``protocol(header, body)`` is uvicorn's HTTP protocol (httptools) with
two timers of its own:

- the **header** timer runs from the connection's start, and on a kept-alive connection
  from the next request's first byte, until its headers are complete: past ``header``
  seconds the connection is closed (nothing was asked, so nothing is answered);
- the **body** timer runs from a request's headers until its body is complete: past
  ``body`` seconds the client is answered 408 (when nothing was answered yet) and the
  connection is closed; the application sees the client go away (``http.disconnect``).

A request whose whole body arrived is not timed further: an answer may stream for as
long as it streams (the gateway's own timeouts bound the engine's side). Websocket
upgrades are handed on once their headers are complete, as uvicorn does.

A timer is set only for what is still unread once the bytes received so far are parsed:
a request whose headers and body come in one read (most do) sets none, where it set and
cancelled two (a bound is its start time noted, and a timer made from it when the read
ends short).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADERS, BODY = "headers", "body"
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


class TimedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, with header and body read timeouts."""

    header_timeout = 10.0
    body_timeout = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading: str | None = None
        self._deadline = 0.0  # when what is being read is due (the loop's clock)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(HEADERS)
        self._time()  # nothing has come yet

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._reading is not None and self._read_timer is None:
            self._time()  # the read ended short of what is being read

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._reading is None:  # the connection's first request is timed from its start
            self._arm(HEADERS)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._arm(BODY)  # disarmed at once when the message is complete

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, what: str) -> None:
        """``what`` is being read from now: due within its timeout (timed by ``_time``
        when a read ends before it is complete)."""
        self._disarm()
        seconds = self.header_timeout if what == HEADERS else self.body_timeout
        self._reading = what
        self._deadline = self.loop.time() + seconds

    def _time(self) -> None:
        if not self.transport.is_closing():
            self._read_timer = self.loop.call_at(self._deadline, self._timed_out, self._reading)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer = None
        self._reading = None

    def _timed_out(self, what: str) -> None:
        self._read_timer = None
        self._reading = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if what == BODY and cycle is not None and not cycle.response_started:
            text = (f"The request's body did not arrive within {self.body_timeout:g} s of "
                    "its headers.\n").encode()  # fmt: skip
            self.transport.write(_TIMED_OUT % (len(text), text))
        self.transport.close()


def protocol(header: float, body: float) -> type[TimedHttp]:
    """uvicorn's HTTP protocol with these timeouts (seconds): pass it as ``http=``."""
    return type("TimedHttp", (TimedHttp,), {"header_timeout": float(header),
                                            "body_timeout": float(body)})  # fmt: skip


def from_settings(settings: Any) -> type[TimedHttp]:
    """``protocol`` with the settings' ``LLMGW_HTTP_HEADER_TIMEOUT`` and
    ``LLMGW_HTTP_BODY_TIMEOUT`` (``django.conf.settings`` or anything with those names)."""
    return protocol(settings.LLMGW_HTTP_HEADER_TIMEOUT, settings.LLMGW_HTTP_BODY_TIMEOUT)
