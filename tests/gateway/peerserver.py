"""A small real HTTP server standing in for a federated peer: it answers ``/v1/models``
with the models it is given, on a port of its own, until it is stopped (then the port
refuses connections, as a peer that is down)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class PeerServer:
    def __init__(self, models: list[str]) -> None:
        self.models = models
        listing = json.dumps(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}
        ).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(listing)))
                self.end_headers()
                self.wfile.write(listing)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread: threading.Thread | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Answer again on the same port (after ``stop``)."""
        if self.thread is None:
            if self.server.socket.fileno() == -1:
                self.server = ThreadingHTTPServer(("127.0.0.1", self.port),
                                                  self.server.RequestHandlerClass)  # fmt: skip
                self.server.daemon_threads = True
            self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop answering: the port is closed (connections refused)."""
        if self.thread is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=5)
            self.thread = None
