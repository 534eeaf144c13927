"""An on-demand model (min 0) woken by its first request, scaled for its load, then stopped."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.catalog.samples import store
from tests.e2e.autoscale.conftest import (
    DOWN,
    UP,
    model,
    nodes,
    ready,
    scale,
    wanted,
)
from tests.e2e.conftest import Agent, wait_for
from tests.e2e.faultplane import FaultPlane

pytestmark = [pytest.mark.e2e]


def test_an_on_demand_model_goes_0_to_2_and_back_to_0(
    scaling_plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    plane = scaling_plane
    nodes(agents)
    store(model("wake", 0, 2))
    key = plane.key("wake")
    # The first request wakes it: 0 -> 1 (the gateway waits for the replica).
    with plane.load(key, "wake", clients=4, pause=0.02) as load:
        wait_for(lambda: wanted("wake") >= 1, 60, "the first replica")
        wait_for(lambda: wanted("wake") == 2, 120 + UP, "a second replica for the load")
        wait_for(lambda: ready("wake") == 2, 120, "both ready")
        assert scale("wake").reason.startswith("on demand: "), scale("wake").reason
    assert load.failures == [], load.summary()
    # Idle past its timeout (20 s): none.
    wait_for(lambda: wanted("wake") == 0, 20 + 2 * DOWN + 90, "the model to stop")
    assert scale("wake") is None
