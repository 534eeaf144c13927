"""Every Django route refuses a body over the limit before anything reads it.

Django's ASGI handler reads a request's whole body (into a temporary file) before any
middleware or view runs, so the authentication and roles that refuse an anonymous caller
came after 200 MB were read. ``BodyLimit`` sits in front of Django: a ``Content-Length``
over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (the most Django would let a view read anyway) is
answered 413 at once, reading nothing; a body sent without one (chunked) is counted as it
arrives and refused as soon as it is over, the rest never read. A ``Content-Length`` that
is not a number is answered 400.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

Scope = dict[str, Any]

_DIGITS = frozenset(b"0123456789")


class _TooLarge(Exception):
    """A body without a length went over the limit while it was read."""


async def _answer(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _over(limit: int) -> str:
    return (
        f"the request body is over {limit} bytes, the most this server reads "
        "(DATA_UPLOAD_MAX_MEMORY_SIZE): send less"
    )


class BodyLimit:
    """Refuse an HTTP request whose body is over the limit (``limit``, else Django's
    ``DATA_UPLOAD_MAX_MEMORY_SIZE``; none when that is None) before the app reads it."""

    def __init__(self, app: Any, limit: int | None = None) -> None:
        self.app = app
        self.limit = limit

    def _limit(self) -> int | None:
        if self.limit is not None:
            return self.limit

        return settings.DATA_UPLOAD_MAX_MEMORY_SIZE

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> Any:
        limit = self._limit() if scope.get("type") == "http" else None
        if limit is None:
            return await self.app(scope, receive, send)
        length = next(
            (v for k, v in scope.get("headers", []) if k.lower() == b"content-length"), None
        )
        if length is not None:
            if not length or len(length) > 19 or not set(length) <= _DIGITS:
                return await _answer(send, 400, "Content-Length is not a number of bytes")
            if int(length) > limit:
                return await _answer(send, 413, _over(limit))
        received = 0
        started = False

        async def counted() -> Any:
            nonlocal received
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def watched(message: Any) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            return await self.app(scope, counted, watched)
        except _TooLarge:
            if not started:
                await _answer(send, 413, _over(limit))
