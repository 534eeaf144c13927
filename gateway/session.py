"""The console's chat page reaches the gateway with the signed-in user's session, no
client key in the page: ``POST /console/chat/v1/chat/completions`` (on the web process's
port only) is answered by the same ``Gateway`` as ``/v1/``, with the same routing,
guard, holdback and observer.

The session is read as Django reads it (the session store, then ``get_user``, which
checks the session's hash), on a thread: this is the console, not the clients' hot path.
A posted cookie needs more than itself: the ``X-CSRFToken`` header must match the CSRF
cookie (Django's own comparison) and the ``Origin``, when sent, must be this host.

The user acts as a pseudo-key ``console:<username>`` with owner ``console`` (so usage
and ``/metrics`` tell chat traffic apart): every cluster model, never a guard model,
never an external one, on any hop (a fallback or a canary is held to the same
scope: ``Key.may_reach``), at most ``LLMGW_CHAT_RPM`` requests a minute per user (shared by
the web processes through Redis in production, as keys' budgets are). Viewers and up may chat; a user with no role may not.
The answer's headers name what answered: ``x-llmgw-model`` and ``x-llmgw-replica``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from http.cookies import SimpleCookie
from importlib import import_module
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user
from django.db import DatabaseError, connection
from django.middleware.csrf import InvalidTokenFormat, _check_token_format, _does_token_match

from catalog.rules.names import shown
from gateway.path import body as bodies
from gateway.path import errors
from gateway.path.cycle import Cycle, read_body, send_error
from gateway.path.errors import ApiError
from gateway.path.table import Key
from llmgw_core.lean import headers
from llmgw_core.roles import VIEWER, has_role

if TYPE_CHECKING:
    from gateway.path.app import Gateway

log = logging.getLogger(__name__)

PATH = "/console/chat/v1/chat/completions"
OWNER = "console"


class SessionChat:
    """Chat for the console's session on ``PATH``; anything else to ``app``."""

    def __init__(self, app: Any, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") != PATH:
            await self.app(scope, receive, send)
            return
        if scope.get("method") != "POST":
            await send_error(send, errors.method_not_allowed(PATH, "POST"))
            return
        try:
            key = await asyncio.to_thread(_session_key, scope)
        except ApiError as error:
            await send_error(send, error)
            return
        await self._serve(receive, send, key)

    async def _serve(self, receive: Any, send: Any, key: Key) -> None:
        gateway = self.gateway
        if not await gateway.ready():
            await send_error(send, errors.starting())
            return
        cycle: Cycle

        async def send_naming(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                # shown(): a name stored before the catalog refused control characters
                # would make the header invalid, and the server drop the connection.
                extra = [(b"x-llmgw-model", shown(cycle.model).encode()),
                         (b"x-llmgw-replica", str(cycle.replica or "").encode())]  # fmt: skip
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        cycle = Cycle(send_naming, time.perf_counter())
        cycle.send_wait = gateway.options.send_timeout
        cycle.key = key

        async def chat() -> None:
            raw = await read_body(receive, gateway.options.max_body)
            if raw is None:
                return
            cycle.watch(receive)
            await gateway.complete(cycle, bodies.CHAT, raw)

        await gateway.serve(cycle, chat)  # a 500 with the request id, logged, when it fails


def _session_key(scope: dict[str, Any]) -> Key:
    """The signed-in user as a pseudo-key; ApiError (401/403) otherwise."""
    try:
        head = headers(scope)
        cookies = _cookies(head.get(b"cookie", b"").decode("latin-1"))
        origin = head.get(b"origin")
        host = head.get(b"host", b"")
        if origin is not None and origin.split(b"://", 1)[-1] != host:
            raise errors.chat_origin()

        store = import_module(settings.SESSION_ENGINE).SessionStore(
            cookies.get(settings.SESSION_COOKIE_NAME)
        )

        class _Request:
            session = store

        user = get_user(_Request())  # type: ignore[arg-type]
        if not user.is_authenticated:
            raise errors.chat_sign_in()
        if not has_role(user, VIEWER):
            raise errors.chat_no_role()
        # Signed in (a stranger is told to sign in first), and posting from this console.
        if not _csrf_ok(head.get(b"x-csrftoken", b"").decode("latin-1"),
                        cookies.get(settings.CSRF_COOKIE_NAME, "")):  # fmt: skip
            raise errors.chat_csrf()
        return Key(-user.pk, f"console:{user.get_username()}", OWNER, (), None,
                   rpm=int(settings.LLMGW_CHAT_RPM))  # fmt: skip
    except DatabaseError as error:
        # The console's sign-in lives in the database: while it is away the chat cannot
        # tell who is asking (the clients' /v1/ goes on from memory).
        log.warning("the console's chat could not read a session: %s", error)
        raise errors.chat_sessions_away() from None
    finally:
        connection.close()


def _csrf_ok(token: str, secret: str) -> bool:
    if not token or not secret:
        return False
    try:
        _check_token_format(token)
        _check_token_format(secret)
    except InvalidTokenFormat:
        return False
    return _does_token_match(token, secret)


def _cookies(header: str) -> dict[str, str]:
    jar = SimpleCookie()
    try:
        jar.load(header)
    except Exception:
        return {}
    return {k: m.value for k, m in jar.items()}
