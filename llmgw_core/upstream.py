"""Kept-alive HTTP/1.1 connections to engines, judges and providers, streamed, bounded,
cancellable: the one async HTTP client of the project's hot paths.

The gateway sends every request to an engine or a provider through one ``Upstream`` per
process (per event loop); the guard asks its judges through one per event loop too
(``guard.pool.AsyncPool``, which gives ``post_json``'s answer as ``Pool.post`` gives
it). httpx's ``AsyncClient`` does the same job and was measured in its place through
``bench/gateway.py``: it carried fewer requests a second and added more to
each (docs/gateway.md, "What it holds, and what it costs"), so this one stays.

 A request takes a connection of
its upstream (``scheme, host, port``) from the idle ones or opens one, at most
``max_per_upstream`` at once (more wait, bounded by the connect timeout); the answer's
head is awaited within the first-byte timeout; its body is read as it comes
(``Response.chunks``), through httptools' parser (chunked or sized bodies alike), with
reading paused while more than ``max_buffer`` bytes wait to be taken (the engine then
waits on TCP: no unbounded buffer). A response read to its end goes back to the idle
connections; one abandoned early is closed, which is how an engine is told to stop:
vLLM and llama-server cancel a request whose client went away.

Failures are ``UpstreamError``s with a ``kind``: ``connect`` (refused, unreachable, or no
connection in time: ``timed_out`` tells the last apart), ``timeout`` (no answer in time),
``broken`` (the connection failed mid-answer or the answer was not HTTP). Before any byte of an answer a request on a kept
connection that the engine had closed while idle is made once more on a new one.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httptools

CONNECT = "connect"
TIMEOUT = "timeout"
BROKEN = "broken"

MAX_PER_UPSTREAM = 256
MAX_IDLE = 64
MAX_BUFFER = 1 << 20
# URLs whose request line and Host are kept made (``Upstream.request``), at most.
MAX_TARGETS = 1024
_DEFAULT_PORT = {"http": 80, "https": 443}


class UpstreamError(Exception):
    def __init__(self, kind: str, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        # No answer, or no connection, within the time given.
        self.timed_out = timed_out or kind == TIMEOUT


Key = tuple[str, str, int]


def split(url: str) -> tuple[Key, str]:
    """The upstream's key and the request target of ``url``."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in _DEFAULT_PORT or not parts.hostname or port == -1:
        raise UpstreamError(CONNECT, f"{url!r} is not an http(s)://host[:port] URL")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return (parts.scheme, parts.hostname, port or _DEFAULT_PORT[parts.scheme]), path


def host_header(key: Key) -> str:
    """The ``Host`` an upstream is asked by: its port left out when the scheme's own, an
    IPv6 address in brackets."""
    scheme, host, port = key
    host = f"[{host}]" if ":" in host else host
    return host if port == _DEFAULT_PORT[scheme] else f"{host}:{port}"


class Reply:
    """A whole answer: its status and body (``httpx.Response``'s names for them)."""

    __slots__ = ("status_code", "content")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """Return the body read as JSON. Raises ValueError when it is not JSON."""
        return json.loads(self.content)


