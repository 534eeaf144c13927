"""A node's download of a mirror file on a lean path: an ASGI route in front of Django.

Every node that runs a model takes its weights from the mirror, gigabytes each, so the
web process's cost of a byte sent is paid on every byte of every model on every node.
Through Django (``updates.api.views.node_file``) a file went through the middleware chain and
the ASGI handler's streaming response: 0.62 CPU seconds a GB sent here, 1.5 GB/s to a
client that only receives; this route sends the same bytes at 0.35 (bench/mirror.py,
docs/updates.md). What it costs per request is the node token's lookup, the fetch and
the replica placed on the node (three queries, on a small pool of threads of its own).

Only a file that is sent (200, or 206 for a ``Range``; ``HEAD`` the same headers) is
answered here. Anything else (no token or an unknown one, a fetch or file the mirror does
not hold, a node the model is not placed on, a ``Range`` malformed or past the end, a host
not in ``ALLOWED_HOSTS``, a failure) goes to Django, so that answer is the view's, word
for word. The file is read off the event loop, ``CHUNK`` bytes at a time, and its reading
stops when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

from cluster.agentjoin import node_for_token
from llmgw_core import lean
from llmgw_core.lean import ASGIApp, Receive, Scope, Send
from updates.api import views as api

log = logging.getLogger(__name__)

FILES = "/api/v1/updates/mirror/files/"
# Bytes read and sent at a time (4 MB cost the least CPU a GB of 4 MB, 1 MB and 256 KB).
CHUNK = 4 << 20
# Threads looking up requests (and so the most pooled connections they hold) and reading
# files.
THREADS = 4

# What Django's SecurityMiddleware and XFrameOptionsMiddleware add to an answer.
_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="mirror-files")


def _find(secret: str, pk: int, path: str) -> api.Held | None:
    """Return the file a node's request asks for, or None (Django answers why not)."""
    try:
        node = node_for_token(secret)
        if node is None:
            return None
        held = api.held_file(node, pk, path)
        return held if isinstance(held, api.Held) else None
    finally:
        # Back to the pool after each call (shared with Django); a broken one is dropped.
        connection.close()


_find_on_pool = sync_to_async(_find, thread_sensitive=False, executor=_executor)


class MirrorFileRoute:
    """Send the mirror's files to nodes; pass every other request to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        asked = _asked(scope)
        if asked is None:
            await self.app(scope, receive, send)
            return
        pk, path = asked
        headers = lean.headers(scope)
        secret = lean.bearer(headers)
        held = None
        if secret and lean.allowed_host(headers):
            try:
                held = await _find_on_pool(secret, pk, path)
            except Exception:
                log.exception("%s failed on the lean path; Django answers it", scope["path"])
        if held is None:
            await self.app(scope, receive, send)
            return
        status, start, end = api.byte_range(headers.get(b"range", b"").decode("latin-1"), held.size)
        fh = None
        if status in (200, 206):
            # Gone since it was looked up (dropped meanwhile): Django says so.
            with contextlib.suppress(OSError):
                fh = open(held.path, "rb", buffering=0)  # noqa: ASYNC230, SIM115 (instant; closed below)
        if fh is None:
            await self.app(scope, receive, send)
            return
        with fh:
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (name.lower().encode(), value.encode("latin-1"))
                        for name, value in api.file_headers(held, status, start, end).items()
                    ]
                    + _HEADERS,
                }
            )
            if scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b""})
            else:
                await _send_file(fh, start, end, receive, send)


def _asked(scope: Scope) -> tuple[int, str] | None:
    """Return the fetch and file a request asks for, or None when it is not a file's."""
    if scope["type"] != "http" or scope.get("method") not in ("GET", "HEAD"):
        return None
    path = scope["path"].removeprefix(scope.get("root_path", ""))
    if not path.startswith(FILES):
        return None
    pk, _, rel = path[len(FILES) :].partition("/")
    # ASCII digits only ("²".isdigit() is true, and int() refuses it), and no more than a
    # row's id has: anything else is Django's to answer (404).
    if not (0 < len(pk) <= 18 and pk.isascii() and pk.isdigit()) or not rel:
        return None
    return int(pk), rel


async def _send_file(fh: Any, start: int, end: int, receive: Receive, send: Send) -> None:
    """Send bytes ``start`` to ``end`` of an open file, read on the pool; stop when the
    client goes away (the server tells it with ``http.disconnect``)."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch())
    loop = asyncio.get_running_loop()
    try:
        fh.seek(start)
        left = end - start
        while left > 0 and not gone.is_set():
            chunk = await loop.run_in_executor(_executor, fh.read, min(CHUNK, left))
            if not chunk:
                break  # the file shrank under it: the answer ends short, the client resumes
            left -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})
        if left > 0 and not gone.is_set():
            await send({"type": "http.response.body", "body": b""})
    finally:
        watcher.cancel()
