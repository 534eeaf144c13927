"""The sim engine for the gateway's dialects, as a real process: its prefix cache reported
as cached tokens, the tool calls a test asks for, the stop string it stopped at, the
prompt holding tools, rerank, and its own Responses and Messages routes read by the
official clients."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.simcache import BLOCK, PrefixCache
from agent.simtext import tokenize
from tests.agent.test_sim import Sim, launch

SYSTEM = "You are a careful assistant who answers in full sentences. " * 12
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def start_sim() -> Iterator[Callable[..., Sim]]:
    started: list[Sim] = []

    def start(*args: str) -> Sim:
        sim = launch("--model", "m", "--ttft", "0", "--tps", "2000", *args)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def sim(start_sim: Callable[..., Sim]) -> Sim:
    return start_sim()


def cached(usage: dict[str, Any]) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_a_second_turn_reads_the_first_from_the_cache(sim: Sim) -> None:
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there."}]
    answer = sim.chat(model="m", messages=first)
    assert cached(answer["usage"]) == 0
    second = [*first, answer["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    again = sim.chat(model="m", messages=second)
    usage = again["usage"]
    # The first turn's prompt and answer are cached whole blocks; the new turn is not.
    first_len = answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    assert first_len - BLOCK < cached(usage) <= first_len
    assert cached(usage) % BLOCK == 0 and cached(usage) < usage["prompt_tokens"]


def test_a_stream_reports_cached_tokens_in_its_usage_chunk(sim: Sim) -> None:
    messages = [{"role": "system", "content": "Streamed. " + SYSTEM},
                {"role": "user", "content": "Hi."}]  # fmt: skip
    body = {"model": "m", "messages": messages, "stream_options": {"include_usage": True}}
    first = sim.stream("/v1/chat/completions", body)
    second = sim.stream("/v1/chat/completions", body)
    assert cached(first[-2]["usage"]) == 0
    prompt = second[-2]["usage"]["prompt_tokens"]
    assert cached(second[-2]["usage"]) == (prompt - 1) // BLOCK * BLOCK > 0


def test_another_prefix_hits_nothing_and_stats_count_the_hits(start_sim) -> None:
    sim = start_sim()
    one = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"}]
    other = [{"role": "system", "content": "Another prompt. " + SYSTEM},
             {"role": "user", "content": "a"}]  # fmt: skip
    sim.chat(model="m", messages=one)
    assert cached(sim.chat(model="m", messages=other)["usage"]) == 0
    hit = cached(sim.chat(model="m", messages=one)["usage"])
    stats = sim.client.get(sim.url + "/sim/stats").json()
    assert stats["cached_tokens"] == hit > 0 and stats["prompt_tokens"] > hit


def test_the_cache_is_bounded_and_forgets_the_least_recent(start_sim) -> None:
    sim = start_sim("--prefix-cache-tokens", str(4 * BLOCK))
    one = [{"role": "user", "content": SYSTEM}]
    other = [{"role": "user", "content": "Other words entirely. " * 30}]
    sim.chat(model="m", messages=one, max_tokens=1)
    # Of a prompt longer than the cache, its first blocks are kept (tails go first).
    assert cached(sim.chat(model="m", messages=one, max_tokens=1)["usage"]) == 4 * BLOCK
    sim.chat(model="m", messages=other, max_tokens=1)
    assert cached(sim.chat(model="m", messages=one, max_tokens=1)["usage"]) == 0


def test_no_cache_reports_no_cached_tokens(start_sim) -> None:
    sim = start_sim("--prefix-cache-tokens", "0")
    messages = [{"role": "user", "content": SYSTEM}]
    sim.chat(model="m", messages=messages)
    assert "prompt_tokens_details" not in sim.chat(model="m", messages=messages)["usage"]


def test_a_call_asked_is_answered_as_tool_calls_whole_and_streamed(sim: Sim) -> None:
    ask = [{"role": "user", "content": '/call get_weather {"city": "Paris"}\n'
                                       '/call get_weather {"city": "Rome"}'}]  # fmt: skip
    answer = sim.chat(model="m", messages=ask, tools=TOOLS)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]  # fmt: skip
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    events = sim.stream("/v1/chat/completions", {"model": "m", "messages": ask, "tools": TOOLS})
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in events[1:-1]
              if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]  # fmt: skip
    assert [d["id"] for d in deltas if "id" in d] == [calls[0]["id"], calls[1]["id"]]
    for k in (0, 1):
        streamed = "".join(d["function"]["arguments"] for d in deltas if d["index"] == k)
        assert streamed == calls[k]["function"]["arguments"]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_call_to_a_tool_the_request_lacks_is_refused(sim: Sim) -> None:
    response = sim.post("/v1/chat/completions", {"model": "m", "tools": TOOLS, "messages": [
        {"role": "user", "content": "/call delete_all {}"}]})  # fmt: skip
    assert response.status_code == 400 and "delete_all" in response.text


def test_a_tool_result_is_answered_in_text_and_the_prompt_holds_tools_and_calls(sim: Sim) -> None:
    messages = [
        {"role": "user", "content": '/call get_weather {"city": "Paris"}'},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    ]  # fmt: skip
    answer = sim.chat(model="m", messages=messages, tools=TOOLS)
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["choices"][0]["message"]["content"]
    prompt = sim.post("/apply-template", {"messages": messages, "tools": TOOLS}).json()["prompt"]
    assert '"get_weather"' in prompt and "<tool_call>" in prompt and "18 C" in prompt
    with_tools = sim.post("/tokenize", {"messages": messages, "tools": TOOLS}).json()["count"]
    without = sim.post("/tokenize", {"messages": messages}).json()["count"]
    assert with_tools > without == len(tokenize(sim.post("/apply-template", {
        "messages": messages}).json()["prompt"]))  # fmt: skip
    assert answer["usage"]["prompt_tokens"] == with_tools


def test_the_stop_string_it_stopped_at_is_said(sim: Sim) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "/echo one two END three"}],
            "stop": ["END", "zzz"]}  # fmt: skip
    choice = sim.chat(**body)["choices"][0]
    assert choice["message"]["content"] == "one two " and choice["stop_reason"] == "END"
    events = sim.stream("/v1/chat/completions", body)
    assert events[-2]["choices"][0]["stop_reason"] == "END"
    plain = sim.chat(model="m", messages=[{"role": "user", "content": "/echo one"}])
    assert plain["choices"][0]["stop_reason"] is None


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_answers_as_vllm_does(sim: Sim, path: str) -> None:
    docs = ["Berlin is big.", "The weather in Paris is mild.", {"text": "Paris in spring."}]
    response = sim.post(path, {"model": "m", "query": "Paris weather", "documents": docs,
                               "top_n": 2})  # fmt: skip
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "m" and answer["usage"]["total_tokens"] > 0
    assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == [(1, 1.0), (2, 0.5)]
    assert answer["results"][0]["document"] == {"text": "The weather in Paris is mild."}


@pytest.mark.parametrize("body", [{"query": 3, "documents": ["a"]}, {"query": "q"},
                                  {"query": "q", "documents": ["a"], "top_n": 0},
                                  {"query": "q", "documents": [4]}])  # fmt: skip
def test_a_bad_rerank_request_is_refused(sim: Sim, body: dict[str, Any]) -> None:
    assert sim.post("/v1/rerank", {"model": "m", **body}).status_code == 400


# -- the cache itself -----------------------------------------------------------------------------

words = st.lists(st.sampled_from(["a", " b", " c", "\n", " dd"]), max_size=120)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=words, rest=words, capacity=st.integers(0, 40))
def test_a_cache_hit_is_whole_blocks_of_a_served_prefix(first, rest, capacity) -> None:
    cache = PrefixCache(capacity * BLOCK)
    assert cache.lookup(first) == 0
    cache.store(first)
    hit = cache.lookup([*first, *rest])
    assert hit % BLOCK == 0 and hit <= max(0, len(first) + len(rest) - 1)
    assert hit <= len(first) // BLOCK * BLOCK
    if capacity >= len(first) // BLOCK and rest:
        assert hit == len(first) // BLOCK * BLOCK
    assert len(cache) <= capacity


# -- its own Responses and Messages routes, as vLLM serves them ------------------------------


def test_its_own_responses_route_is_read_by_the_openai_client(sim: Sim) -> None:
    import openai

    api = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0, timeout=30)
    tools = [{"type": "function", "name": "get_weather",
              "parameters": TOOLS[0]["function"]["parameters"]}]  # fmt: skip
    whole = api.responses.create(model="m", instructions=SYSTEM, input="/echo hello there")
    assert whole.output_text == "hello there" and whole.status == "completed"
    again = api.responses.create(model="m", instructions=SYSTEM, input="/echo hello there")
    assert again.usage.input_tokens_details.cached_tokens > 0
    # The client's stream helper checks every event's sequence_number and index.
    with api.responses.stream(model="m", input="/echo streamed words") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "streamed words"
    assert final.usage.output_tokens > 0
    called = api.responses.create(model="m", tools=tools,
                                  input='/call get_weather {"city": "Oslo"}')  # fmt: skip
    (call,) = [i for i in called.output if i.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    cut = api.responses.create(model="m", input="Say a lot.", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    # Stateless, as llama-server is: a gateway sends the whole conversation.
    with pytest.raises(openai.BadRequestError):
        api.responses.create(model="m", input="more", previous_response_id=whole.id)


def test_its_own_messages_route_is_read_by_the_anthropic_client(sim: Sim) -> None:
    import anthropic

    api = anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0, timeout=30)
    asked = [{"role": "user", "content": "/echo hello there END more"}]
    message = api.messages.create(model="m", max_tokens=32, system=SYSTEM, messages=asked,
                                  stop_sequences=["END"])  # fmt: skip
    assert message.content[0].text == "hello there "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    with api.messages.stream(model="m", max_tokens=32, system=SYSTEM, messages=asked) as stream:
        assert "".join(stream.text_stream) == "hello there END more"
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.usage.cache_read_input_tokens > 0
    tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    with api.messages.stream(model="m", max_tokens=64, tools=tools, messages=[
        {"role": "user", "content": '/call get_weather {"city": "Oslo"}'}]) as stream:  # fmt: skip
        called = stream.get_final_message()
    assert called.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in called.content] == [("get_weather", {"city": "Oslo"})]
    stats = sim.client.get(sim.url + "/sim/stats").json()
    assert stats["messages"] >= 3
