"""The websocket origin check: a console page's own origin, scheme, host and port exact.

A browser sends ``Origin`` on every websocket it opens, and any page may open one to any
address: the session cookie goes with it. So a websocket is accepted only from the
console's own origin, the one its request reached (its ``Host``, a host Django allows,
and the scheme it came over), or from one listed in ``CSRF_TRUSTED_ORIGINS``, each
compared whole: ``http://127.0.0.1:8200.evil.example`` is not ``http://127.0.0.1:8200``,
nor is ``http://127.0.0.1:9999``. Channels' ``AllowedHostsOriginValidator`` compared the
host name alone. A connection without ``Host`` (an in-process test client; every HTTP
server passes the one HTTP/1.1 requires) is held to the allowed hosts on their default
ports. ``parse_origin`` and ``origin_allowed`` are plain functions; ``OriginCheck`` the
ASGI shell.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import validate_host

_DEFAULT_PORT = {"http": 80, "https": 443}
_ORIGIN = re.compile(
    r"(?P<scheme>https?)://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?"
)
_HOST = re.compile(r"(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?")

Origin = tuple[str, str, int]


def parse_origin(text: str) -> Origin | None:
    """Return (scheme, host, port) of a serialised origin (``http://host[:port]``, nothing
    after it), the port its scheme's default when not written; None for anything else."""
    m = _ORIGIN.fullmatch(text.strip())
    if m is None:
        return None
    scheme = m["scheme"].lower()
    port = int(m["port"]) if m["port"] else _DEFAULT_PORT[scheme]
    if not 0 < port < 65536:
        return None
    return scheme, m["host"].lower().rstrip("."), port


def request_origin(host_header: str, scheme: str) -> Origin | None:
    """Return the origin a request reached: its ``Host`` header over ``scheme``."""
    m = _HOST.fullmatch(host_header.strip())
    if m is None or scheme not in _DEFAULT_PORT:
        return None
    port = int(m["port"]) if m["port"] else _DEFAULT_PORT[scheme]
    return scheme, m["host"].lower().rstrip("."), port


def origin_allowed(
    origin: str,
    host_header: str | None,
    scheme: str,
    allowed_hosts: Iterable[str],
    trusted: Iterable[str] = (),
) -> bool:
    """Return whether a websocket from ``origin`` to a request with ``host_header`` (None:
    none sent) over ``scheme`` (http or https) is the console's own, or a trusted one."""

    got = parse_origin(origin)
    if got is None:
        return False
    if any(parse_origin(t) == got for t in trusted):
        return True
    hosts = list(allowed_hosts)
    if host_header is None:
        own = {
            (s, h.lower(), p)
            for s, p in _DEFAULT_PORT.items()
            for h in hosts
            if not h.startswith(".") and h != "*"
        }
        return got in own
    mine = request_origin(host_header, scheme)
    return mine is not None and got == mine and validate_host(mine[1], hosts)


class OriginCheck:
    """Refuse a websocket whose ``Origin`` is not the console's own (``origin_allowed``)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host")
        scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
        proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
        if proxy and headers.get(b"x-forwarded-proto", b"").decode("latin-1") == proxy[1]:
            scheme = "https"
        allowed = origin_allowed(
            origin,
            host.decode("latin-1") if host is not None else None,
            scheme,
            settings.ALLOWED_HOSTS,
            settings.CSRF_TRUSTED_ORIGINS,
        )
        if not allowed:
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
