"""The guard check's lean ASGI route: a check that succeeds is answered there, with the
DRF view's JSON; anything else is the view's to answer, word for word. Through the ASGI
application as the web server hands requests over; its work runs on a pool thread, so these
tests commit (transaction=True).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.core.asgi import get_asgi_application

from guard import services, snapshots
from guard.api import auth
from guard.api.lean import GuardCheckRoute
from guard.models import JudgeDecision, JudgeHealth
from llmgw_core.models import ApiToken
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

CHECK = "/api/v1/guard/check"


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    proc, url = launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard",
        "--guard-categories", "Violent", "--context-length", "8192",
    )  # fmt: skip
    yield url
    stop(proc)


@pytest.fixture(autouse=True)
def fresh_memory() -> Iterator[None]:
    snapshots.kept().invalidate()
    auth.forget()
    yield
    snapshots.kept().invalidate()
    auth.forget()


@pytest.fixture
def judge(judge_url: str) -> None:
    guard_model("qwen3guard-0.6b", endpoint=judge_url)
    services.set_policy({"judge": {"models": ["qwen3guard-0.6b"]}}, surface="cli", name="t")


def send(
    method: str,
    *,
    token: str | None = None,
    body: Any = None,
    content: bytes | None = None,
    content_type: str = "application/json",
    host: str = "localhost",
) -> httpx.Response:
    """One request to the lean route in front of Django, as the web server hands it over."""
    app = GuardCheckRoute(get_asgi_application())
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as c:
            if content is None and body is not None:
                return await c.request(method, CHECK, json=body, headers=headers)
            return await c.request(method, CHECK, content=content, headers=headers)

    return asyncio.run(go())


def answered_by_django(r: httpx.Response) -> bool:
    # DRF's view names the allowed methods; the lean route does not.
    return "allow" in r.headers


def token_for(make_user: Any, role: str | None = "viewer") -> str:
    user = make_user(f"gw-{role}", role)
    return ApiToken.issue(user, "gateway")[1]


def test_a_check_is_answered_on_the_lean_route_as_the_view_answers_it(
    make_user: Any, judge: None
) -> None:
    token = token_for(make_user)
    lean = send("POST", token=token, body={"request": "help me UNSAFE-MARKER now"})
    assert lean.status_code == 200 and not answered_by_django(lean)
    assert lean.headers["content-type"] == "application/json"
    assert lean.headers["x-content-type-options"] == "nosniff"
    # The same check through the DRF view (a session, not a token, takes Django's path).
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(make_user("vera", "viewer"))
    view = api.post(CHECK, {"request": "help me UNSAFE-MARKER now"}, format="json").json()
    got = lean.json()
    for body in (got, view):
        body.pop("latency_ms")
    assert got == view
    assert (got["decision"], got["verdict"], got["categories"]) == ("refuse", "unsafe", ["Violent"])
    assert JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers == 2
    assert JudgeDecision.objects.get(judge="qwen3guard-0.6b").count == 2


@pytest.mark.parametrize(
    ("kwargs", "status", "says"),
    [
        ({"token": "llmgw_nope", "body": {"request": "x"}}, 401, "unknown API token"),
        ({"body": {"request": "x"}}, 401, "credentials were not provided"),
        ({"token": "T", "body": {"request": 5}}, 400, "must be a string"),
        ({"token": "T", "body": {"request": "x", "anwser": "y"}}, 400, "unknown key"),
        ({"token": "T", "content": b"{not json"}, 400, "JSON parse error"),
        ({"token": "T", "content": b"[" * 5000}, 400, "nested too deeply"),
        (
            {"token": "T", "content": b"request=x", "content_type": "text/plain"},
            415,
            "Unsupported media type",
        ),
        ({"token": "T", "body": {"request": "x"}, "host": "evil.example"}, 400, None),
    ],
)
def test_anything_but_a_good_check_is_the_views_to_answer(
    make_user: Any, judge: None, kwargs: dict[str, Any], status: int, says: str | None
) -> None:
    if kwargs.get("token") == "T":
        kwargs["token"] = token_for(make_user)
    r = send("POST", **kwargs)
    assert r.status_code == status, r.text
    if says is not None:
        assert says in r.text and answered_by_django(r)
    assert not JudgeHealth.objects.exists()  # nothing judged, nothing counted


def test_a_user_without_the_role_gets_the_views_403(make_user: Any, judge: None) -> None:
    r = send("POST", token=token_for(make_user, role=None), body={"request": "x"})
    assert r.status_code == 403 and "viewer" in r.json()["detail"]


def test_a_revoked_token_is_refused_by_the_view(make_user: Any, judge: None) -> None:
    token = token_for(make_user)
    assert send("POST", token=token, body={"request": "x"}).status_code == 200
    stored = ApiToken.objects.get()
    from django.utils import timezone

    stored.revoked = timezone.now()
    stored.save()
    r = send("POST", token=token, body={"request": "x"})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_other_methods_and_paths_pass_through(make_user: Any, judge: None) -> None:
    r = send("GET", token=token_for(make_user))
    assert r.status_code == 405 and answered_by_django(r)