class _Conn(asyncio.Protocol):
    """One connection and the answer being read on it."""

    def __init__(self, key: Key, max_buffer: int) -> None:
        self.key = key
        self.max_buffer = max_buffer
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.used = False
        self.parser: httptools.HttpResponseParser | None = None
        self._reset()

    def _reset(self) -> None:
        """Ready for the next answer on this connection (one parser reads them all)."""
        if self.parser is None:
            self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.received = False
        self.paused = False
        self.until_close = False  # a body with no length nor chunks: it ends with the connection

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError(BROKEN, "the upstream asked to upgrade the connection"))
        except httptools.HttpParserError as error:
            self._fail(UpstreamError(BROKEN, f"the upstream's answer is not HTTP ({error})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.until_close and exc is None and not self.complete and self.error is None:
            self.complete = True  # (httptools has no call to say the stream ended)
            self._wake()
        if not self.complete:
            self._fail(UpstreamError(BROKEN, "the upstream closed the connection mid-answer"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Read here: llhttp's answer is not kept past the message's end.
        self.keep_alive = self.parser.should_keep_alive()
        framed = {n for n, _ in self.headers} & {b"content-length", b"transfer-encoding"}
        self.until_close = not framed and self.status not in (204, 304) and self.status >= 200
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > self.max_buffer and not self.paused and self.transport:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a request never awaited must not warn
        self._wake()
        if self.transport and not self.transport.is_closing():
            self.transport.close()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def next_data(self, timeout: float | None) -> bytes | None:
        """The body's bytes received since the last call; None at its end."""
        while not self.body:
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            loop = asyncio.get_running_loop()
            waiter = self.waiter = loop.create_future()
            timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
            try:
                await waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()
        data = self.body.popleft() if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self.paused and self.transport and not self.lost:
            self.paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def _within(future: asyncio.Future[None], timeout: float | None) -> None:
    """Await ``future`` for at most ``timeout`` seconds (TimeoutError), leaving it be: one
    timer, not the task and futures ``asyncio.wait_for`` makes."""
    if future.done() or timeout is None:
        await future
        return
    loop = asyncio.get_running_loop()
    gate = loop.create_future()

    def opened(_: object = None) -> None:
        if not gate.done():
            gate.set_result(None)

    future.add_done_callback(opened)
    timer = loop.call_later(timeout, opened)
    try:
        await gate
    finally:
        timer.cancel()
        future.remove_done_callback(opened)
    if not future.done():
        raise TimeoutError
    future.result()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamError(TIMEOUT, "the upstream stopped sending"))


class Response:
    """An answer's head, and its body as it arrives."""

    __slots__ = ("status", "headers", "_conn", "_pool", "_done", "read_timeout")

    def __init__(self, conn: _Conn, pool: Upstream, read_timeout: float | None) -> None:
        self.status = conn.status
        self.headers = conn.headers
        self._conn = conn
        self._pool = pool
        self._done = False
        self.read_timeout = read_timeout

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def next(self, timeout: float | None) -> bytes | None:
        """The body's bytes received since the last call, waiting at most ``timeout``
        seconds for some (``UpstreamError`` ``timeout``); None at its end."""
        return await self._conn.next_data(timeout)

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            while True:
                data = await self._conn.next_data(self.read_timeout)
                if data is None:
                    return
                yield data
        finally:
            self.release()

    async def read(self, limit: int = 64 << 20) -> bytes:
        """The whole body (at most ``limit`` bytes), the connection given back after it
        (as ``chunks`` does; read here without an async generator's frames)."""
        parts: list[bytes] = []
        size = 0
        try:
            while (data := await self._conn.next_data(self.read_timeout)) is not None:
                parts.append(data)
                size += len(data)
                if size > limit:
                    raise UpstreamError(BROKEN, f"the upstream's answer is over {limit} bytes")
        finally:
            self.release()
        return b"".join(parts)

    def release(self) -> None:
        """Give the connection back when the answer was read whole; else close it (the
        engine sees its client go and stops)."""
        if self._done:
            return
        self._done = True
        self._pool._give(self._conn)


class Upstream:
    def __init__(
        self,
        max_per_upstream: int = MAX_PER_UPSTREAM,
        max_idle: int = MAX_IDLE,
        max_buffer: int = MAX_BUFFER,
        credentials: Callable[[Key], str | None] | None = None,
    ) -> None:
        # The engine key an upstream asks for, by its key (``gateway.records.state.State.engine_key``):
        # sent as ``Authorization: Bearer`` on every request to it that names no
        # Authorization of its own (an external provider's).
        self.credentials = credentials
        self.max_per_upstream = max_per_upstream
        self.max_idle = max_idle
        self.max_buffer = max_buffer
        self._idle: dict[Key, list[_Conn]] = {}
        self._slots: dict[Key, asyncio.Semaphore] = {}
        self._tls: ssl.SSLContext | None = None
        # Each URL's upstream and the head's first lines (method, target, Host), made
        # once (split and written anew they cost each request about 10 us).
        self._targets: dict[tuple[str, str], tuple[Key, str]] = {}

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
        *,
        connect_timeout: float = 5.0,
        first_byte_timeout: float | None = 60.0,
        read_timeout: float | None = 60.0,
    ) -> Response:
        found = self._targets.get((method, url))
        if found is None:
            key, target = split(url)
            found = (key, f"{method} {target} HTTP/1.1\r\nHost: {host_header(key)}\r\n"
                          "Connection: keep-alive\r\n")  # fmt: skip
            if len(self._targets) >= MAX_TARGETS:
                self._targets.clear()
            self._targets[(method, url)] = found
        key, start = found
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = asyncio.Semaphore(self.max_per_upstream)
        if slots.locked():
            try:
                await asyncio.wait_for(slots.acquire(), connect_timeout)
            except TimeoutError:
                raise UpstreamError(CONNECT, "every connection to the upstream is busy",
                                    timed_out=True) from None  # fmt: skip
        else:
            await slots.acquire()  # free: returns at once
        head = [start]
        given = False
        for name, value in headers or ():
            head.append(f"{name}: {value}\r\n")
            given = given or name.lower() == "authorization"
        if not given and self.credentials is not None:
            secret = self.credentials(key)
            if secret:
                head.append(f"Authorization: Bearer {secret}\r\n")
        if body or method == "POST":
            head.append(f"Content-Length: {len(body)}\r\n")
        message = ("".join(head) + "\r\n").encode("latin-1") + body
        try:
            for attempt in range(2):
                conn, reused = await self._take(key, connect_timeout)
                conn.used = True
                assert conn.transport is not None
                try:
                    conn.transport.write(message)
                except RuntimeError:
                    # uvloop: the transport was closed under us (the peer went while the
                    # connection was idle) though it did not say so yet.
                    conn.close()
                    if reused and attempt == 0:
                        continue  # once more on a new connection
                    raise UpstreamError(BROKEN, "the upstream closed the connection") from None
                try:
                    await _within(conn.head, first_byte_timeout)
                except TimeoutError:
                    conn.close()
                    raise UpstreamError(TIMEOUT, "no answer from the upstream in time") from None
                except UpstreamError:
                    conn.close()
                    if reused and not conn.received and attempt == 0:
                        continue  # closed while idle: once more on a new connection
                    raise
                except asyncio.CancelledError:
                    conn.close()
                    raise
                return Response(conn, self, read_timeout)
            raise UpstreamError(BROKEN, "the upstream closed the connection")  # pragma: no cover
        except BaseException:
            slots.release()
            raise

    async def post_json(
        self, url: str, body: bytes, *, timeout: float, headers: list[tuple[str, str]]
    ) -> Reply:
        """POST a JSON ``body`` and read the whole answer, all within ``timeout`` seconds
        (a judge's call). Raises ``UpstreamError`` (``timed_out`` when out of time)."""
        try:
            async with asyncio.timeout(timeout):
                resp = await self.request("POST", url, body, [
                    ("Content-Type", "application/json"), ("Accept", "application/json"),
                    *headers,
                ], connect_timeout=timeout, first_byte_timeout=timeout, read_timeout=timeout)  # fmt: skip
                return Reply(resp.status, await resp.read())
        except TimeoutError:
            raise UpstreamError(TIMEOUT, f"no whole answer in {timeout:g} s") from None

    async def _take(self, key: Key, timeout: float) -> tuple[_Conn, bool]:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                conn._reset()
                return conn, True
        loop = asyncio.get_running_loop()
        scheme, host, port = key
        tls = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(key, self.max_buffer), host, port, ssl=tls),
                timeout,
            )
        except TimeoutError:
            raise UpstreamError(CONNECT, f"no connection to {host}:{port} in time",
                                timed_out=True) from None  # fmt: skip
        except OSError as error:
            raise UpstreamError(
                CONNECT, f"cannot connect to {host}:{port} ({error.strerror or error})"
            ) from None
        return conn, False

    def _give(self, conn: _Conn) -> None:
        slots = self._slots.get(conn.key)
        if slots is not None:
            slots.release()
        keep = conn.complete and not conn.lost and conn.keep_alive
        if not keep:
            conn.close()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        idle.append(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
