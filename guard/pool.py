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

``AsyncPool`` does the same on an event loop, for the checks the web process answers
without leaving its loop (``guard.checks.check_on_loop``): no thread to hand the check
to and back, which cost about 0.6 ms a check on these machines. It asks through the
project's one async HTTP client, ``llmgw_core.upstream.Upstream`` (the gateway's to its
engines), one per loop: its connections belong to the loop that made them.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from llmgw_core.upstream import Reply, Upstream, UpstreamError, host_header, split

# Idle connections kept per engine: more than the checks one web process makes at once
# to one judge replica (its pool threads, guard.api.lean.THREADS) is never needed.
MAX_IDLE = 32
_USER_AGENT = "llmgw-guard"


class PoolError(Exception):
    """A call that got no answer."""


class Timeout(PoolError):
    """No connection, or no whole answer, within the time given."""


class Unreachable(PoolError):
    """The engine refused or dropped the connection, or did not speak HTTP."""


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
        headers = {
            "Host": host_header(key),
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
    """``Pool`` for one event loop: connections kept alive between calls on that loop
    (``llmgw_core.upstream.Upstream``)."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self._upstream = Upstream(max_idle=max_idle)

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
        where = _where(url)
        asked = [("User-Agent", _USER_AGENT), *(headers or {}).items()]
        try:
            return await self._upstream.post_json(url, _dumps(json), timeout=timeout,
                                                  headers=asked)  # fmt: skip
        except UpstreamError as error:
            if error.timed_out:
                raise Timeout(f"no answer from {where} in {timeout:g} s") from None
            raise Unreachable(f"{where}: {error}") from None

    def close(self) -> None:
        """Close every idle connection."""
        self._upstream.close()


def _split(url: str) -> tuple[tuple[str, str, int], str]:
    try:
        return split(url)
    except UpstreamError as error:
        raise Unreachable(str(error)) from None


def _where(url: str) -> str:
    key, _ = _split(url)
    return f"{key[0]}://{key[1]}:{key[2]}"


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
