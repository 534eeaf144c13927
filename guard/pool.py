"""Kept-alive HTTP/1.1 connections to judge engines, for the check's hot path.

Every guard check makes at least one HTTP call to a judge, and a gateway makes a check on
every request it serves, so what the call costs on top of the judge's own time is added
to every request. httpx's sync client cost about 1.5 ms of Python a call on these
machines where the standard library's ``http.client`` over a kept-alive connection cost
0.45 ms (a local server answering at once; bench/guard.py measures the check). A judge
call needs little of what httpx offers: one JSON POST, a timeout, connections kept
alive. This pool gives that and nothing more.

``Pool.post`` is shaped like ``httpx.Client.post`` as ``guard.client`` uses it (a URL, a
JSON body, a timeout in seconds; an answer with ``status_code``, ``text`` and
``json()``), so either can ask a judge. It is thread-safe: a connection is taken from the
pool for one call and given back after its answer has been read whole. A connection the
engine closed while it sat idle is found when it is used; the call is then made once
more on a new connection (a judgement changes nothing on the engine, so asking twice is
safe). Failures raise ``Timeout`` (no connection or no answer in time) or
``Unreachable`` (refused, reset, or not HTTP).

``AsyncPool`` does the same on an event loop (asyncio streams; uvloop's in the web
process), for the checks the web process answers without leaving its loop
(``guard.services.check_on_loop``): no thread to hand the check to and back, which cost
about 0.6 ms a check on these machines. Its connections belong to the loop that made
them.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

# Idle connections kept per engine: more than the checks one web process makes at once
# to one judge replica (its pool threads, guard.api.lean.THREADS) is never needed.
MAX_IDLE = 32
_USER_AGENT = "llmgw-guard"
_DEFAULT_PORT = {"http": 80, "https": 443}


class PoolError(Exception):
    """A call that got no answer."""


class Timeout(PoolError):
    """No connection, or no whole answer, within the time given."""


class Unreachable(PoolError):
    """The engine refused or dropped the connection, or did not speak HTTP."""


class Reply:
    """An engine's answer: its status and body."""

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


class Pool:
    """Connections to engines, kept alive between calls; safe to share between threads."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._idle: defaultdict[tuple[str, str, int], list[http.client.HTTPConnection]] = (
            defaultdict(list)
        )
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def post(
        self,
        url: str,
        *,
        json: Any,  # noqa: A002 (httpx's name)
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """POST ``json`` to ``url``, waiting at most ``timeout`` seconds a step.

        ``headers`` are sent besides the pool's own (the judge replica's engine key).

        Raises:
            Timeout: no connection or no answer in time.
            Unreachable: refused, reset, an answer that is not HTTP, or a URL that is
                not http(s)://host[:port]/path.
        """
        key, path = _split(url)
        body = _dumps(json)
        host = f"[{key[1]}]" if ":" in key[1] else key[1]
        headers = {
            "Host": host if key[2] == _DEFAULT_PORT[key[0]] else f"{host}:{key[2]}",
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
            **(headers or {}),
        }
        conn, reused = self._take(key, timeout)
        try:
            try:
                reply = _call(conn, path, body, headers, timeout)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                # The engine closed it while it sat idle: once more on a new connection.
                conn.close()
                conn, reused = self._connect(key, timeout), False
                reply = _call(conn, path, body, headers, timeout)
        except TimeoutError:
            conn.close()
            raise Timeout(f"no answer from {key[0]}://{key[1]}:{key[2]} in {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            conn.close()
            raise Unreachable(f"{key[0]}://{key[1]}:{key[2]}: {error!r}") from None
        except BaseException:
            conn.close()
            raise
        if reply.will_close:
            conn.close()
        else:
            self._give(key, conn)
        return Reply(reply.status, reply.content)

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()

    def _take(self, key: tuple[str, str, int], timeout: float) -> tuple[Any, bool]:
        with self._lock:
            conns = self._idle.get(key)
            if conns:
                return conns.pop(), True
        return self._connect(key, timeout), False

    def _give(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle[key]
            if len(conns) < self.max_idle:
                conns.append(conn)
                return
        conn.close()

    def _connect(self, key: tuple[str, str, int], timeout: float) -> http.client.HTTPConnection:
        scheme, host, port = key
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(host, port, timeout=timeout)


class _Answer:
    __slots__ = ("status", "content", "will_close")

    def __init__(self, status: int, content: bytes, will_close: bool) -> None:
        self.status = status
        self.content = content
        self.will_close = will_close


def _call(
    conn: http.client.HTTPConnection,
    path: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
) -> _Answer:
    """Send one request on ``conn`` and read its whole answer."""
    if conn.sock is None:
        conn.timeout = timeout
        conn.connect()
    else:
        conn.sock.settimeout(timeout)
    # One send: http.client writes a bytes body with its head.
    conn.request("POST", path, body, headers)
    response = conn.getresponse()
    content = response.read()
    return _Answer(response.status, content, bool(response.will_close))


class AsyncPool:
    """``Pool`` for one event loop: connections kept alive between calls on that loop."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._idle: defaultdict[tuple[str, str, int], list[_Stream]] = defaultdict(list)

    async def post(
        self,
        url: str,
        *,
        json: Any,  # noqa: A002
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """POST ``json`` to ``url`` within ``timeout`` seconds in all (``headers`` besides
        the pool's own).

        Raises:
            Timeout, Unreachable: as ``Pool.post``.
        """
        key, path = _split(url)
        body = _dumps(json)
        host = f"[{key[1]}]" if ":" in key[1] else key[1]
        host = host if key[2] == _DEFAULT_PORT[key[0]] else f"{host}:{key[2]}"
        message = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nAccept: application/json\r\n"
            f"User-Agent: {_USER_AGENT}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
            + "\r\n"
        ).encode("latin-1") + body
        conns = self._idle[key]
        stream: _Stream | None = None
        try:
            async with asyncio.timeout(timeout):
                while conns and conns[-1].reader.at_eof():
                    conns.pop().close()  # closed by the engine while idle, and seen
                reused = bool(conns)
                stream = conns.pop() if reused else await _open(key)
                try:
                    status, content, keep = await stream.exchange(message)
                except (_ClosedEarly, ConnectionResetError, BrokenPipeError):
                    if not reused:
                        raise
                    # The engine closed it while it sat idle: once more on a new connection.
                    stream.close()
                    stream = await _open(key)
                    status, content, keep = await stream.exchange(message)
        except TimeoutError:
            if stream is not None:
                stream.close()
            raise Timeout(f"no answer from {key[0]}://{key[1]}:{key[2]} in {timeout:g} s") from None
        except (OSError, ValueError, asyncio.IncompleteReadError, _ClosedEarly) as error:
            if stream is not None:
                stream.close()
            raise Unreachable(f"{key[0]}://{key[1]}:{key[2]}: {error!r}") from None
        except BaseException:
            if stream is not None:
                stream.close()
            raise
        if keep and len(conns) < self.max_idle:
            conns.append(stream)
        else:
            stream.close()
        return Reply(status, content)

    def close(self) -> None:
        """Close every idle connection."""
        for conns in self._idle.values():
            for stream in conns:
                stream.close()
        self._idle.clear()


