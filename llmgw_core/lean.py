"""ASGI helpers of the lean routes in front of Django (cluster.api.lean, guard.api.lean).

A lean route answers its hot call itself when the request is one it can answer exactly as
Django would (an allowed host, a JSON body, a bearer token) and hands everything else,
body replayed, to Django. These are the pieces both routes read a request with.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def headers(scope: Scope) -> dict[bytes, bytes]:
    """Return the request's headers by lower-case name (the first of each)."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", ()):
        headers.setdefault(name.lower(), value)
    return headers


# Each Host value already judged, and what it came to: the same value is judged the same
# while the settings are the same objects (a test's override replaces them), so a
# kept-alive client's requests judge their Host once. At most HOSTS_KEPT values (a client
# may send any): past that the judgements start again.
HOSTS_KEPT = 1024
_judged: dict[bytes, bool] = {}
_judged_by: list[Any] = [None, None]  # the ALLOWED_HOSTS and DEBUG they were judged by


def allowed_host(headers: dict[bytes, bytes]) -> bool:
    """Return whether Django would serve this host (else it is Django's to refuse)."""
    raw = headers.get(b"host")
    if settings.USE_X_FORWARDED_HOST and b"x-forwarded-host" in headers:
        raw = headers[b"x-forwarded-host"]
    if not raw:
        return False
    allowed, debug = settings.ALLOWED_HOSTS, settings.DEBUG
    if _judged_by[0] is not allowed or _judged_by[1] != debug or len(_judged) >= HOSTS_KEPT:
        _judged.clear()
        _judged_by[:] = allowed, debug
    known = _judged.get(raw)
    if known is None:
        known = _judged[raw] = _allowed(raw, allowed, debug)
    return known


def _allowed(raw: bytes, allowed: list[str], debug: bool) -> bool:
    domain, _ = split_domain_port(raw.decode("latin-1"))
    if debug and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def loads(body: bytes | str) -> Any:
    """Parse JSON; any unreadable body, too deeply nested ones too, raises ValueError.

    The standard parser raises RecursionError, not ValueError, for nesting past Python's
    recursion limit ("[" * 5000): a body a client sent must not become a 500.
    """
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def nul_at(doc: Any, path: str = "") -> str | None:
    """The path (``inventory.engines.vllm``) of the first text in ``doc`` holding a NUL
    character, which PostgreSQL cannot store in text or JSON; None if there is none."""
    if isinstance(doc, str):
        return (path or "(body)") if "\x00" in doc else None
    if isinstance(doc, list):
        for i, item in enumerate(doc):
            found = nul_at(item, f"{path}[{i}]")
            if found:
                return found
    elif isinstance(doc, dict):
        for key, item in doc.items():
            here = f"{path}.{key}" if path else str(key)
            found = nul_at(key, here) or nul_at(item, here)
            if found:
                return found
    return None


def json_body(headers: dict[bytes, bytes]) -> bool:
    """Return whether the body is declared JSON (DRF refuses other types with 415)."""
    kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    return kind == b"application/json"


def bearer(headers: dict[bytes, bytes]) -> str | None:
    """Return the token of an ``Authorization: Bearer`` header, or None."""
    parts = headers.get(b"authorization", b"").decode("latin-1").split()
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1]
    return None


async def read_body(receive: Receive, limit: int) -> tuple[bytes, bool] | None:
    """Return the body read so far and whether more is left (past ``limit``, when set).

    None: the client disconnected first.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False
        if limit and size > limit:
            return b"".join(chunks), True


def replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """Return a receive that gives the body already read, then the rest."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return again
