"""``/v1/files`` and ``/v1/batches`` on the gateway's ``/v1/`` route.

The key is checked as for any request; every file and batch is its owner's (a key with no
owner: that key's alone, as stored responses are: ``gateway.stored.scope``). The disk is
read and written on a few threads of their own, each call bounded by ``WAIT`` seconds
(past it: 503 with ``Retry-After``); nothing here touches a chat request's path.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from django.conf import settings

from gateway import stored
from gateway.batch import lines, multipart, status, store
from gateway.path import errors
from gateway.path.cycle import bearer, header, read_body
from gateway.path.table import digest

if TYPE_CHECKING:
    from gateway.path.cycle import Cycle, Receive, Scope
    from gateway.path.parts import Parts

WAIT = 10.0
# Room for a form's headers and boundaries beside the file's bytes.
FORM_SLACK = 64 * 1024
FILES, BATCHES = "/v1/files", "/v1/batches"

_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gateway-batch")


def serves(path: str) -> bool:
    return path in (FILES, BATCHES) or path.startswith((FILES + "/", BATCHES + "/"))


async def _run(work: Any, *args: Any) -> Any:
    future = asyncio.get_running_loop().run_in_executor(_executor, work, *args)
    try:
        return await asyncio.wait_for(asyncio.shield(future), WAIT)
    except (TimeoutError, OSError) as error:
        raise errors.batch_store_away(
            str(settings.LLMGW_FILES_DIR), str(error) or "timeout"
        ) from error


def _owner(cycle: Cycle) -> str:
    assert cycle.key is not None
    return stored.scope(cycle.key)


def _query(scope: Scope) -> dict[str, str]:
    asked = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return {k: v[0] for k, v in asked.items()}


def _allow(path: str, method: str, allowed: str) -> None:
    if method not in allowed.split(", "):
        raise errors.method_not_allowed(path, allowed)


async def serve_files_and_batches(parts: Parts, cycle: Cycle, scope: Scope, receive: Receive, path: str,
                method: str) -> None:  # fmt: skip
    if path.startswith(FILES):
        await _files(parts, cycle, scope, receive, path, method)
    else:
        await _batches(parts, cycle, scope, receive, path, method)


def _page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    raw = query.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 10000:
        raise errors.bad_request("limit must be a whole number from 1 to 10000", "limit")
    after = query.get("after")
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise errors.bad_request(f"after names none of these: {after}", "after")
        items = items[ids.index(after) + 1 :]
    page = items[: int(raw)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page)}  # fmt: skip


# -- files --------------------------------------------------------------------------------


async def _files(parts: Parts, cycle: Cycle, scope: Scope, receive: Receive, path: str,
                 method: str) -> None:  # fmt: skip
    owner = _owner(cycle)
    if path == FILES:
        _allow(path, method, "GET, POST")
        if method == "GET":
            purpose = _query(scope).get("purpose")
            found = await _run(store.list_files, owner, purpose)
            await cycle.json(200, _page([store.shown_file(m) for m in found], _query(scope)))
            return
        await _upload(cycle, scope, receive, owner)
        return
    file_id, _, tail = path[len(FILES) + 1 :].partition("/")
    if tail not in ("", "content"):
        raise errors.not_found(path)
    missing = errors.file_not_found(file_id)
    if tail == "content":
        _allow(path, method, "GET")
        data = await _run(store.file_content, owner, file_id)
        if data is None:
            raise missing
        await cycle.start(200, [(b"content-type", b"application/octet-stream"),
                                (b"content-length", str(len(data)).encode())])  # fmt: skip
        await cycle.body(data, more=False, text=False)
        return
    _allow(path, method, "GET, DELETE")
    if method == "DELETE":
        if not await _run(store.delete_file, owner, file_id):
            raise missing
        await cycle.json(200, {"id": file_id, "object": "file", "deleted": True})
        return
    meta = await _run(store.get_file, owner, file_id)
    if meta is None:
        raise missing
    await cycle.json(200, store.shown_file(meta))


async def _upload(cycle: Cycle, scope: Scope, receive: Receive, owner: str) -> None:
    cap = settings.LLMGW_FILES_MAX_BYTES
    raw = await read_body(receive, cap + FORM_SLACK, scope)
    if raw is None:
        return  # the client went away
    try:
        parts = multipart.parse(raw, header(scope, b"content-type") or "")
    except multipart.FormError as error:
        raise errors.bad_request(str(error)) from None
    purpose = parts.get("purpose")
    if purpose is None or purpose.data.decode("utf-8", "replace") != "batch":
        told = "none" if purpose is None else repr(purpose.data.decode("utf-8", "replace"))
        raise errors.bad_request(f"purpose must be 'batch' (the purpose this gateway "
                                 f"serves); it is {told}", "purpose")  # fmt: skip
    upload = parts.get("file")
    if upload is None:
        raise errors.bad_request("the form has no file part", "file")
    if len(upload.data) > cap:
        raise errors.body_too_large(cap, len(upload.data))
    try:
        lines.check(upload.data, settings.LLMGW_FILES_MAX_LINES)
    except lines.LinesError as error:
        raise errors.invalid_file(str(error)) from None
    meta = await _run(store.save_file, owner, upload.filename or "upload.jsonl", "batch",
                      upload.data)  # fmt: skip
    await cycle.json(200, store.shown_file(meta))


# -- batches ------------------------------------------------------------------------------


async def _batches(parts: Parts, cycle: Cycle, scope: Scope, receive: Receive, path: str,
                   method: str) -> None:  # fmt: skip
    owner = _owner(cycle)
    if path == BATCHES:
        _allow(path, method, "GET, POST")
        if method == "GET":
            found = await _run(store.list_batches, owner)
            await cycle.json(200, _page([status.shown(b) for b in found], _query(scope)))
            return
        raw = await read_body(receive, parts.options.max_body, scope)
        if raw is None:
            return
        await _create(cycle, scope, owner, raw)
        return
    batch_id, _, tail = path[len(BATCHES) + 1 :].partition("/")
    if tail not in ("", "cancel"):
        raise errors.not_found(path)
    if tail == "cancel":
        _allow(path, method, "POST")
        batch = await _run(cancel, owner, batch_id)
        if batch is None:
            raise errors.batch_not_found(batch_id)
        await cycle.json(200, status.shown(batch))
        return
    _allow(path, method, "GET")
    batch = await _run(store.get_batch, owner, batch_id)
    if batch is None:
        raise errors.batch_not_found(batch_id)
    await cycle.json(200, status.shown(batch))


def cancel(owner: str | None, batch_id: str) -> dict[str, Any] | None:
    """Ask a batch to stop (``cancelling``; the runner ends it ``cancelled`` with what
    finished kept); one already ended stays as it is. None: not there for ``owner``."""
    if store.get_batch(owner, batch_id) is None:
        return None

    def change(batch: dict[str, Any]) -> dict[str, Any]:
        if status.CANCELLING not in status.NEXT.get(batch["status"], frozenset()):
            return batch
        return status.move(batch, status.CANCELLING, int(time.time()))

    return store.update(batch_id, change)


async def _create(cycle: Cycle, scope: Scope, owner: str, raw: bytes) -> None:
    try:
        data = json.loads(raw)
    except ValueError:
        raise errors.bad_request("the body is not JSON") from None
    if not isinstance(data, dict):
        raise errors.bad_request("the body must be a JSON object")
    input_file_id = data.get("input_file_id")
    if not isinstance(input_file_id, str) or not input_file_id:
        raise errors.bad_request("input_file_id is required: the id of a file uploaded with "
                                 "purpose 'batch'", "input_file_id")  # fmt: skip
    endpoint = data.get("endpoint")
    if endpoint not in lines.ENDPOINTS:
        raise errors.bad_request(f"endpoint must be one of {', '.join(lines.ENDPOINTS)}",
                                 "endpoint")  # fmt: skip
    window = data.get("completion_window")
    if window not in status.WINDOWS:
        raise errors.bad_request(f"completion_window must be one of "
                                 f"{', '.join(status.WINDOWS)}", "completion_window")  # fmt: skip
    try:
        metadata = status.metadata(data.get("metadata"))
    except ValueError as error:
        raise errors.bad_request(str(error), "metadata") from None
    held, scale = data.get("schedule_window", False), data.get("scale_up", False)
    if not isinstance(held, bool):
        raise errors.bad_request("schedule_window must be true (send the lines only while "
                                 "each line's model is inside one of its schedule windows) "
                                 "or false", "schedule_window")  # fmt: skip
    if not isinstance(scale, bool):
        raise errors.bad_request("scale_up must be true (load scaling may add replicas for "
                                 "the lines, up to the model's max) or false (they run on "
                                 "the replicas there are)", "scale_up")  # fmt: skip
    meta = await _run(store.get_file, owner, input_file_id)
    if meta is None or meta["purpose"] != "batch":
        raise errors.bad_request(f"input_file_id {input_file_id} names no file of purpose "
                                 "'batch' of this key's owner", "input_file_id")  # fmt: skip
    assert cycle.key is not None
    key_digest = digest(bearer(scope) or "")
    batch = status.new(
        store.new_batch_id(), input_file_id=input_file_id, endpoint=endpoint, window=window,
        metadata=metadata, now=int(time.time()), total=0, owner=owner, key=cycle.key.name,
        key_digest=key_digest,
    )  # fmt: skip
    if held:
        batch["schedule_window"] = True
    if scale:
        batch["scale_up"] = True
    await _run(store.save_batch, batch)
    await cycle.json(200, status.shown(batch))
