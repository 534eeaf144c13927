"""An on-demand model woken by its clients: a real
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


def test_a_model_with_no_room_is_503_at_once_woken_or_not(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    """No room for it now (its card is another's): the reconciler says so, and the
    gateway answers 503 with a long Retry-After at once, for a model that runs always and
    for one woken on demand (the held requests are let go), instead of holding clients
    ten minutes. A model no node could ever run (no node has its class) is
    503 ``model_unplaceable``, naming what is missing, with nothing inviting a retry."""
    agents("room-node", "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("hog"))
    wait_for(lambda: Replica.objects.filter(model_name="hog", assignments__isnull=False)
             .exists(), 30, "the hog placed")  # fmt: skip
    store(sim_model("always"), sim_model("sometimes", scaling={"min": 0, "max": 1}))
    nowhere = {"gpu_class": "nvidia-a100-40gb", "env": dict(FAST)}
    store(sim_model("never", profile=nowhere))
    for name in ("always", "never"):
        wait_for(lambda name=name: Replica.objects.filter(model_name=name, unplaced=True)
                 .exists(), 30, f"placement to find no room for {name}")  # fmt: skip
    key = new_key(control_plane, "roomless")
    # The client's own timeout is far below the wake wait: only an answer at once passes.
    api = openai.OpenAI(base_url=control_plane.url + "/v1", api_key=key, max_retries=0,
                        timeout=30)  # fmt: skip
    for name in ("always", "sometimes"):
        with pytest.raises(openai.APIStatusError) as caught:
            api.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 503, caught.value
        assert caught.value.response.headers["retry-after"] == "30"
        assert "no room to start one now" in caught.value.message
    # The woken one was asked for: the reconciler made its replica, and found no room.
    assert Replica.objects.get(model_name="sometimes").unplaced
    with pytest.raises(openai.APIStatusError) as caught:
        api.chat.completions.create(model="never", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503 and caught.value.code == "model_unplaceable"
    assert "no node has nvidia-a100-40gb cards" in caught.value.message
    assert "retry-after" not in caught.value.response.headers
    assert caught.value.response.headers["x-should-retry"] == "false"
