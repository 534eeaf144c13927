"""An on-demand model woken by its clients (issue 12, items 4 and 5): a real
``manage.py serve``, a real agent and a sim engine that takes 3 s to load. Fifty clients
ask at once for a model scaled to zero: the gateway records the demand, the reconciler
starts one replica (not fifty), every request is held until it is ready and all fifty
are answered."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from cluster.models import Node, Replica
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import FAST, H100, new_key, sim_model

pytestmark = pytest.mark.e2e


def test_fifty_held_requests_wake_one_replica_and_are_all_answered(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    agents("wake-node", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("sleepy", scaling={"min": 0, "max": 2},
                    profile={"args": ["--load-time", "3"], "env": dict(FAST)}))  # fmt: skip
    assert not Replica.objects.filter(model_name="sleepy").exists()  # scaled to zero
    key = new_key(control_plane, "wakers")
    api = openai.OpenAI(base_url=control_plane.url + "/v1", api_key=key, max_retries=0,
                        timeout=120)  # fmt: skip

    def ask(n: int) -> str:
        answer = api.chat.completions.create(
            model="sleepy", messages=[{"role": "user", "content": f"/echo awake {n}"}])  # fmt: skip
        return answer.choices[0].message.content or ""

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(ask, range(50)))
    assert answers == [f"awake {n}" for n in range(50)]
    # One replica was started for the fifty, not one each (max is 2).
    started = Replica.objects.filter(model_name="sleepy")
    assert started.count() == 1, list(started.values("pk", "state", "reason"))
    assert started.get().state == "ready"
