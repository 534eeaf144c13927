"""The Messages and Responses APIs as their clients meet them: the official ``anthropic``
and ``openai`` packages against the real processes (``manage.py serve``, ``manage.py
gateway serve``), real agents, and sim engines or a real llama-server. The sim serves
both APIs itself, so they are sent to it natively, checked and normalized by the gateway
(docs/dialects.md, "Native or translated, per engine")."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest

from cluster.models import Node, Replica
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import H100, client, new_key, ready, sim_model, sim_stats
from tests.e2e.test_gateway_serve import serving, started

pytestmark = pytest.mark.e2e

WEATHER_TOOL = {"name": "get_weather", "description": "the weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
WEATHER_FUNCTION = {"type": "function", "name": "get_weather",
                    "parameters": WEATHER_TOOL["input_schema"]}  # fmt: skip


def claude(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60)


def test_both_clients_through_two_gateway_processes_on_the_sim(
    control_plane: ControlPlane, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    agents("dl-a", "--simulate", f"1x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("chat", context_length=4096, max_output=512,
                    capabilities={"tools": True}))  # fmt: skip
    wait_for(ready("chat"), 90, "the chat replica ready")
    key = new_key(control_plane, "app", "--owner", "team:agents")
    replica = Replica.objects.get(model_name="chat", state="ready")
    before = sim_stats(replica)

    # Anthropic's client at the console's port (console and gateway in one process).
    api = claude(control_plane.url, key)
    asked = [{"role": "user", "content": "/echo hello from messages"}]
    message = api.messages.create(model="chat", max_tokens=32, messages=asked)
    assert message.content[0].text == "hello from messages"
    assert message.stop_reason == "end_turn"
    with api.messages.stream(model="chat", max_tokens=32, messages=asked) as stream:
        assert "".join(stream.text_stream) == "hello from messages"
        assert stream.get_final_message().stop_reason == "end_turn"
    called = api.messages.create(
        model="chat", max_tokens=64, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": '/call get_weather {"city": "Oslo"}'}],
    )  # fmt: skip
    assert called.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in called.content if b.type == "tool_use"] == \
        [("get_weather", {"city": "Oslo"})]  # fmt: skip
    counted = api.messages.count_tokens(model="chat", messages=asked)
    assert counted.input_tokens == message.usage.input_tokens + \
        message.usage.cache_read_input_tokens  # fmt: skip
    with pytest.raises(anthropic.AuthenticationError):
        claude(control_plane.url, "llmgw-ck-nope").messages.create(
            model="chat", max_tokens=4, messages=asked
        )

    # OpenAI's Responses API: a conversation begun on one process, continued on another.
    with serving(tmp_path, "--port", "0") as running:
        other = started(running).group(1)
        first_api = client(control_plane, key, timeout=60)
        first = first_api.responses.create(model="chat", input="/echo remember 42")
        assert first.output_text == "remember 42"
        events = list(first_api.responses.create(model="chat", input="/echo streamed",
                                                 stream=True))  # fmt: skip
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == "streamed"
        second_api = openai.OpenAI(base_url=other, api_key=key, max_retries=0, timeout=60)
        second = second_api.responses.create(model="chat", input="/echo and now?",
                                             previous_response_id=first.id)  # fmt: skip
        assert second.previous_response_id == first.id
        # The engine read the first turn: the prompt grew by it.
        assert second.usage.input_tokens > first.usage.input_tokens
        tools = second_api.responses.create(model="chat", tools=[WEATHER_FUNCTION],
                                            input='/call get_weather {"city": "Oslo"}')  # fmt: skip
        (call,) = [i for i in tools.output if i.type == "function_call"]
        assert json.loads(call.arguments) == {"city": "Oslo"}
        assert first_api.responses.retrieve(second.id).id == second.id
        second_api.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError):
            first_api.responses.retrieve(second.id)
    # Every generating request went to the engine's own route (the sim's is fit), the
    # conversation continued from the gateway's store through another process.
    after = sim_stats(replica)
    assert after["messages"] - before["messages"] == 3
    assert after["responses"] - before["responses"] == 4
