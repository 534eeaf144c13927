"""Stored responses of the Responses API: ``store``, ``previous_response_id``,
``GET``/``DELETE /v1/responses/{id}`` and ``/v1/responses/{id}/input_items``.

A response the client asked to store (``store`` defaults to true, as OpenAI's API has it)
is written to the database (``gateway.models.StoredResponse``) once its answer has ended,
off the request's path: on a few threads of its own, while the client already has its
answer. What is kept is what a later turn needs (the conversation's items: the history it
continued, its input, its output), the response object, and the owner of the key that
made it (a key with no owner: that key alone): every gateway process reads it, and only
keys of that owner.

The path reads the database only for a request that names a stored response
(``previous_response_id``, or the ``/v1/responses/{id}`` routes), bounded by
``READ_WAIT`` seconds: a write still under way in this process is awaited; one another
process may still be writing is looked for again within the bound; a store that answered
no read within it is told to the client as one that cannot be read now (503,
``Retry-After``), and a response that is not
there (never stored, another owner's, deleted, or older than ``LLMGW_RESPONSES_KEEP``
days and pruned: ``prune``) is a 400 naming ``previous_response_id`` (404 on its own
routes).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from gateway.models import StoredResponse
from gateway.path import body as bodies
from gateway.path import errors
from gateway.path.dialects import responses, sessions
from gateway.path.dialects.common import DialectError, new_id
from gateway.path.errors import ApiError

if TYPE_CHECKING:
    from gateway.path.cycle import Cycle
    from gateway.path.dialect import Responses
    from gateway.path.parts import Parts

log = logging.getLogger("gateway")

# The longest a request waits for a stored response it names.
READ_WAIT = 3.0
# Between two looks for a response another process may still be writing: the first
# pause, doubled after each look up to the most.
LOOK_AGAIN = 0.05
LOOK_AGAIN_MOST = 0.8
PRUNE_CHUNK = 1000
PREFIX = "/v1/responses/"

_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-responses")
# This process's writes under way, by response id (a next turn awaits its own).
_writing: dict[str, asyncio.Future[None]] = {}


class Unreadable(Exception):
    """The store could not be read within the bound."""


def _on_thread(work: Any, *args: Any) -> Any:
    try:
        return work(*args)
    finally:
        connection.close()


async def _run(work: Any, *args: Any, timeout: float) -> Any:
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_executor, _on_thread, work, *args)
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    except (TimeoutError, DatabaseError) as error:
        raise Unreadable(str(error) or "timeout") from error


# -- the database (on the store's threads) ------------------------------------------------


def _read(owner: str, response_id: str) -> dict[str, Any] | None:
    row = StoredResponse.objects.filter(id=response_id, owner=owner).first()
    if row is None:
        return None
    return {"response": row.response, "input": row.input, "conversation": row.conversation,
            "session": row.session}  # fmt: skip


def _write(row: dict[str, Any]) -> None:
    StoredResponse.objects.update_or_create(id=row.pop("id"), defaults=row)


def _delete(owner: str, response_id: str) -> int:
    return StoredResponse.objects.filter(id=response_id, owner=owner).delete()[0]


def prune(days: int | None = None, now: dt.datetime | None = None) -> int:
    """Delete stored responses older than ``days`` (``LLMGW_RESPONSES_KEEP``), in chunks;
    return how many went."""
    days = settings.LLMGW_RESPONSES_KEEP if days is None else days
    cutoff = (now or timezone.now()) - dt.timedelta(days=days)
    deleted = 0
    while True:
        ids = list(StoredResponse.objects.filter(created__lt=cutoff).order_by("created")
                   .values_list("pk", flat=True)[:PRUNE_CHUNK])  # fmt: skip
        if not ids:
            return deleted
        deleted += StoredResponse.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < PRUNE_CHUNK:
            return deleted


# -- on the path ------------------------------------------------------------------------


async def load(owner: str, response_id: str, *, look_again: bool) -> dict[str, Any] | None:
    """The stored response (None: not there for this owner), within ``READ_WAIT``;
    ``Unreadable`` when no read of the store ended within it. ``look_again``: one another
    process may still be writing is looked for until the bound, each look a little later
    than the last (``LOOK_AGAIN``, doubling up to ``LOOK_AGAIN_MOST``), and once a read
    has said "not there", the bound's end is that answer, not a 503."""
    deadline = time.monotonic() + READ_WAIT
    writing = _writing.get(response_id)
    if writing is not None and writing.get_loop() is asyncio.get_running_loop():
        try:
            await asyncio.wait_for(asyncio.shield(writing), READ_WAIT)
        except TimeoutError:
            raise Unreadable("the write of that response is still under way") from None
        except Exception:  # noqa: BLE001 - a failed write: read what is there
            log.debug("the write of %s failed", response_id, exc_info=True)
    pause = LOOK_AGAIN
    read_once = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            if read_once:
                return None
            raise Unreadable("timeout")
        try:
            row = await _run(_read, owner, response_id, timeout=left)
        except Unreadable:
            if read_once:
                return None  # the store said "not there"; a later look did not end in time
            raise
        read_once = True
        if row is not None or not look_again or deadline - time.monotonic() < pause:
            return row
        await asyncio.sleep(pause)
        pause = min(pause * 2, LOOK_AGAIN_MOST)


