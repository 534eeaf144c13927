"""Canaries end to end: real sim engines behind the web process's gateway and a
``manage.py gateway serve``; a failing candidate and a slow one are rolled back by the
gateway that judged them, as the catalog's change log shows."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog.models import ChangeRecord, ServedModel
from cluster.models import Node
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import H100, client, gateway_process, new_key, ready, sim_model

pytestmark = pytest.mark.e2e

LIMITS = {"percent": 50, "min_requests": 10}


def rolled_back(model: str) -> Callable[[], ChangeRecord | None]:
    def check() -> ChangeRecord | None:
        return ChangeRecord.objects.filter(model_name=model, surface="gateway").first()  # newest

    return check


def ask_until(api: openai.OpenAI, done: Callable[[], Any], what: str, limit: int = 300) -> int:
    """Ask "chat" in new conversations until ``done``; every answer must be the model's."""
    for n in range(limit):
        answer = api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"/echo conversation {n}"}],
            max_tokens=8,
        )  # fmt: skip
        assert answer.choices[0].message.content == f"conversation {n}"
        if done():
            return n + 1
    raise AssertionError(f"{what} after {limit} requests")


def test_failing_and_slow_candidates_are_rolled_back_by_the_gateway(
    control_plane: ControlPlane, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    agents("canary-a", "--simulate", f"4x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").count() == 1, 60, "the node")
    store(
        # Every generation request the candidate gets answers 500.
        sim_model("chat-next", profile={"env": {"LLMGW_SIM_FAIL_EVERY": "1",
                                                "LLMGW_SIM_TTFT": "0.05", "LLMGW_SIM_TPS": "200"}}),
        # As fast as the model, but ten times slower to its first token.
        sim_model("chat-slow", profile={"env": {"LLMGW_SIM_TTFT": "0.6", "LLMGW_SIM_TPS": "200"}}),
        sim_model("chat", canary={"model": "chat-next", **LIMITS}),
    )  # fmt: skip
    for name in ("chat", "chat-next", "chat-slow"):
        wait_for(ready(name), 90, f"{name} ready")
    key = new_key(control_plane, "canary-app", "--owner", "team:tests")

    # The web process's gateway: the candidate's 500s move each request on to the model,
    # so the client never sees one; its error rate rolls it back.
    served = ask_until(client(control_plane, key), rolled_back("chat"), "never rolled back")
    change = wait_for(rolled_back("chat"), 10, "the rollback")
    assert change.actor_name.startswith("gateway (") and change.action == "update"
    # Judged every half second: at least min_requests of the candidate's, maybe a few more.
    found = re.fullmatch(r"canary: canary chat-next rolled back: error rate 100% vs 0% over "
                         r"(\d+) requests \(at most 5 points above the model's\)", change.summary)  # fmt: skip
    assert found and 10 <= int(found.group(1)) <= 20, change.summary
    canary = ServedModel.objects.get(name="chat").to_spec().canary
    assert canary is not None and (canary.model, canary.percent) == ("chat-next", 0)
    assert served < 100
    # The web process wrote what it served (gateway.records.usage, every second): all answered by
    # the model, the candidate's failures having moved on to it.
    wait_for(lambda: usage("canary-app") == {"chat": served}, 15, "the usage written")

    # A gateway process of its own judges its own traffic: a slower candidate.
    m = ServedModel.objects.get(name="chat").to_spec()
    from catalog import services
    from catalog.choices import Surface
    from catalog.spec import Canary

    services.save_model(
        dataclasses.replace(m, canary=Canary(model="chat-slow", **LIMITS)),
        services.Actor(user=None, surface=Surface.CLI, name="test"), replacing="chat",
    )  # fmt: skip
    with gateway_process(control_plane, tmp_path) as url:
        alone = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        slow = ask_until(alone, lambda: rolled_back("chat")() != change, "slow never rolled back")
    second = rolled_back("chat")()
    assert second is not None and second.pk != change.pk
    found = re.fullmatch(r"canary: canary chat-slow rolled back: mean time to first token "
                         r"(\d+) ms vs (\d+) ms \([\d.]+x, at most 1.5x\) over (\d+) requests",
                         second.summary)  # fmt: skip
    assert found, second.summary
    assert int(found.group(1)) >= 600 > 300 > int(found.group(2))
    assert 10 <= int(found.group(3)) <= 20
    assert ServedModel.objects.get(name="chat").to_spec().canary.percent == 0
    assert slow < 100
    # Each rollback written once.
    assert ChangeRecord.objects.filter(model_name="chat", surface="gateway").count() == 2
    # The gateway process wrote its usage too (the last of it as it stopped): the slow
    # candidate's answers under its own name.
    counted = usage("canary-app")
    assert counted["chat"] + counted["chat-slow"] == served + slow, counted
    assert counted["chat-slow"] >= 10


def usage(key: str) -> dict[str, int]:
    from django.db.models import Sum

    from gateway.models import Usage

    rows = Usage.objects.filter(key=key).values("model").annotate(n=Sum("requests"))
    return {r["model"]: r["n"] for r in rows}
