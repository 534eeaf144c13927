"""Drain plus preemption leaves no model dark, in production's
processes under a client load: a critical model on one node, a scheduled model's only
replica on the other, one card each. Draining the first would have its replacement evict
the second's last ready replica (before, the drain answered 200 with ``dark: []`` and the
scheduled model served nothing until room returned); it is refused naming that model. With
a third node the drain moves the critical model there, and neither model misses an answer.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from cluster.models import Node, Replica
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, wait_for
from tests.e2e.faultplane import H100, FaultPlane, sim_model

pytestmark = pytest.mark.e2e


def operator_token() -> dict[str, str]:
    from django.contrib.auth.models import Group, User

    from llmgw_core.models import ApiToken

    user = User.objects.create_user("ops", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    _, secret = ApiToken.issue(user, "e2e")
    return {"Authorization": f"Bearer {secret}"}


def ready_on(model: str) -> set[str]:
    return set(
        Replica.objects.filter(model_name=model, desired=True, state="ready").values_list(
            "assignments__node__name", flat=True
        )
    )


def wait_ready(model: str, nodes: set[str], timeout: float = 180) -> None:
    try:
        wait_for(lambda: ready_on(model) == nodes, timeout, f"{model} ready on {nodes}")
    except AssertionError as e:
        rows = Replica.objects.filter(model_name=model).values("pk", "state", "reason")
        raise AssertionError(f"{e}: {list(rows)}") from None


def node(agents: Callable[..., Agent], name: str) -> None:
    agents(name, "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(name=name, health="ready").exists(), 60, name)


def test_a_drain_whose_replacement_would_darken_a_model_is_refused_and_none_goes_dark(
    fault_plane: FaultPlane, agents: Callable[..., Agent]
) -> None:
    node(agents, "fp-a")
    store(sim_model("vital", 1, **{"class": "critical"}))
    wait_ready("vital", {"fp-a"})
    node(agents, "fp-b")
    store(sim_model("nightly", 1))
    wait_ready("nightly", {"fp-b"})
    key = fault_plane.key("load")
    token = operator_token()
    drain = f"{fault_plane.url}/api/v1/cluster/nodes/fp-a/drain/"
    with fault_plane.load(key, "nightly") as nightly, fault_plane.load(key, "vital") as vital:
        nightly.wait_for_answers(20)
        r = httpx.post(drain, headers=token, json={}, timeout=30)
        assert r.status_code == 409, r.text
        assert r.json()["dark"] == ["nightly"], r.json()
        assert "replacement of vital" in r.json()["detail"]
        assert not Node.objects.get(name="fp-a").cordoned
        # Ticks go on (beat, the worker): nothing is evicted, both keep answering.

        nightly.wait_for_answers(40)
        vital.wait_for_answers(20)
        assert ready_on("nightly") == {"fp-b"} and ready_on("vital") == {"fp-a"}
        # Room on a third node: the drain goes through and moves vital there.
        node(agents, "fp-c")
        r = httpx.post(drain, headers=token, json={}, timeout=30)
        assert r.status_code == 200 and r.json()["dark"] == [], r.text
        wait_for(lambda: ready_on("vital") == {"fp-c"}
                 and not Replica.objects.filter(assignments__node__name="fp-a").exists(),
                 120, "vital moved to fp-c")  # fmt: skip
        vital.wait_for_answers(20)
        nightly.wait_for_answers(20)
    print(f"\nnightly: {nightly.summary()}; vital: {vital.summary()}")  # noqa: T201
    assert nightly.failures == [], nightly.summary()
    assert vital.failures == [], vital.summary()
    assert ready_on("nightly") == {"fp-b"}
