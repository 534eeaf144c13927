"""A tiny real HTTP server for the clients' tests: each request is answered by a function
of the test (its path, headers and JSON body), whose answer is written as given, a
stream event by event."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    """What the server answers: a status, headers, and a body (bytes) or a stream
    (bytes written and flushed one part at a time)."""

    status: int = 200
    body: bytes = b""
    stream: Iterable[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


Handler = Callable[[Seen], Answer]


def json_answer(value: Any, status: int = 200) -> Answer:
    return Answer(status, json.dumps(value).encode(), headers={"content-type": "application/json"})


@contextmanager
def serving(handler: Handler) -> Iterator[tuple[str, list[Seen]]]:
    """Serve ``handler`` on a free port; yield the base URL and the requests seen."""
    seen: list[Seen] = []

    class Handle(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            request = Seen(self.path, {k.lower(): v for k, v in self.headers.items()},
                           json.loads(raw) if raw else None)  # fmt: skip
            seen.append(request)
            answer = handler(request)
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            if answer.stream is None:
                self.send_header("content-length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
                return
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for part in answer.stream:
                self.wfile.write(part)
                self.wfile.flush()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
