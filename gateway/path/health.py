"""``GET /healthz`` of a gateway process, for the load balancer in front of several.

200 ``{"status":"ok"}`` once the process has read its table (catalog, ready replicas,
keys: ``gateway.records.state.State.loaded``) the first time, 503 ``{"status":"starting"}``
before: until then every ``/v1/`` request would wait for it or be refused.

A process that cannot read the database again serves from what it read last (the
table, the guard's policy and judges) and says so: 200 ``{"status":"stale","age":N}``
(N: whole seconds since its last good read) while N is within
``LLMGW_GATEWAY_STALE_LIMIT`` (300 s), then 503 with the same body, so a load balancer
moves on to a process that reads (if none does, it still serves: a load balancer with
every backend failing sends to them all).

It is the one answer of a gateway process that needs no credential: a load balancer's
check carries none, and the answer tells nothing but those words and the age (no model,
key, replica, version or reason). ``HEAD`` answers the same without the body. It is not
under ``/v1/``, which is the OpenAI API's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings

from gateway.path.table import Source

PATH = "/healthz"
OK = b'{"status":"ok"}'
STARTING = b'{"status":"starting"}'


def verdict(loaded: bool, stale: bool, age: float | None, limit: float) -> tuple[int, bytes]:
    """The status and body ``/healthz`` answers for a state: starting (503), ok (200),
    stale up to ``limit`` seconds old (200), staler (503)."""
    if not loaded:
        return 503, STARTING
    if not stale or age is None:
        return 200, OK
    body = b'{"status":"stale","age":%d}' % int(age)
    return (200 if age <= limit else 503), body


class HealthRoute:
    """``/healthz`` for anyone; anything else to ``app``."""

    def __init__(self, app: Any, state: Source) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH:
            await self.app(scope, receive, send)
            return
        method = scope.get("method")
        if method not in ("GET", "HEAD"):
            await _answer(send, 405, b"GET /healthz\n", b"text/plain; charset=utf-8",
                          [(b"allow", b"GET, HEAD")])  # fmt: skip
            return
        loaded = self.state.loaded
        if not loaded:
            # The server starts the table's reader when it listens (gateway.server); an
            # application served another way starts it with its first check.
            self.state.start(asyncio.get_running_loop())
        limit = settings.LLMGW_GATEWAY_STALE_LIMIT
        status, body = verdict(loaded, self.state.stale, self.state.age(), limit)
        await _answer(send, status, body, b"application/json",
                      head=method == "HEAD")  # fmt: skip


async def _answer(
    send: Any,
    status: int,
    body: bytes,
    kind: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
    head: bool = False,
) -> None:
    headers = [
        (b"content-type", kind),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})