def scope(key: Any) -> str:
    """Whose a stored response is: the key's owner (a key with none: that key alone)."""
    return key.owner or f"key:{key.name}"


def unreadable(why: str) -> ApiError:
    return errors.store_unavailable(why)


async def before(cycle: Cycle, raw: bytes) -> None:
    """Read a ``POST /v1/responses`` body and, when it continues a stored response, that
    response's conversation (its history for the chat request)."""
    dialect: Responses = cycle.dialect  # type: ignore[assignment]
    try:
        data = bodies.parse(raw)
    except bodies.BodyError as error:
        raise errors.bad_request(error.message, error.param) from None
    request = dialect.read(data)
    try:
        dialect.named = sessions.session_of(data)
    except DialectError as error:
        raise errors.bad_request(error.message, error.param) from None
    previous = request.previous_response_id
    if not previous:
        return
    assert cycle.key is not None
    try:
        row = await load(scope(cycle.key), previous, look_again=True)
    except Unreadable as error:
        log.warning("%s: stored response %s unreadable: %s", cycle.request_id, previous, error)
        raise unreadable(str(error)) from None
    if row is None:
        raise errors.previous_response_not_found(previous, settings.LLMGW_RESPONSES_KEEP)
    dialect.history = list(row["conversation"])
    dialect.previous_session = row["session"] or None


def _with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as ``input_items`` lists them: each with an id."""
    out = []
    for item in items:
        item = dict(item)
        if not isinstance(item.get("id"), str):
            prefix = {"message": "msg_", "function_call": "fc_"}.get(item.get("type"), "fco_")
            item["id"] = new_id(prefix)
        out.append(item)
    return out


def after(parts: Parts, cycle: Cycle) -> None:
    """Keep the response the client had, when it asked to (off the request's path)."""
    dialect: Responses = cycle.dialect  # type: ignore[assignment]
    request, response = dialect.request, dialect.response
    if request is None or response is None or not request.store or cycle.key is None:
        return
    response_id = str(response["id"])
    session = sessions.chained(dialect.named, dialect.previous_session, response_id)
    row = {
        "id": response_id, "owner": scope(cycle.key), "key": cycle.key.name,
        "model": cycle.model, "created": timezone.now(), "session": session[:512],
        "response": response, "input": _with_ids(list(request.input)),
        "conversation": responses.conversation(dialect.history, request, response),
    }  # fmt: skip
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_executor, _on_thread, _write, row)
    _writing[response_id] = future

    async def written() -> None:
        try:
            await future
        except Exception:  # noqa: BLE001 - logged; the client had its answer
            log.exception("%s: storing response %s failed", cycle.request_id, response_id)
        finally:
            _writing.pop(response_id, None)

    parts.later(written())


# -- GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items ----------------


async def answer(cycle: Cycle, method: str, path: str, query: bytes = b"") -> None:
    rest = path[len(PREFIX) :]
    response_id, _, tail = rest.partition("/")
    if not response_id or tail not in ("", "input_items"):
        raise errors.not_found(path)
    allowed = "GET, DELETE" if not tail else "GET"
    if method not in allowed.split(", "):
        raise errors.method_not_allowed(path, allowed)
    key = cycle.key
    assert key is not None
    missing = errors.response_not_found(response_id)
    try:
        if method == "DELETE":
            deleted = await _run(_delete, scope(key), response_id, timeout=READ_WAIT)
            if not deleted:
                raise missing
            await cycle.json(200, {"id": response_id, "object": "response.deleted",
                                   "deleted": True})  # fmt: skip
            return
        row = await load(scope(key), response_id, look_again=False)
    except Unreadable as error:
        raise unreadable(str(error)) from None
    if row is None:
        raise missing
    if not tail:
        await cycle.json(200, row["response"])
        return
    await cycle.json(200, _listing(row["input"], query))


def _listing(items: list[dict[str, Any]], query: bytes) -> dict[str, Any]:
    """A page of input items, as the API lists them (``order``: desc by default,
    ``limit`` 1-100, ``after`` an item's id)."""
    asked = parse_qs(query.decode("latin-1"))
    order = (asked.get("order") or ["desc"])[0]
    if order not in ("asc", "desc"):
        raise errors.bad_request("order must be 'asc' or 'desc'", "order")
    raw_limit = (asked.get("limit") or ["20"])[0]
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
        raise errors.bad_request("limit must be a whole number from 1 to 100", "limit")
    ordered = items if order == "asc" else items[::-1]
    after = (asked.get("after") or [None])[0]
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after not in ids:
            raise errors.bad_request(f"after names no input item of this response: {after}",
                                     "after")  # fmt: skip
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[: int(raw_limit)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(ordered) > len(page)}  # fmt: skip
