"""One request's life in the gateway, as uvicorn keeps a ``RequestResponseCycle`` beside
its protocol: what the client sent (its key, its body read, the catalog entry it named),
what is running for it (the guard's verdict on the request, the watch on the client),
and what the response has come to (its status, its first byte, its tokens, the replica
that answered). Each step of the walk (``gateway.path.app``, ``gateway.path.routing``,
``gateway.path.answer``, ``gateway.path.guarding``) takes the cycle instead of a handful of
parameters; the observers hear of it once, as it ends (``Gateway.done``).

Here too the small ASGI helpers the gateway's routes share: reading a bounded body,
answering an ``ApiError``, watching for the client going away.
"""

from __future__ import annotations

import asyncio
import json
import time
import types
from collections.abc import Awaitable, Callable, Generator
from random import getrandbits
from typing import TYPE_CHECKING, Any

from gateway.path import errors
from gateway.path.errors import ApiError
from llmgw_core import lean

if TYPE_CHECKING:
    from gateway.path import body as bodies
    from gateway.path.dialect import Dialect
    from gateway.path.table import Entry, Key

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = [(b"content-type", b"application/json")]
# What a request came to when its client went away before its answer ended (nginx's).
CLIENT_GONE = 499


class Cycle:
    """One request from its first byte to the observers' last word on it."""

    __slots__ = (
        # The response as sent so far.
        "send", "send_wait", "stalled", "started", "status", "outcome", "request_id",
        # What the observers are told (gateway.records.observe.Done).
        "start_at", "first_at", "engine_first_at", "model", "replica", "tokens_in",
        "tokens_out", "tokens_cached", "stream", "unreserved", "owner_reserved",
        # What the client sent, and what runs for it.
        "key", "entry", "req", "data", "raw", "verdict", "answers", "watcher",
        # The dialect the client speaks (gateway.path.dialect; None: chat's own routes).
        "dialect",
        # The client's x-session-id header, and the session the request names, scoped to
        # its key's owner (gateway.path.affinity; None: it names none).
        "session_header", "session",
        # The federated cluster that answers (x-llmgw-peer).
        "peer",
    )  # fmt: skip

    def __init__(self, send: Send, start_at: float | None = None) -> None:
        self.send = send
        # A client that takes none of the answer's bytes for this long (its socket's
        # buffers full) is taken as gone: the engine's connection is closed, as for one
        # that left (the gateway sets its option, LLMGW_HTTP_SEND_TIMEOUT).
        self.send_wait = 60.0
        self.stalled = False
        self.started = False
        self.status = 0  # the status sent (0: none yet)
        # What the request came to when not its status: 499 (the client went away before
        # the answer ended), 500 (the gateway failed after the head was sent).
        self.outcome = 0
        # The id the client gets (x-request-id, as OpenAI's API sends it); a refusal's
        # record carries it. Unique, not secret: drawn from the process's own generator
        # (seeded anew in each forked worker), not the system's, a call less per request.
        self.request_id = f"req_{getrandbits(96):024x}"
        self.start_at = time.perf_counter() if start_at is None else start_at
        # The client's first byte of text (after the guard's hold, when it holds), and
        # the engine's (its first token as it reached the gateway).
        self.first_at: float | None = None
        self.engine_first_at: float | None = None
        self.model = ""
        self.replica: int | None = None
        # The federated cluster that answers (a PEER/MODEL model's): x-llmgw-peer.
        self.peer = ""
        self.tokens_in = 0
        self.tokens_out = 0
        # Of tokens_in, those the engine read from its prefix cache (its usage's
        # prompt_tokens_details.cached_tokens; 0 when it says none).
        self.tokens_cached = 0
        self.stream = False
        self.unreserved = False  # a token budget reserved nothing for the answer
        # The owner's tokens reserved for it: (minute, tokens), settled as it ends.
        self.owner_reserved: tuple[int, int] | None = None
        self.key: Key | None = None
        self.entry: Entry | None = None
        self.req: bodies.Request | None = None
        self.data: dict[str, Any] = {}
        self.raw = b""  # the body as the client sent it
        self.session_header: str | None = None
        self.session: str | None = None
        self.verdict: asyncio.Task[dict[str, Any]] | None = None  # the guard's, running
        self.answers = False  # whether the policy judges answers
        self.watcher: asyncio.Task[None] | None = None
        self.dialect: Dialect | None = None

    @property
    def dialect_name(self) -> str:
        return self.dialect.name if self.dialect is not None else "chat"

    # The response.
    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        headers = [*headers, (b"x-request-id", self.request_id.encode())]
        if self.peer:
            headers.append((b"x-llmgw-peer", self.peer.encode()))
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = True, text: bool = True) -> None:
        """Send ``data``; ``text``: it carries the answer's text (its first such byte is
        the client's time to first token)."""
        if self.first_at is None and data and text:
            self.first_at = time.perf_counter()
        sending: Any = self.send({"type": "http.response.body", "body": data, "more_body": more})
        if isinstance(sending, types.CoroutineType):
            try:
                # Run until it waits: most sends never do (the bytes go to the transport's
                # buffer at once), and need no timer.
                waiting = sending.send(None)
            except StopIteration:
                return
            sending = _rest(sending, waiting)
        try:
            # It waits for the client to take what it was sent: the rest under a timer on
            # this task, not the task and event loop pass ``wait_for`` adds.
            async with asyncio.timeout(self.send_wait):
                await sending
        except TimeoutError:
            self.stalled = True
            raise ClientStalled(self.send_wait) from None

    async def json(self, status: int, value: Any) -> None:
        data = json.dumps(value, ensure_ascii=False).encode()
        await self.start(status, [*JSON, (b"content-length", str(len(data)).encode())])
        await self.body(data, more=False)

    async def error(self, error: ApiError) -> None:
        """Answer ``error`` unless the answer has begun (then it is too late to)."""
        if not self.started:
            self.status = error.status
            body = self.dialect.error_body(error) if self.dialect is not None else None
            await send_error(self.send, error, self.request_id, body)

    def engine_token(self) -> None:
        """The engine's first token reached the gateway (held or not)."""
        if self.engine_first_at is None:
            self.engine_first_at = time.perf_counter()

    # The client.
    def watch(self, receive: Receive) -> None:
        """From now a client that goes away cancels the task serving this request."""
        self.watcher = asyncio.create_task(watch_disconnect(receive, asyncio.current_task()))

    @property
    def client_gone(self) -> bool:
        return self.watcher is not None and self.watcher.done()

    def unwatch(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()


@types.coroutine
def _rest(coroutine: Any, waiting: Any) -> Generator[Any, None, Any]:
    """The rest of ``coroutine``, which has run up to its first wait (``waiting``, what it
    yielded to the task): each wait yielded to the task, as ``await`` would, and what the
    task throws in (a cancellation) thrown into it."""
    while True:
        try:
            yield waiting
        except BaseException as error:
            try:
                waiting = coroutine.throw(error)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            waiting = coroutine.send(None)
        except StopIteration as stop:
            return stop.value


class ClientStalled(Exception):
    """The client took none of the answer for ``Cycle.send_wait`` seconds."""


async def send_error(
    send: Send, error: ApiError, request_id: str = "", body: bytes | None = None
) -> None:
    """Answer ``error`` (``body``: in a dialect's shape; else OpenAI's)."""
    data = error.body() if body is None else body
    headers = [*JSON, (b"content-length", str(len(data)).encode())]
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    headers += [(k.encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def read_body(receive: Receive, limit: int, scope: Scope | None = None) -> bytes | None:
    """The whole body (None: the client went away first); 413 past ``limit``, at once
    (before any of it is read) when the request's ``Content-Length`` says so."""
    declared = content_length(scope) if scope is not None else None
    if declared is not None and declared > limit:
        raise errors.body_too_large(limit, declared)
    read = await lean.read_body(receive, limit)
    if read is None:
        return None
    body, more = read
    if more or len(body) > limit:
        raise errors.body_too_large(limit)
    return body


def content_length(scope: Scope) -> int | None:
    """The request's declared ``Content-Length`` (the server has checked it is a number
    when it framed the body by it); None when absent or unreadable."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (its first), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def bearer(scope: Scope) -> str | None:
    """The secret of ``Authorization: Bearer …``, else of ``x-api-key`` (as Anthropic's
    clients send it); None: neither header."""
    api_key = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else None
        if name == b"x-api-key":
            api_key = value.decode("latin-1").strip() or None
    return api_key


async def watch_disconnect(receive: Receive, task: asyncio.Task[Any] | None) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if task is not None and not task.done():
                task.cancel()
            return
