"""``GET /healthz`` of a gateway process, for the load balancer in front of several.

200 ``{"status":"ok"}`` once the process has read its table (catalog, ready replicas,
keys: ``gateway.state.State.loaded``) the first time, 503 ``{"status":"starting"}``
before: until then every ``/v1/`` request would wait for it or be refused. It stays 200
after: a process that cannot read the database again keeps routing by the last table.

It is the one answer of a gateway process that needs no credential: a load balancer's
check carries none, and the answer tells nothing but those two words (no model, key,
replica, version or reason). ``HEAD`` answers the same without the body. It is not under
``/v1/``, which is the OpenAI API's.
"""

from __future__ import annotations

import asyncio
from typing import Any

PATH = "/healthz"
OK = b'{"status":"ok"}'
STARTING = b'{"status":"starting"}'


class HealthRoute:
    """``/healthz`` for anyone; anything else to ``app``."""

    def __init__(self, app: Any, state: Any) -> None:
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
        body = OK if loaded else STARTING
        await _answer(send, 200 if loaded else 503, body, b"application/json",
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