class _ClosedEarly(ConnectionError):
    """The connection ended before an answer began."""


# How much of an answer's head is read at most (status line and headers).
_MAX_HEADERS = 100


class _Stream:
    """One connection: writes a request, reads its answer (HTTP/1.1, RFC 9112)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, message: bytes) -> tuple[int, bytes, bool]:
        """Send ``message``; return the answer's status, body and whether to keep the
        connection. Raises ValueError for what is not HTTP/1.x."""
        self.writer.write(message)
        line = await self.reader.readline()
        if not line:
            raise _ClosedEarly("the connection was closed before an answer")
        version, _, rest = line.partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise ValueError(f"not an HTTP answer: {line[:80]!r}")
        headers: dict[bytes, bytes] = {}
        for _ in range(_MAX_HEADERS):
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise asyncio.IncompleteReadError(b"", None)
            name, colon, value = line.partition(b":")
            if not colon:
                raise ValueError(f"not an HTTP header: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        else:
            raise ValueError(f"more than {_MAX_HEADERS} headers")
        connection = headers.get(b"connection", b"").lower()
        keep = connection != b"close" if version == b"HTTP/1.1" else connection == b"keep-alive"
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            content = await self._chunked()
        elif b"content-length" in headers:
            content = await self.reader.readexactly(int(headers[b"content-length"]))
        else:
            content, keep = await self.reader.read(), False  # the body ends with the connection
        return int(code), content, keep

    async def _chunked(self) -> bytes:
        parts = []
        while True:
            size = int((await self.reader.readline()).split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


_tls: ssl.SSLContext | None = None


async def _open(key: tuple[str, str, int]) -> _Stream:
    global _tls
    scheme, host, port = key
    if scheme == "https" and _tls is None:
        _tls = ssl.create_default_context()
    reader, writer = await asyncio.open_connection(
        host, port, ssl=_tls if scheme == "https" else None
    )
    return _Stream(reader, writer)


def _split(url: str) -> tuple[tuple[str, str, int], str]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in _DEFAULT_PORT or not parts.hostname or port == -1:
        raise Unreachable(f"{url!r} is not an http(s)://host[:port] URL")
    port = port or _DEFAULT_PORT[parts.scheme]
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return (parts.scheme, parts.hostname, port), path


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
