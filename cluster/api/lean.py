"""The agents' two hot calls on a lean path: an ASGI route in front of Django.

Every agent heartbeats every few seconds and reads its desired list every few heartbeats,
which makes these the web process's most frequent requests (bench/agents.py). Through
Django each paid for the middleware chain (WhiteNoise's is sync-only, so every request
hopped into a thread made for it), DRF's request, negotiation and authentication, and a
pooled connection held until the answer had been sent; and those threads' work stalled the
event loop that also holds the consoles' websockets. Here a call costs reading the body,
one JSON parse, and its share of a batch (cluster.beatwriter): the heartbeats of unchanged
inventories that gathered while the last batch was written are stamped in one statement
(cluster.agentbeat.write_stamps), and the desired lists' nodes looked up in another
(nodes_by_token); a node with nothing assigned is answered its empty list from that
lookup alone. A heartbeat the batch did not stamp (a changed inventory or address, no
node's token) and a desired list with replicas take the services as before
(heartbeat_changed, desired_list) on a small pool of threads of the route's own, which
also caps the database connections they take from the process's pool. With the
embedded SQLite each call takes the pool as before.

A call whose batch is not done within the connect timeout (``LLMGW_DB_CONNECT_TIMEOUT``:
PostgreSQL slow or away) is answered 503 with ``Retry-After`` (``SLOW``); one still
queued then is dropped, never written late. A batch that fails leaves each of its calls
to Django, as below.

Only a call that succeeds is answered here. Anything else (no token or an unknown one, a
body that is not a JSON object, a bad inventory, a host not in ``ALLOWED_HOSTS``, a
database error) goes to Django with its body, so that answer is the DRF view's word for
word (cluster.api.views). Those are rare and change nothing here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection

from cluster import agentbeat, agentinput, agentjoin, beatwriter
from cluster.address import peer_address
from cluster.models import NODE_PREFIX, Node, token_digest
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


def _run(items: Sequence[tuple[str, Any]]) -> list[Any]:
    """Do a batch of the coalescer's calls (on its thread): the stamps in one statement,
    the desired lists' nodes in another; a stamp given twice (an agent's two beats in one
    batch) is written once, with the later's figures, and both are answered alike."""
    stamps: dict[tuple[str, str, str], int] = {}
    stamp_list: list[agentbeat.Stamp] = []
    tokens: dict[str, int] = {}
    for kind, item in items:
        if kind == BEAT:
            key = (item.token, item.digest, item.address)
            if key in stamps:
                stamp_list[stamps[key]] = item
            else:
                stamps[key] = len(stamp_list)
                stamp_list.append(item)
        elif item not in tokens:
            tokens[item] = len(tokens)
    beats = agentbeat.write_stamps(stamp_list)
    nodes = agentbeat.nodes_by_token(list(tokens))
    return [
        beats.get(stamps[(item.token, item.digest, item.address)])
        if kind == BEAT
        else nodes.get(tokens[item])
        for kind, item in items
    ]


BEAT, NODE = "beat", "node"
_batches = beatwriter.Coalescer(_run, "agent-calls-batch")
# Answered when the batch holding a call was not done within the wait: the database is
# slow or away. The heartbeat may still be written late, or not: the agent's next one
# (its interval later) brings the same.
SLOW = {
    "detail": "The database did not answer in time (PostgreSQL is slow or away): this call "
    "was not answered. Heartbeat again at the next interval."
}
RETRY_AFTER = 5


def _postgresql() -> bool:
    # The settings, not the connection: this thread's connection is asgiref's Local, dear
    # to reach on every call. The embedded SQLite keeps a call a statement, on the pool.
    return bool(settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql")


def _wait() -> float:
    # A database that answers answers a batch well within the connect timeout.
    return float(settings.LLMGW_DB_CONNECT_TIMEOUT)


@_on_pool
def _beat_on_pool(secret: str, inventory: Any, address: str) -> dict[str, Any] | None:
    beat = agentbeat.heartbeat_by_token(secret, inventory, address)
    return beat.answer() if beat else None


@_on_pool
def _changed_on_pool(secret: str, inventory: Any, address: str) -> dict[str, Any] | None:
    beat = agentbeat.heartbeat_changed(secret, inventory, address)
    return beat.answer() if beat else None


async def _heartbeat(secret: str, body: bytes, address: str) -> Any:
    if b"\\u0000" in body:
        return None  # a NUL character, maybe: the view's parser says where, or takes it
    try:
        data = lean.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("inventory"), dict):
        return None
    inventory = data["inventory"]
    if not _postgresql():
        return await _beat_on_pool(secret, inventory, address)
    try:
        stamp = agentbeat.stamp_of(secret, inventory, address)
    except agentinput.AgentError:
        return None  # a bad inventory: the view refuses it, saying what is wrong
    if stamp is None:
        return None
    outcome = await _batches.call((BEAT, stamp), _wait())
    if outcome is beatwriter.GAVE_UP:
        return SLOW
    if outcome is beatwriter.FAILED:
        return None  # the view tries it alone (and answers 503 if the database is away)
    if outcome is None:
        # Not stamped: a changed inventory or address, or no node's token.
        return await _changed_on_pool(secret, inventory, address)
    return outcome.answer()


@_on_pool
def _desired_on_pool(secret: str) -> dict[str, Any] | None:
    node = agentjoin.node_for_token(secret)
    return agentbeat.desired_list(node) if node else None


@_on_pool
def _desired_of(pk: int, version: int) -> dict[str, Any]:
    return agentbeat.desired_list(Node(pk=pk, desired_version=version))


async def _desired(secret: str, body: bytes, address: str) -> Any:
    if not secret.startswith(NODE_PREFIX):
        return None
    if not _postgresql():
        return await _desired_on_pool(secret)
    outcome = await _batches.call((NODE, token_digest(secret)), _wait())
    if outcome is beatwriter.GAVE_UP:
        return SLOW
    if outcome is beatwriter.FAILED or outcome is None:
        return None  # the view answers: it refuses an unknown token
    pk, version, assigned = outcome
    if not assigned:
        return {"version": version, "replicas": []}
    return await _desired_of(pk, version)


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
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
        ]
        status = 200
        if answer is SLOW:
            status = 503
            headers.append((b"retry-after", str(RETRY_AFTER).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
