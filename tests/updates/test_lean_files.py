"""The mirror's files sent to nodes on a lean ASGI route in front of Django (updates.lean):
a file that is sent (whole, a Range, HEAD) is answered there; anything else (no token, a
wrong one, a node the model is not placed on, a Range malformed or past the end, a file
not held, a host not allowed) is the view's to answer, word for word. Through the ASGI
application as the web server hands requests over; the route's lookups run on a pool
thread, so these tests commit (transaction=True).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import pytest
from django.core.asgi import get_asgi_application

from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.updates.hubstandin import HubStandIn
from updates import lean, mirror
from updates.lean import MirrorFileRoute

pytestmark = pytest.mark.django_db(transaction=True)

WEIGHTS = bytes(range(256)) * 2048  # 512 KiB
SHA = hashlib.sha256(WEIGHTS).hexdigest()


class Behind:
    """Django behind the route, counting the requests it is handed."""

    def __init__(self) -> None:
        self.app = get_asgi_application()
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


@pytest.fixture
def held(hub: HubStandIn) -> tuple[str, str]:
    """A model's files in the mirror and a node it is placed on: (its token, the file's URL)."""
    from catalog.models import ServedModel
    from cluster.models import Assignment, Replica

    hub.commit("org/chat", {"model.safetensors": WEIGHTS, "config.json": b"{}"})
    store(gpu_model("chat"))
    node, token = join_node("n1")
    r = Replica.objects.create(model=ServedModel.objects.get(name="chat"), model_name="chat")
    Assignment.objects.create(replica=r, node=node)
    fetch = mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    assert fetch is not None and fetch.state == "done"
    return token, f"/api/v1/updates/mirror/files/{fetch.pk}/model.safetensors"


def ask(
    app: Any,
    path: str,
    *,
    token: str | None = None,
    method: str = "GET",
    host: str = "localhost",
    **headers: str | bytes,
) -> httpx.Response:
    """One request to ``app``, as the web server hands it over."""
    sent = {k.replace("_", "-"): v for k, v in headers.items()}
    if token:
        sent["Authorization"] = f"Bearer {token}"

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as c:
            return await c.request(method, path, headers=sent)

    return asyncio.run(go())


def test_the_web_process_sends_a_file_on_the_lean_route(held: tuple[str, str]) -> None:
    from llmgw_admin.asgi import application

    token, url = held
    r = ask(application, url, token=token)
    assert r.status_code == 200 and r.content == WEIGHTS
    assert r.headers["content-length"] == str(len(WEIGHTS))
    assert r.headers["etag"] == f'"{SHA}"' and r.headers["accept-ranges"] == "bytes"
    assert r.headers["x-content-type-options"] == "nosniff"


def test_a_file_whole_a_range_and_a_head_are_answered_there(
    held: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lean, "CHUNK", 100_000)  # several reads of the file
    token, url = held
    behind = Behind()
    route = MirrorFileRoute(behind)
    whole = ask(route, url, token=token)
    assert whole.status_code == 200 and whole.content == WEIGHTS
    rest = ask(route, url, token=token, Range="bytes=1000-")
    assert rest.status_code == 206 and rest.content == WEIGHTS[1000:]
    assert rest.headers["content-range"] == f"bytes 1000-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"
    span = ask(route, url, token=token, Range="bytes=10-19")
    assert span.status_code == 206 and span.content == WEIGHTS[10:20]
    assert span.headers["content-length"] == "10"
    head = ask(route, url, token=token, method="HEAD")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(WEIGHTS))
    assert behind.calls == 0


def test_everything_else_is_the_view_s_answer(held: tuple[str, str]) -> None:
    token, url = held
    _, stranger = join_node("stranger")
    behind = Behind()
    route = MirrorFileRoute(behind)
    answers = {
        "no token": ask(route, url),
        "a wrong token": ask(route, url, token="llmgw_node_wrong"),
        "a node without the model": ask(route, url, token=stranger),
        "a file not held": ask(route, url.replace("model.safetensors", "x.bin"), token=token),
        "a malformed Range": ask(route, url, token=token, Range="lines=1-2"),
        "a Range past the end": ask(route, url, token=token, Range=f"bytes={len(WEIGHTS)}-"),
        "a host not allowed": ask(route, url, token=token, host="evil.example"),
    }
    assert {why: r.status_code for why, r in answers.items()} == {
        "no token": 401,
        "a wrong token": 401,
        "a node without the model": 403,
        "a file not held": 404,
        "a malformed Range": 400,
        "a Range past the end": 416,
        "a host not allowed": 400,
    }
    assert answers["a Range past the end"].headers["content-range"] == f"bytes */{len(WEIGHTS)}"
    assert behind.calls == len(answers)
    # Not a file's path at all: Django's too.
    assert ask(route, "/api/v1/updates/mirror/files/x/y", token=token).status_code == 404
    assert behind.calls == len(answers) + 1


def test_reading_stops_when_the_client_goes_away(
    held: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lean, "CHUNK", 1000)
    token, url = held
    messages: list[dict[str, Any]] = []
    asked = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return asked.pop(0) if asked else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": url,
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())],
    }
    asyncio.run(MirrorFileRoute(Behind())(scope, receive, send))
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    sent = sum(len(m.get("body", b"")) for m in messages[1:])
    assert sent < len(WEIGHTS) // 10  # gone at once: a read or two of 512, not all of them


def test_a_non_ascii_digit_or_a_huge_range_is_refused_clearly_never_a_500(
    held: tuple[str, str],
) -> None:
    from llmgw_admin.asgi import application

    token, url = held
    # "²".isdigit() is true and int("²") fails: a fetch id of that is no fetch's.
    for path in ("/api/v1/updates/mirror/files/%C2%B2/x", "/api/v1/updates/mirror/files/%D9%A1/x"):
        r = ask(application, path, token=token)
        assert r.status_code == 404, (path, r.status_code)
    huge = ask(application, "/api/v1/updates/mirror/files/" + "9" * 40 + "/x", token=token)
    assert huge.status_code == 404
    answers = {
        "5,000 digits": ask(application, url, token=token, Range="bytes=" + "1" * 5000 + "-"),
        "an end of 5,000 digits": ask(application, url, token=token, Range="bytes=1-" + "9" * 5000),
        "a superscript": ask(application, url, token=token, Range="bytes=\u00b2-".encode()),
        "Arabic digits": ask(application, url, token=token, Range="bytes=\u0661-".encode()),
    }
    for why, r in answers.items():
        assert r.status_code == 400, (why, r.status_code, r.text)
        assert "ASCII digits" in r.json()["detail"], why
    # An end past the file is the file's end (RFC 9110), a start past it 416.
    far = ask(application, url, token=token, Range="bytes=1-" + "9" * 40)
    assert far.status_code == 206 and far.content == WEIGHTS[1:]
    past = ask(application, url, token=token, Range="bytes=" + "9" * 40 + "-")
    assert past.status_code == 416


def test_the_range_is_read_in_ascii_digits_of_bounded_length() -> None:
    from updates.api.views import byte_range

    assert byte_range("", 10) == (200, 0, 10)
    assert byte_range("bytes=2-", 10) == (206, 2, 10)
    assert byte_range("bytes=2-4", 10) == (206, 2, 5)
    assert byte_range("bytes=\u00b2-", 10)[0] == 400
    assert byte_range("bytes=1-" + "9" * 5000, 10)[0] == 400
    assert byte_range("bytes=10-", 10)[0] == 416


def test_a_file_whose_name_has_a_space_is_sent_from_the_url_the_manifest_gives(
    hub: HubStandIn,
) -> None:
    from django.test import Client

    from catalog.models import ServedModel
    from cluster.models import Assignment, Replica
    from llmgw_admin.asgi import application

    hub.commit("org/chat", {"my model #1.safetensors": WEIGHTS})
    store(gpu_model("chat"))
    node, token = join_node("n1")
    r = Replica.objects.create(model=ServedModel.objects.get(name="chat"), model_name="chat")
    Assignment.objects.create(replica=r, node=node)
    assert mirror.run_fetch(mirror.request_fetch("chat", start=False).pk).state == "done"
    manifest = Client().get(
        "/api/v1/updates/mirror/models/chat/", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    [f] = manifest.json()["files"]
    assert f["path"] == "my model #1.safetensors"
    assert f["url"].endswith("/my%20model%20%231.safetensors")
    got = ask(application, f["url"], token=token)
    assert got.status_code == 200 and got.content == WEIGHTS
