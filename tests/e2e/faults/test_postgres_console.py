"""PostgreSQL away, then hung, under a real web process (``manage.py serve``) reaching it
through a ``tests.faultproxy.FaultProxy``: the console and the REST API answer 503 with
``Retry-After`` within about the database's connect timeout, never hold a request, and
serve again once it is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client

from llmgw_core.models import ApiToken
from tests.dburl import database_url
from tests.e2e.conftest import ControlPlane, wait_for
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.e2e

CONNECT = 2  # LLMGW_DB_CONNECT_TIMEOUT, seconds
# The most an answer may take with the database away or hung: the connect timeout (a
# connection of the pool waited for, or a pooled one checked) and a margin for a loaded
# machine; a request held by the database would take the client's whole 60 s.
BOUND = 2 * CONNECT + 4


@pytest.fixture
def pg() -> Iterator[FaultProxy]:
    db = connection.settings_dict
    proxy = FaultProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))).start()
    yield proxy
    proxy.heal()
    proxy.stop()


@pytest.fixture
def web(transactional_db: Any, tmp_path: Path, pg: FaultProxy) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path, extra={
        "LLMGW_DATABASE_URL": database_url(host="127.0.0.1", port=pg.port),
        "LLMGW_DB_CONNECT_TIMEOUT": str(CONNECT),
    })  # fmt: skip
    plane.start()
    yield plane
    pg.heal()
    plane.stop()


def _timed(client: httpx.Client, url: str, **kw: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    got = client.get(url, **kw)
    return got, time.monotonic() - started


def test_the_console_and_the_api_answer_503_at_once_while_postgres_is_away_or_hung(
    web: ControlPlane, pg: FaultProxy, make_user: Any
) -> None:
    user = make_user("olga", "operator")
    token = ApiToken.issue(user, "probe")[1]
    signed = Client()
    signed.force_login(user)
    api = httpx.Client(base_url=web.url, timeout=60,
                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    console = httpx.Client(base_url=web.url, timeout=60,
                           cookies={"sessionid": signed.cookies["sessionid"].value})  # fmt: skip

    def serving() -> bool:
        return (api.get("/api/v1/catalog/models/").status_code == 200
                and console.get("/catalog/").status_code == 200)  # fmt: skip

    wait_for(serving, 60, "the console and the API to serve")
    for fault in (pg.refuse, pg.hang):
        fault()
        got, took = _timed(api, "/api/v1/catalog/models/")
        assert got.status_code == 503, (fault.__name__, got.status_code, got.text[:300])
        assert took < BOUND, (fault.__name__, took)
        assert got.headers["retry-after"] == "10"
        assert got.headers["content-type"] == "application/json"
        assert got.json()["detail"].startswith("The database does not answer")
        assert "nothing was read or changed" in got.json()["detail"]
        page, took = _timed(console, "/catalog/")
        assert page.status_code == 503, (fault.__name__, page.status_code, page.text[:300])
        assert took < BOUND, (fault.__name__, took)
        assert page.headers["retry-after"] == "10"
        assert "<h1>The database does not answer</h1>" in page.text
        # A write is refused the same way, and changes nothing.
        posted = api.post("/api/v1/catalog/models/", json={"name": "late"})
        assert posted.status_code == 503 and posted.headers["retry-after"] == "10"
        pg.heal()
        wait_for(serving, 60, f"the console and the API to serve again after {fault.__name__}")
    log = (web.tmp / "web-1.log").read_text(errors="replace")
    assert "the database does not answer: GET /api/v1/catalog/models/ answered 503" in log
