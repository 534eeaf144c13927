"""The agents' two hot calls on a lean path: an ASGI route in front of Django.

Every agent heartbeats every few seconds and reads its desired list every few heartbeats,
which makes these the web process's most frequent requests (bench/agents.py). Through
Django each paid for the middleware chain (WhiteNoise's is sync-only, so every request
hopped into a thread made for it), DRF's request, negotiation and authentication, and a
pooled connection held until the answer had been sent; and those threads' work stalled the
event loop that also holds the consoles' websockets. Here a call costs reading the body,
one JSON parse and the service's own queries (cluster.agentbeat.heartbeat_by_token: one
UPDATE for an unchanged inventory; node_for_token and desired_list), run on a small pool
of threads of its own, which also caps the database connections they take from the
process's pool.

Only a call that succeeds is answered here. Anything else (no token or an unknown one, a
body that is not a JSON object, a bad inventory, a host not in ``ALLOWED_HOSTS``, a
database error) goes to Django with its body, so that answer is the DRF view's word for
word (cluster.api.views). Those are rare and change nothing here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection

from cluster import agentbeat, agentinput, agentjoin
from cluster.address import peer_address
from llmgw_core import lean
from llmgw_core.lean import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

HEARTBEAT = "/api/v1/agent/heartbeat"
DESIRED = "/api/v1/agent/desired"
# A heartbeat is well under a kilobyte; a bigger body is Django's to judge.
MAX_BODY = 256 * 1024
# Threads doing these calls' database work, and so the most pooled connections they hold.
THREADS = 4

_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="agent-calls")


def _on_pool(function: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """Run ``function`` on the lean path's threads, its connection handed back after."""

    def run(*args: Any) -> Any:
        try:
            return function(*args)
        except agentinput.AgentError:
            return None  # Django answers it, with the view's words.
        finally:
            # Back to the pool after each call (the pool is shared with Django); a broken
            # connection is dropped there, so the next call gets a sound one.
            connection.close()

    return sync_to_async(run, thread_sensitive=False, executor=_executor)


@_on_pool
def _heartbeat(secret: str, body: bytes, address: str) -> dict[str, Any] | None:
    if b"\\u0000" in body:
        return None  # a NUL character, maybe: the view's parser says where, or takes it
    try:
        data = lean.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("inventory"), dict):
        return None
    try:
        beat = agentbeat.heartbeat_by_token(secret, data["inventory"], address)
    except agentinput.AgentError:
        return None  # a bad inventory: the view refuses it, saying what is wrong
    return beat.answer() if beat else None


@_on_pool
def _desired(secret: str, body: bytes, address: str) -> dict[str, Any] | None:
    node = agentjoin.node_for_token(secret)
    return agentbeat.desired_list(node) if node else None


ROUTES = {("POST", HEARTBEAT): _heartbeat, ("GET", DESIRED): _desired}
# Calls whose body this route reads (as JSON, as DRF's parser would); others carry none.
WITH_BODY = {_heartbeat}


class LeanAgentRoutes:
    """Answer agents' heartbeats and desired lists; pass every other request to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            handler = ROUTES.get((scope.get("method", ""), path))
        if handler is None:
            await self.app(scope, receive, send)
            return
        read = await lean.read_body(receive, MAX_BODY)
        if read is None:
            return  # The client went away before its body arrived: no one to answer.
        body, more = read
        answer = None
        headers = lean.headers(scope)
        secret = lean.bearer(headers)
        if (
            secret
            and not more
            and lean.allowed_host(headers)
            and (handler not in WITH_BODY or lean.json_body(headers))
        ):
            client = scope.get("client") or ("", 0)
            address = peer_address(
                str(client[0]),
                headers.get(b"x-forwarded-for", b"").decode("latin-1"),
                settings.LLMGW_TRUSTED_PROXIES,
            )
            try:
                answer = await handler(secret, body, address)
            except Exception:
                log.exception("%s failed on the lean path; Django answers it", scope["path"])
        if answer is None:
            await self.app(scope, lean.replay(body, more, receive), send)
            return
        data = json.dumps(answer, cls=DjangoJSONEncoder, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})
