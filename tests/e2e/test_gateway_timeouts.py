"""Each model's own waits as an operator and a client meet them: a real
``manage.py serve`` whose settings give a 1 s first-token wait, a real agent and sim
engines that take 1.5 s to their first token. The model whose catalog entry says its
first token takes up to 2 s is waited for; the one that says nothing is given up on
before any byte reached the client (a 502 the client can retry, not a broken stream);
a whole answer that takes longer than a first token is not cut off. The console's live
traffic shows the first token's real time, not the role chunk's, and each model's page
says how long the gateway waits on it and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from cluster.models import Node
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import H100, new_key, ready, sim_model

pytestmark = pytest.mark.e2e

PREFILL = {"LLMGW_SIM_TTFT": "1.5", "LLMGW_SIM_TPS": "200"}


def test_each_model_is_waited_for_as_its_catalog_says(
    control_plane: ControlPlane, agents: Callable[..., Agent], console: Callable[..., Any],
    operator: Any,
) -> None:  # fmt: skip
    control_plane.extra.update({"LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT": "1",
                                "LLMGW_GATEWAY_READ_TIMEOUT": "1"})  # fmt: skip
    control_plane.restart()
    agents("waits-node", "--simulate", f"3x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(
        sim_model("patient", slo={"ttft_p99": "2s"}, profile={"env": dict(PREFILL)}),
        sim_model("hasty", profile={"env": dict(PREFILL)}),
        # Eight tokens at four a second: a whole answer in about 2 s.
        sim_model("writer", profile={"env": {"LLMGW_SIM_TTFT": "0.05", "LLMGW_SIM_TPS": "4"}}),
    )
    for name in ("patient", "hasty", "writer"):
        wait_for(ready(name), 90, f"{name} ready")
    key = new_key(control_plane, "waits")
    api = openai.OpenAI(base_url=control_plane.url + "/v1", api_key=key, max_retries=0,
                        timeout=60)  # fmt: skip
    traffic = console(operator, "/gateway/traffic/")

    def say(model: str, text: str, stream: bool) -> str:
        messages = [{"role": "user", "content": f"/echo {text}"}]
        if not stream:
            answer = api.chat.completions.create(model=model, messages=messages)
            return answer.choices[0].message.content or ""
        return "".join(
            c.choices[0].delta.content or ""
            for c in api.chat.completions.create(model=model, messages=messages, stream=True)
            if c.choices
        )

    assert say("patient", "worth the wait", stream=True) == "worth the wait"
    with pytest.raises(openai.APIStatusError) as given_up:
        say("hasty", "too slow", stream=True)
    assert given_up.value.status_code == 502
    assert "no first token within 1 s" in given_up.value.message
    words = "one two three four five six seven eight"
    assert say("writer", words, stream=False) == words

    # The live traffic: the patient model's first token took 1.5 s (the role chunk the
    # sim sends at once is not it).
    row = traffic.locator('#gateway-traffic tr[data-traffic="patient"]')
    wait_for(lambda: row.count() == 1, 30, "the patient model's traffic pushed")
    assert row.locator("[data-role=ttft-p50]").inner_text() == "≤ 2000 ms"

    page = console(operator, "/catalog/models/patient/")
    waits = " ".join(page.locator("#gateway-waits").inner_text().split())
    assert "first token: 20s (10 × slo.ttft_p99 of 2s, at least 10s)" in waits
    assert "held while waking:" in waits
    page.goto(control_plane.url + "/catalog/models/hasty/")
    waits = " ".join(page.locator("#gateway-waits").inner_text().split())
    assert (
        "first token: 1s (no slo.ttft_p99: the gateway's LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT)" in waits
    )
    assert "between tokens: 1s" in waits
