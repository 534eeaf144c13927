"""In front of the gateway: a foreign ``Host`` is refused on ``/v1/`` and ``/metrics`` as the
console refuses it (``gateway.path.hosts``), in both processes' assemblies; a body whose
``Content-Length`` is over the limit is refused with 413 before any of it is sent."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.path.health import HealthRoute
from gateway.path.hosts import HostCheck
from tests.gateway.harness import KEY, Harness, model


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.app = HealthRoute(HostCheck(harness.gateway), harness.state)
    yield harness
    harness.close()


def _raw(h: Harness, head: bytes, timeout: float = 15) -> bytes:
    """Send ``head`` (a request's headers, no body) and read what comes back."""
    with socket.create_connection(("127.0.0.1", h.port), timeout=timeout) as s:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            try:
                data = s.recv(65536)
            except TimeoutError:
                break  # nothing more within the bound
            if not data:
                break
            got += data
        return got


def test_a_declared_20_mb_body_is_refused_at_once(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    got = _raw(h, b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 20971520\r\n\r\n")  # fmt: skip
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), got[:200]
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large"
    assert "20971520" in error["message"] and str(16 << 20) in error["message"]


def test_a_declared_body_within_the_limit_is_read(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    data = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    got = httpx.post(h.url + "/v1/chat/completions", json=data,
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=30)  # fmt: skip
    assert got.status_code == 200, got.text


def test_a_foreign_host_is_refused_on_v1_with_a_clear_error(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=h.url, timeout=30) as c:
        got = c.get("/v1/models", headers={**auth, "Host": "evil.example"})
        assert got.status_code == 400
        error = got.json()["error"]
        assert error["code"] == "invalid_host"
        assert "'evil.example'" in error["message"] and "LLMGW_ALLOWED_HOSTS" in error["message"]
        assert c.get("/v1/models", headers={**auth, "Host": "localhost"}).status_code == 200
        assert c.get("/v1/models", headers=auth).status_code == 200  # 127.0.0.1:port
        # A load balancer's check names the backend as it likes: /healthz is not checked.
        assert c.get("/healthz", headers={"Host": "10.1.2.3"}).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["gateway.asgi", "llmgw_admin.asgi"])
def test_both_assemblies_refuse_a_foreign_host_on_v1_and_metrics(where: str) -> None:
    import importlib

    from gateway.records.observe import Observer

    module = importlib.import_module(where)
    application: Any = module.application
    heard = Observer()  # the counting listener every status reaches (/metrics and usage)
    saved, module.gateway.observer = module.gateway.observer, heard

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://evil.example") as c:
            for path in ("/v1/models", "/metrics"):
                got = await c.get(path, headers={"Authorization": f"Bearer {KEY}"})
                assert got.status_code == 400, (path, got.text)
                assert got.json()["error"]["code"] == "invalid_host"
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            got = await c.get("/metrics")  # allowed: the token is asked for
            assert got.status_code == 401

    import asyncio

    try:
        asyncio.run(scenario())
    finally:
        module.gateway.observer = saved
    # Each refusal is counted as any answer of the gateway is: two 400s, and the 401.
    assert heard.requests[("", 400, "")] == 2, heard.requests


def test_the_web_process_answers_healthz() -> None:
    from llmgw_admin import asgi

    http = asgi.application.application_mapping["http"]
    assert isinstance(http, HealthRoute) and http.state is asgi.gateway_state


def test_a_host_is_judged_again_when_the_allowed_hosts_change(h: Harness, settings) -> None:
    # A Host value is judged once and its answer kept (llmgw_core.lean): a change of
    # LLMGW_ALLOWED_HOSTS (here a test's override) must not be met with the old answer.
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=h.url, timeout=30) as c:
        assert c.get("/v1/models", headers={**auth, "Host": "api.example"}).status_code == 400
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "api.example"]
        assert c.get("/v1/models", headers={**auth, "Host": "api.example"}).status_code == 200
        settings.ALLOWED_HOSTS = [x for x in settings.ALLOWED_HOSTS if x != "api.example"]
        assert c.get("/v1/models", headers={**auth, "Host": "api.example"}).status_code == 400
