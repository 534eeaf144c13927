"""``manage.py gateway serve``: the gateway alone on uvicorn, as many processes as a site
needs behind any load balancer. It answers ``/v1/``, ``/metrics`` and ``/healthz`` only
(``gateway.asgi``).

The address is checked and bound here before anything starts (``listen``), so a port out
of range, an address that is not this machine's or a port in use is refused with what to
write instead, and the port a ``--port 0`` was given is known. Once uvicorn serves on
that socket, the table's reader starts (so ``/healthz`` turns ready with no traffic) and
one line says where: ``gateway serving on http://H:P/v1/ (pid N)``.

With ``--workers N`` above 1 (``run_workers``) the process is a parent of N workers,
each serving as above on a socket of its own bound to the same address with
``SO_REUSEPORT`` (``llmgw_core.workers`` says why this way and how a worker that dies is
started again); the line says where once every worker accepts connections:
``gateway serving on http://H:P/v1/ (pid N; 2 workers: A, B)``.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import ipaddress
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn
from django.conf import settings

from gateway import listener
from gateway.records import history, refusals, usage
from guard import records
from llmgw_core import workers
from llmgw_core.refused import Refused

APP = "gateway.asgi:application"
KEEP_ALIVE = 75
GRACE = 30
# Objects allocated (less those freed) before the cycle collector's youngest pass (``_frozen``).
YOUNG = 20_000
# What ``--bind`` may name besides an IP address: a host name of RFC 1123's letters.
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")  # fmt: skip
_WRITE = (
    "write an address of this machine: 127.0.0.1 (this machine only), 0.0.0.0 (every IPv4 "
    "interface), :: (every interface) or one of its own addresses or host names"
)
# Said at start when LLMGW_REDIS_URL is unset (docs/gateway.md, "Client keys").
PER_PROCESS = (
    "warning: LLMGW_REDIS_URL is unset, so keys' budgets (--rpm, --tpm) are counted by "
    "each gateway process on its own: behind a load balancer N processes allow N times a "
    "key's budget (and each keeps its own admission allowance, ejected replicas and judge "
    "breakers). Set LLMGW_REDIS_URL to share them."
)


class AddressRefused(Refused, ValueError):
    """An address the gateway cannot serve on; the text says what to write instead."""


def listen(bind: str, port: int, *, shared: bool = False) -> socket.socket:
    """Return a socket bound to ``bind``:``port`` (uvicorn listens on it), or raise
    ``AddressRefused``. A host name binds its first address. ``shared``: bound with
    ``SO_REUSEPORT``, so each worker of ``run_workers`` binds the same address (a port
    another program listens on is still refused)."""
    if not 0 <= port <= 65535:
        raise AddressRefused(f"--port {port}: a port is 0 to 65535 (0 for any free port)")
    host = bind[1:-1] if bind.startswith("[") and bind.endswith("]") else bind
    if not _literal(host) and (not _HOST.match(host) or re.fullmatch(r"[0-9.]+", host)):
        raise AddressRefused(f"--bind {bind!r} is not an IP address or a host name: {_WRITE}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        raise AddressRefused(f"--bind {bind}: no such host ({error}): {_WRITE}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        raise AddressRefused(_bind_failed(bind, port, error)) from None
    return sock


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _bind_failed(bind: str, port: int, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (f"--bind {bind} --port {port}: the port is in use (another gateway process?): "
                "write another --port, or --port 0 for any free one")  # fmt: skip
    if error.errno == errno.EADDRNOTAVAIL:
        return f"--bind {bind} is not an address of this machine: {_WRITE}"
    if error.errno == errno.EACCES:
        return (f"--port {port}: ports below 1024 need privileges this process lacks: write "
                "--port 1024 or more and let the load balancer or proxy "
                "listen on the low one")  # fmt: skip
    return f"--bind {bind} --port {port}: cannot listen there: {error.strerror or error}"


def where(sock: socket.socket) -> str:
    """The gateway's base URL on this socket (the port the system gave a ``--port 0``)."""
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1/"


def run(sock: socket.socket, say: Callable[[str], None]) -> None:
    """Serve on ``sock`` (from ``listen``) until SIGINT or SIGTERM; ``say`` the line that
    tells where, once it listens."""
    signal.signal(signal.SIGTERM, _exit)
    # The guard's decisions on this process's traffic, its usage and its refusal records,
    # written off the request path.
    records.start()
    usage.start()
    history.start()
    refusals.start()
    Server(config(), lambda: _listening(sock, say)).run(sockets=[sock])


