"""The sim engine's HTTP/1.1: reading a request, writing a JSON answer or a stream of
server-sent events.

Standard library only; no Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

_MAX_BODY = 32 * 1024 * 1024
_MAX_HEADERS = 100


# ---------------------------------------------------------------------------------------
# HTTP


class HttpError(Exception):
    """A request answered with an error status and the engines' error body."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", **extra: Any
    ):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"code": status, "message": message, "type": kind, **extra}}


@dataclass
class Request:
    """An HTTP request as read off the connection."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    reader: asyncio.StreamReader | None = None

    def json(self) -> dict[str, Any]:
        """Return the body as a JSON object.

        Raises:
            HttpError: 400, the body is not a JSON object.
        """
        try:
            value = json.loads(self.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"Invalid JSON in request body: {exc}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "The request body must be a JSON object")
        return value


class Malformed(Exception):
    """The connection sent something that is not HTTP/1.1; answer 400 and close."""


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    """Read one request, or return None when the client closed the connection."""
    try:
        return await _read_request(reader, writer)
    except ValueError:  # a line longer than the reader's limit
        raise Malformed("request line, header or chunk size too long") from None


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    line = await reader.readline()
    if not line.endswith(b"\n"):
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Malformed("malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    while True:
        header = await reader.readline()
        if not header.endswith(b"\n"):
            return None
        if header in (b"\r\n", b"\n"):
            break
        name, sep, value = header.decode("latin-1").partition(":")
        if not sep or len(headers) >= _MAX_HEADERS:
            raise Malformed("malformed headers")
        headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        size = 0
        while True:
            size_line = await reader.readline()
            try:
                length = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise Malformed("malformed chunked body") from None
            if length == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            size += length
            if size > _MAX_BODY:
                raise Malformed("request body too large")
            chunks.append(await reader.readexactly(length))
            await reader.readline()
        body = b"".join(chunks)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise Malformed("malformed Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise Malformed("request body too large")
        body = await reader.readexactly(length) if length else b""
    connection = headers.get("connection", "").lower()
    keep_alive = version == "HTTP/1.1" and connection != "close"
    return Request(method.upper(), target.split("?", 1)[0], headers, body, keep_alive, reader)


def _head(status: int, content_type: str, extra: str, keep_alive: bool) -> bytes:
    phrase = http.HTTPStatus(status).phrase
    close = "" if keep_alive else "Connection: close\r\n"
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\n{extra}{close}"
        "Server: llmgw-sim\r\n\r\n"
    ).encode("latin-1")


async def send_json(
    writer: asyncio.StreamWriter, status: int, payload: Any, keep_alive: bool
) -> None:
    """Write a whole JSON response."""
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    extra = f"Content-Length: {len(body)}\r\n"
    writer.write(_head(status, "application/json; charset=utf-8", extra, keep_alive) + body)
    await writer.drain()


async def send_stream(
    writer: asyncio.StreamWriter,
    events: AsyncIterator[dict[str, Any]],
    keep_alive: bool,
    typed: bool = False,
) -> None:
    """Write server-sent events, each ``data: {json}``, then ``data: [DONE]``, chunked;
    ``typed``: each under an ``event: <type>`` line, and no ``[DONE]`` (the Responses and
    Messages APIs' streams)."""
    extra = "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
    writer.write(_head(200, "text/event-stream; charset=utf-8", extra, keep_alive))

    def chunk(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode("latin-1") + data + b"\r\n"

    async with contextlib.aclosing(events):
        async for event in events:
            data = "data: " + json.dumps(event, ensure_ascii=False) + "\n\n"
            if typed:
                data = f"event: {event['type']}\n" + data
            writer.write(chunk(data.encode("utf-8")))
            await writer.drain()
    writer.write((b"" if typed else chunk(b"data: [DONE]\n\n")) + b"0\r\n\r\n")
    await writer.drain()
