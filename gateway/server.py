"""``manage.py gateway serve``: the gateway alone on uvicorn, as many processes as a site
needs behind any load balancer. It answers ``/v1/``, ``/metrics`` and ``/healthz`` only
(``gateway.asgi``).

The address is checked and bound here before anything starts (``listen``), so a port out
of range, an address that is not this machine's or a port in use is refused with what to
write instead, and the port a ``--port 0`` was given is known. Once uvicorn serves on
that socket, the table's reader starts (so ``/healthz`` turns ready with no traffic) and
one line says where: ``gateway serving on http://H:P/v1/ (pid N)``.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

APP = "gateway.asgi:application"
KEEP_ALIVE = 75
GRACE = 30
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


class AddressRefused(ValueError):
    """An address the gateway cannot serve on; the text says what to write instead."""


def listen(bind: str, port: int) -> socket.socket:
    """Return a socket bound to ``bind``:``port`` (uvicorn listens on it), or raise
    ``AddressRefused``. A host name binds its first address."""
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
    from gateway import history, refusals, usage
    from guard import records

    signal.signal(signal.SIGTERM, _exit)
    # The guard's decisions on this process's traffic, its usage and its refusal records,
    # written off the request path.
    records.start()
    usage.start()
    history.start()
    refusals.start()
    _Server(config(), lambda: _listening(sock, say)).run(sockets=[sock])


def config() -> uvicorn.Config:
    """The server's settings (the socket is ``listen``'s)."""
    from gateway import listener

    return uvicorn.Config(
        APP,
        lifespan="off",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        # Headers and bodies read within their timeouts (gateway.listener); idle
        # kept-alive connections closed after KEEP_ALIVE.
        http=listener.from_settings(),
        timeout_keep_alive=KEEP_ALIVE,
        timeout_graceful_shutdown=GRACE,
    )  # fmt: skip


class _Server(uvicorn.Server):
    """uvicorn's server, which calls ``listening`` once it accepts connections."""

    def __init__(self, config: uvicorn.Config, listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._listening = listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._listening()


def _listening(sock: socket.socket, say: Callable[[str], None]) -> None:
    # The table's reader starts now, not with the first request: a load balancer's
    # /healthz sees this process ready once it has read the table (gateway.health).
    from gateway.asgi import assembly, state

    state.start(asyncio.get_running_loop())
    if assembly.traffic is not None:
        # Its load reported from now: requests waiting before any is answered count too.
        assembly.traffic.start()
    say(f"gateway serving on {where(sock)} (pid {os.getpid()})")


def _exit(signum: int, frame: Any) -> None:
    sys.exit(0)
