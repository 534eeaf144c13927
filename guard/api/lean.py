"""The guard check on a lean path: an ASGI route in front of Django.

A gateway calls ``POST /api/v1/guard/check`` on every request it serves, so what the web
process adds to a judge's own time is added to every request. Through Django a check
paid for the middleware chain (WhiteNoise's is sync-only, so the request hopped into a
thread made for it), DRF's request, negotiation and rendering, and the ASGI handler's
own hops: about 11 ms where the judge took 4 (bench/guard.py). Here a check
costs reading the body, one JSON parse, the cached token (``guard.api.auth``) and the
check itself: on the event loop when the token, the policy and its judges are in memory
and the first judge answers (``guard.checks.check_on_loop``), else on a pool of
threads of its own (``guard.checks.check``: each judge's call blocks a thread for as
long as the judge takes), where a judge the loop asked is not asked again.

Only a check that succeeds is answered here, and with the same JSON as the DRF view.
Anything else (no bearer token or one that does not authenticate, a user without the
viewer role, a body that is not JSON or that ``read_check`` refuses, another content
type, a body over Django's limit, a host not in ``ALLOWED_HOSTS``, a failure) goes to
Django with its body, so that answer is the view's, word for word
(``guard.api.views.check``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from guard import checks
from guard.api.auth import token_user, token_user_in_memory
from guard.api.views import read_check
from llmgw_core import lean
from llmgw_core.lean import ASGIApp, Receive, Scope, Send
from llmgw_core.models import TOKEN_PREFIX
from llmgw_core.roles import VIEWER, has_role

log = logging.getLogger(__name__)

CHECK = "/api/v1/guard/check"
# Checks at once on the lean path: each holds a thread while its judges answer.
THREADS = 32


# What Django's SecurityMiddleware and XFrameOptionsMiddleware add to an answer.
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="guard-check")


def _check(secret: str, body: bytes, asked: checks.Asked | None = None) -> dict[str, Any] | None:
    """Return the check's answer, or None for Django to answer (on a pool thread)."""
    try:
        found = token_user(secret)
        if found is None or not has_role(found[0], VIEWER):
            return None
        read = _read(body)
        if read is None:
            return None
        return checks.check(*read, asked=asked)
    finally:
        # Back to the pool (shared with Django) if a snapshot or token was read.
        connection.close()


_check_on_pool = sync_to_async(_check, thread_sensitive=False, executor=_executor)


async def _answer(secret: str, body: bytes) -> dict[str, Any] | None:
    """Return the check's answer, or None for Django to answer.

    On the event loop when everything it needs is in memory and the first judge answers
    (``guard.checks.check_on_loop``); otherwise on a pool thread, where a judge
    already asked on the loop is not asked again.
    """
    found = token_user_in_memory(secret)
    read = _read(body) if found is not None and has_role(found[0], VIEWER) else None
    if read is None:
        return await _check_on_pool(secret, body)
    done = await checks.check_on_loop(*read)
    if isinstance(done, dict):
        return done
    # Bounded as the gateway's check is (gateway.path.guarding.Guard.judge): past it the
    # policy's fail decides, as if every judge timed out.
    bound = checks.check_bound()
    try:
        return await asyncio.wait_for(_check_on_pool(secret, body, done), bound)
    except TimeoutError:
        log.warning("a guard check got no answer within %g s: the policy's fail decides", bound)
        return checks.unanswered(*read, bound)


def _read(body: bytes) -> tuple[str, str | None] | None:
    """Return the texts a check's body asks about; None for what Django must refuse."""
    try:
        data = lean.loads(body)
    except ValueError:
        return None
    read = read_check(data)
    return None if isinstance(read, list) else read


class GuardCheckRoute:
    """Answer guard checks that succeed; pass every other request to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope["path"].removeprefix(scope.get("root_path", "")) == CHECK
        ):
            await self.app(scope, receive, send)
            return
        read = await lean.read_body(receive, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)
        if read is None:
            return  # The client went away before its body arrived: no one to answer.
        body, more = read
        answer = None
        headers = lean.headers(scope)
        secret = lean.bearer(headers)
        if (
            not more
            and secret is not None
            and secret.startswith(TOKEN_PREFIX)
            and lean.json_body(headers)
            and lean.allowed_host(headers)
        ):
            try:
                answer = await _answer(secret, body)
            except Exception:
                log.exception("a guard check failed on the lean path; Django answers it")
        if answer is None:
            await self.app(scope, lean.replay(body, more, receive), send)
            return
        data = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        encoded = data.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*_HEADERS, (b"content-length", str(len(encoded)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": encoded})
