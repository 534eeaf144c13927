"""PostgreSQL away: the gateways go on serving from what they read last.

Production's processes behind proxies (tests/e2e/faultplane.py), a steady openai-client
load through both ``gateway serve`` processes, streamed and not. PostgreSQL is refused for
30 s, then hung for 30 s (connections accepted and never answered, open ones stalled),
then healed. No request fails; each gateway's ``/healthz`` says ``stale`` with its age
(still 200: the age is under ``LLMGW_GATEWAY_STALE_LIMIT``) while the database is away,
and ``ok`` again once it is back. The web process does the same for what it serves from
memory: its ``/v1/``, its ``/healthz``, the guard's check API and ``/metrics`` for an API
token it has seen before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from llmgw_core.models import ApiToken
from tests.e2e.conftest import Agent, wait_for
from tests.e2e.faultplane import FaultPlane

pytestmark = pytest.mark.e2e

AWAY = 30.0


def _health(plane: FaultPlane) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for gw in plane.gateways:
        got = gw.healthz()
        out.append((got.status_code, got.json()))
    return out


def _others(plane: FaultPlane, key: str, token: str) -> dict[str, int]:
    """What else answers from memory: the web process's /v1/ and /healthz, its guard check
    API and a gateway's /metrics, for a token seen before. Their statuses."""
    auth = {"Authorization": f"Bearer {token}"}
    web = openai.OpenAI(base_url=plane.url + "/v1", api_key=key, max_retries=0, timeout=60)
    try:
        answer = web.chat.completions.create(
            model="steady", messages=[{"role": "user", "content": "/echo web"}]
        )
        chat = 200 if answer.choices[0].message.content == "web" else -1
    except openai.APIStatusError as e:
        chat = e.status_code
    check = httpx.post(plane.url + "/api/v1/guard/check", json={"request": "hello"},
                       headers=auth, timeout=60)  # fmt: skip
    return {
        "web /v1": chat,
        "web /healthz": httpx.get(plane.url + "/healthz", timeout=10).status_code,
        "web guard check": check.status_code if b'"decision"' in check.content else -1,
        "gateway /metrics": httpx.get(
            plane.gateways[0].url + "/metrics", headers=auth, timeout=60
        ).status_code,  # fmt: skip
    }


def test_postgres_refused_then_hung_fails_no_request(
    fault_plane: FaultPlane, agents: Callable[..., Agent], make_user: Any
) -> None:
    plane = fault_plane
    assert plane.pg is not None
    plane.sim_cluster(agents, model="steady", replicas=2)
    key = plane.key("load")
    token = ApiToken.issue(make_user("gw", "viewer"), "probe")[1]
    seen: dict[str, list[tuple[int, dict[str, Any]]]] = {"refuse": [], "hang": []}
    others: dict[str, dict[str, int]] = {}
    with plane.load(key, "steady", clients=4) as load:
        load.wait_for_answers(20)
        wait_for(lambda: all(b == {"status": "ok"} for _, b in _health(plane)), 30, "ok")
        wait_for(lambda: set(_others(plane, key, token).values()) == {200}, 60,
                 "the web process to answer from memory")  # fmt: skip
        marks: dict[str, float] = {}
        for fault in ("refuse", "hang"):
            marks[fault] = load.now()
            getattr(plane.pg, fault)()

            def stale(fault: str = fault) -> bool:
                found = _health(plane)
                seen[fault] += found
                return all(s == 200 and b.get("status") == "stale" for s, b in found)

            wait_for(stale, AWAY, f"every gateway's /healthz to say stale ({fault})")
            others[fault] = _others(plane, key, token)
            # The database stays away this long, the load going on; /healthz looked at
            # every second meanwhile.
            deadline = time.monotonic() + AWAY - (load.now() - marks[fault])
            while time.monotonic() < deadline:
                seen[fault] += _health(plane)
                time.sleep(1)
        marks["heal"] = load.now()
        plane.pg.heal()
        wait_for(lambda: all(b == {"status": "ok"} for _, b in _health(plane)), 60,
                 "every gateway's /healthz to say ok again")  # fmt: skip
        load.wait_for_answers(20)
    refused = [o for o in load.outcomes if marks["refuse"] <= o.at < marks["hang"]]
    hung = [o for o in load.outcomes if marks["hang"] <= o.at < marks["heal"]]
    slowest = max(o.seconds for o in refused + hung)
    stale_ages = [b["age"] for fault in seen for _, b in seen[fault] if b.get("status") == "stale"]
    print(f"\nPostgreSQL refused {AWAY:g} s then hung {AWAY:g} s: {load.summary()}; "  # noqa: T201
          f"{len(refused)} requests while refused, {len(hung)} while hung, slowest "
          f"{slowest:.2f} s; /healthz stale ages seen up to {max(stale_ages)} s, "
          f"statuses {sorted({s for f in seen for s, _ in seen[f]})}")  # fmt: skip
    print(f"while away, besides the load: {others}")  # noqa: T201
    assert load.failures == [], load.summary() + f" {load.failures[:5]}"
    assert all(set(found.values()) == {200} for found in others.values()), others
    assert len(refused) > 20 and len(hung) > 20, (len(refused), len(hung))
    # Stale is 200 up to the limit (300 s): a load balancer keeps these processes.
    assert {s for f in seen for s, _ in seen[f]} == {200}
    assert max(stale_ages) >= AWAY  # the age grew through the outage
    for gw in plane.gateways:
        out = gw.output()
        # Said, and not twice a second: the whole error once, then a line a minute.
        said = out.count("could not read the catalog and replicas")
        assert 1 <= said <= 3, out[-3000:]
