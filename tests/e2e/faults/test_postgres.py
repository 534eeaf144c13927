"""PostgreSQL away: the gateways go on serving from what they read last (issue 16, item 1).

Production's processes behind proxies (tests/e2e/faultplane.py), a steady openai-client
load through both ``gateway serve`` processes, streamed and not. PostgreSQL is refused for
30 s, then hung for 30 s (connections accepted and never answered, open ones stalled),
then healed. No request fails; each gateway's ``/healthz`` says ``stale`` with its age
(still 200: the age is under ``LLMGW_GATEWAY_STALE_LIMIT``) while the database is away,
and ``ok`` again once it is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

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


def test_postgres_refused_then_hung_fails_no_request(
    fault_plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    plane = fault_plane
    assert plane.pg is not None
    plane.sim_cluster(agents, model="steady", replicas=2)
    key = plane.key("load")
    seen: dict[str, list[tuple[int, dict[str, Any]]]] = {"refuse": [], "hang": []}
    with plane.load(key, "steady", clients=4) as load:
        load.wait_for_answers(20)
        wait_for(lambda: all(b == {"status": "ok"} for _, b in _health(plane)), 30, "ok")
        marks: dict[str, float] = {}
        for fault in ("refuse", "hang"):
            marks[fault] = load.now()
            getattr(plane.pg, fault)()

            def stale(fault: str = fault) -> bool:
                found = _health(plane)
                seen[fault] += found
                return all(s == 200 and b.get("status") == "stale" for s, b in found)

            wait_for(stale, AWAY, f"every gateway's /healthz to say stale ({fault})")
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
    assert load.failures == [], load.summary() + f" {load.failures[:5]}"
    assert len(refused) > 20 and len(hung) > 20, (len(refused), len(hung))
    # Stale is 200 up to the limit (300 s): a load balancer keeps these processes.
    assert {s for f in seen for s, _ in seen[f]} == {200}
    assert max(stale_ages) >= AWAY  # the age grew through the outage
    for gw in plane.gateways:
        out = gw.output()
        # Said, and not twice a second: the whole error once, then a line a minute.
        said = out.count("could not read the catalog and replicas")
        assert 1 <= said <= 3, out[-3000:]
