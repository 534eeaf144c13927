"""The fault suite's arrangement holds with nothing cut: production's processes behind
proxies serve a steady load through both gateways with no failed request (the baseline
every fault scenario is measured against)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.conftest import Agent
from tests.e2e.faultplane import FaultPlane

pytestmark = pytest.mark.e2e


def test_with_nothing_cut_both_gateways_answer_every_request(
    fault_plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    fault_plane.sim_cluster(agents, model="steady", replicas=2)
    key = fault_plane.key("load")
    with fault_plane.load(key, "steady") as load:
        load.wait_for_answers(40)
    assert load.failures == [], load.summary()
    assert {o.url for o in load.outcomes} == set(fault_plane.urls())
    assert {o.stream for o in load.outcomes} == {True, False}
    # Everything went through the proxies: cutting them is cutting what llmgw leans on.
    assert fault_plane.pg is not None and fault_plane.pg.passed > 0
    assert fault_plane.redis is not None and fault_plane.redis.passed > 0
