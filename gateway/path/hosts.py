"""The ``Host`` check in front of ``/v1/`` and ``/metrics``, as the console's.

Django refuses a request whose ``Host`` is not in ``LLMGW_ALLOWED_HOSTS`` (a forged host
in links a page builds, DNS rebinding); the gateway's routes sit in front of Django and
answered any. ``HostCheck`` answers such a request with 400 and an OpenAI-shaped error
naming the host and the setting, before its key or body is read. ``/healthz`` is not
checked: a load balancer's check often names the backend by its address, and the answer
tells nothing. Everything else goes on to ``app`` (Django checks its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.path import errors
from gateway.records.observe import Done
from llmgw_core.lean import allowed_host, headers

if TYPE_CHECKING:
    from gateway.path.parts import Parts

CHECKED = ("/v1/", "/metrics", "/console/chat/")


def checked(path: str) -> bool:
    """Whether a request to ``path`` has its host checked here."""
    return path.startswith(CHECKED[0]) or path == CHECKED[1] or path.startswith(CHECKED[2])


class HostCheck:
    """Refuse (400) a ``/v1/`` or ``/metrics`` request for a host not allowed, counted as
    every status the gateway answers is (its ``parts``' observer, read at each refusal:
    /metrics and usage)."""

    def __init__(self, app: Any, parts: Parts | None = None) -> None:
        self.app = app
        self.parts = parts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and checked(scope.get("path", "")):
            found = headers(scope)
            if not allowed_host(found):
                error = errors.invalid_host(found.get(b"host"))
                data = error.body()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ]})  # fmt: skip
                await send({"type": "http.response.body", "body": data})
                if self.parts is not None:
                    self.parts.observer.request(Done(
                        model="", status=400, owner="", key="", seconds=0.0, ttft=None,
                        tokens_in=0, tokens_out=0, replica=None, stream=False,
                    ))  # fmt: skip
                return
        await self.app(scope, receive, send)
