"""A body over the limit is refused before authentication, on every Django route: nothing
of it is read (with a Content-Length), or no more than the limit (without one)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

MB = 1 << 20
LIMIT = 2621440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE, the setting's default


async def _call(path: str, headers: list[tuple[bytes, bytes]], chunks: int, size: int = MB):
    from llmgw_admin.asgi import application

    read = 0
    sent: list[dict[str, Any]] = []

    done = asyncio.Event()  # set once the answer is sent: the client then goes away

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read >= chunks:
            await done.wait()  # Django listens for a disconnect until it has answered
            return {"type": "http.disconnect"}
        read += 1
        return {"type": "http.request", "body": b"x" * size, "more_body": read < chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"127.0.0.1:8200"), *headers],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8200),
    }  # fmt: skip
    await application(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, read


@pytest.mark.parametrize("path", ["/api/v1/catalog/models/", "/catalog/new/", "/admin/login/"])
async def test_a_200_mb_anonymous_body_is_refused_unread(path: str) -> None:
    length = str(200 * MB).encode()
    status, body, read = await _call(
        path, [(b"content-length", length), (b"content-type", b"application/json")], 200
    )
    assert status == 413 and read == 0
    assert f"over {LIMIT} bytes" in json.loads(body)["detail"]


async def test_a_body_without_a_length_is_read_no_further_than_the_limit() -> None:
    status, _, read = await _call("/api/v1/catalog/models/",
                                  [(b"content-type", b"application/json")], 200)  # fmt: skip
    assert status == 413 and read == LIMIT // MB + 1


async def test_a_small_anonymous_body_still_meets_authentication() -> None:
    status, _, _ = await _call(
        "/api/v1/catalog/models/",
        [(b"content-length", b"2"), (b"content-type", b"application/json")],
        1,
        size=2,
    )
    assert status in (401, 403)


async def test_a_length_that_is_no_number_is_refused() -> None:
    status, _, read = await _call("/api/v1/catalog/models/", [(b"content-length", b"1e9")], 1)
    assert status == 400 and read == 0