def run_workers(
    sock: socket.socket, count: int, say: Callable[[str], None], warn: Callable[[str], None]
) -> int:
    """Serve on ``sock``'s address with ``count`` worker processes (``llmgw_core.workers``),
    each on a socket of its own bound with ``SO_REUSEPORT``; the parent keeps ``sock``
    (bound, not listening) so no other program takes the port while a worker restarts.
    Returns the parent's exit status after a stop."""
    host, port = sock.getsockname()[:2]
    url = where(sock)

    # Each worker imports the application itself, after the fork: what it builds names
    # its process (its load report's pid, its metrics' files) as it is made.
    def serve(ready: Callable[[], None]) -> None:
        sock.close()  # the parent's
        run(listen(host, port, shared=True), lambda line: ready())

    def serving(pids: list[int]) -> None:
        say(f"gateway serving on {url} (pid {os.getpid()}; {count} workers: "
            f"{', '.join(map(str, pids))})")  # fmt: skip

    # Each worker drains within GRACE (uvicorn's bound); the parent waits a little more.
    return workers.Supervisor(count, serve, name="gateway", grace=GRACE + 5, say=say,
                              warn=warn, serving=serving).run()  # fmt: skip


def config() -> uvicorn.Config:
    """The server's settings (the socket is ``listen``'s)."""
    return uvicorn.Config(
        APP,
        lifespan="off",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        # Headers and bodies read within their timeouts (gateway.listener); idle
        # kept-alive connections closed after KEEP_ALIVE.
        http=coalescing(listener.from_settings(settings)),
        timeout_keep_alive=KEEP_ALIVE,
        timeout_graceful_shutdown=GRACE,
    )  # fmt: skip


class Writes:
    """A connection's transport whose writes made in one pass of the event loop leave in
    one system call, at the pass's end.

    uvicorn writes an answer's status line and headers when the application starts it,
    and its body when the application sends it: two ``send`` calls on the socket for
    every whole answer, the same request's two halves, one after the other. A profile
    of the gateway under load had those writes as a quarter of its time. Written here,
    they are joined and leave together once the task that wrote them yields; a stream's
    events, written in passes of their own, leave one by one as before. Everything else
    is the transport's own; a close sends what is pending first.
    """

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def coalescing(http: type[Any]) -> type[Any]:
    """``http`` (uvicorn's protocol, ``gateway.listener``'s timeouts) writing through
    ``Writes``."""

    def connection_made(self: Any, transport: asyncio.Transport) -> None:
        http.connection_made(self, Writes(transport, self.loop))

    return type("CoalescingHttp", (http,), {"connection_made": connection_made})


class Server(uvicorn.Server):
    """uvicorn's server, which calls ``listening`` once it accepts connections."""

    def __init__(self, config: uvicorn.Config, listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._listening = listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._listening()


def _listening(sock: socket.socket, say: Callable[[str], None]) -> None:
    # Imported here: importing gateway.asgi builds the gateway; only a process serving it
    # alone does, once it listens.
    from gateway.asgi import assembly, state  # noqa: PLC0415

    # The table's reader starts now, not with the first request: a load balancer's
    # /healthz sees this process ready once it has read the table (gateway.path.health).
    _frozen()
    state.start(asyncio.get_running_loop())
    if assembly.traffic is not None:
        # Its load reported from now: requests waiting before any is answered count too.
        assembly.traffic.start()
    say(f"gateway serving on {where(sock)} (pid {os.getpid()})")


def _frozen() -> None:
    """Leave what the process holds once started out of the cycle collector's passes.

    Django, the application and their modules are some hundreds of thousands of objects
    that live as long as the process; each full pass of the collector walked them all,
    and a young generation of 700 objects (the default) started a pass every few
    requests: a profile under load showed a tenth of the process's time in collections
    made at whatever line allocated. ``gc.freeze`` moves every object made so far to a
    generation no pass looks at, and a young generation of ``YOUNG`` objects runs the
    passes that remain less often (cyclic garbage waits a little longer to be freed).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])


def _exit(signum: int, frame: Any) -> None:
    sys.exit(0)
