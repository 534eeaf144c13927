"""The Responses API as chat completions: requests read and translated, whole answers and
streams written as the API's objects and typed events, refusals and failures ended in
the API's own way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.path.dialects import responses
from gateway.path.dialects.common import DialectError, typed_sse
from gateway.path.dialects.responses_stream import ResponsesStream
from tests.gateway.dialects.chat import (
    USAGE,
    check_responses,
    parse_sse,
    responses_text,
    stream,
    whole,
)

TOOL = {"type": "function", "name": "get_weather", "description": "the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


def counter() -> Any:
    """Ids that say their order, for exact assertions."""
    seen: dict[str, int] = {}

    def ids(prefix: str) -> str:
        seen[prefix] = seen.get(prefix, 0) + 1
        return f"{prefix}{seen[prefix]}"

    return ids


def read(**body: Any) -> responses.ResponsesRequest:
    return responses.read({"model": "m", **body})


def test_a_text_input_is_one_user_message_after_the_instructions() -> None:
    request = read(input="Hi", instructions="Be brief.", max_output_tokens=50,
                   temperature=0.2, stream=True)  # fmt: skip
    body = responses.chat_request(request)
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}]  # fmt: skip
    assert body["max_tokens"] == 50 and body["temperature"] == 0.2
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert responses.ENGINE_PATH == "/v1/chat/completions"


def test_items_become_the_chat_messages_an_engine_reads() -> None:
    request = read(input=[
        {"role": "developer", "content": "Use metric units."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in Paris? "},
            {"type": "input_text", "text": "And Rome."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Two cities."}]},
        {"type": "message", "role": "assistant", "id": "msg_1",
         "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather",
         "arguments": {"city": "Rome"}},
        {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "21 C"}]},
    ], tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})  # fmt: skip
    body = responses.chat_request(request)
    assert body["messages"] == [
        {"role": "system", "content": "Use metric units."},
        {"role": "user", "content": "Weather in Paris? And Rome."},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two cities.",
         "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
             {"id": "c2", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "21 C"},
    ]  # fmt: skip
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "the weather",
        "parameters": TOOL["parameters"]}}]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_images_go_by_url_and_formats_and_effort_are_chats() -> None:
    request = read(
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is it?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]}],
        text={"format": {"type": "json_schema", "name": "thing", "strict": True,
                         "schema": {"type": "object"}}},
        reasoning={"effort": "low"}, parallel_tool_calls=False, user="u1",
    )  # fmt: skip
    body = responses.chat_request(request)
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "thing", "schema": {"type": "object"}, "strict": True}}  # fmt: skip
    assert body["reasoning_effort"] == "low"
    assert body["parallel_tool_calls"] is False and body["user"] == "u1"
    assert "stream_options" not in body


def test_the_gateways_own_fields_never_reach_the_engine() -> None:
    request = read(input="x", prompt_cache_key="tenant-a", previous_response_id="resp_1",
                   store=False, metadata={"k": "v"})  # fmt: skip
    body = responses.chat_request(request)
    for name in ("prompt_cache_key", "previous_response_id", "store", "metadata", "input",
                 "instructions"):  # fmt: skip
        assert name not in body
    assert request.prompt_cache_key == "tenant-a" and request.store is False
    assert request.previous_response_id == "resp_1"


def test_a_continued_conversation_puts_its_history_first_without_old_instructions() -> None:
    first = read(input="My name is Ada.", instructions="Old rules.")
    answer = responses.answer(first, whole("Hello Ada."), response_id="resp_1", ids=counter())
    history = responses.conversation([], first, answer)
    second = read(input="What is my name?", instructions="New rules.",
                  previous_response_id="resp_1")  # fmt: skip
    body = responses.chat_request(second, history)
    assert body["messages"] == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    # The stored conversation grows turn by turn, readable again as input.
    later = responses.conversation(history, second, answer)
    assert responses.messages_of(responses.input_items(later)) == responses.messages_of(later)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"model": "m", "input": [{"type": "computer_call"}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file"}]}]},
         "input[0].content[0].type"),
        ({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "f"}]}]}, "input[0].content[0].file_id"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]},
         "input[0].output"),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"model": "m", "input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"model": "m", "input": "x", "background": True}, "background"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": "x", "prompt": {"id": "p"}}, "prompt"),
        ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "x", "store": 1}, "store"),
        ({"model": "m", "input": "x", "metadata": []}, "metadata"),
        ({"model": "m", "input": "x", "previous_response_id": ""}, "previous_response_id"),
    ],
)  # fmt: skip
def test_a_request_it_cannot_serve_names_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(DialectError) as caught:
        responses.read(body)
    assert caught.value.param == param, caught.value.message
    assert caught.value.message


def test_an_input_of_nothing_but_instructions_is_refused() -> None:
    with pytest.raises(DialectError) as caught:
        responses.chat_request(read(input=[]))
    assert caught.value.param == "input"


# -- whole answers ----------------------------------------------------------------------------


def test_a_whole_answer_is_a_response_with_cached_tokens() -> None:
    request = read(input="Hi", instructions="Be brief.", metadata={"a": "b"})
    out = responses.answer(request, whole("Hello there"), response_id="resp_9", created=5,
                           ids=counter())  # fmt: skip
    assert out["id"] == "resp_9" and out["object"] == "response" and out["status"] == "completed"
    assert out["model"] == "m" and out["instructions"] == "Be brief."
    assert out["metadata"] == {"a": "b"} and out["created_at"] == 5
    assert out["output"] == [{"type": "message", "id": "msg_1", "role": "assistant",
                              "status": "completed", "content": [
                                  {"type": "output_text", "text": "Hello there",
                                   "annotations": [], "logprobs": []}]}]  # fmt: skip
    assert out["usage"] == {
        "input_tokens": 120, "input_tokens_details": {"cached_tokens": 96},
        "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 129,
    }  # fmt: skip


def test_tool_calls_and_reasoning_become_items_in_order() -> None:
    chat = whole(None, reasoning="Think.", finish="tool_calls",
                 calls=[("call_a", "get_weather", '{"city":"Paris"}')])  # fmt: skip
    out = responses.answer(read(input="x", tools=[TOOL]), chat, ids=counter())
    assert [i["type"] for i in out["output"]] == ["reasoning", "function_call"]
    assert out["output"][1] == {"type": "function_call", "id": "fc_1", "call_id": "call_a",
                                "name": "get_weather", "arguments": '{"city":"Paris"}',
                                "status": "completed"}  # fmt: skip
    assert responses.output_text(out) == 'Think.\nget_weather\n{"city":"Paris"}'


@pytest.mark.parametrize(("finish", "reason"),
                         [("length", "max_output_tokens"), ("content_filter", "content_filter")])  # fmt: skip
def test_an_answer_cut_short_is_incomplete_with_its_reason(finish: str, reason: str) -> None:
    out = responses.answer(read(input="x"), whole("Hel", finish=finish))
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": reason}
    assert out["output"][0]["status"] == "incomplete"


def test_an_engine_without_a_cache_report_says_zero() -> None:
    out = responses.answer(read(input="x"), whole(usage={"prompt_tokens": 3,
                                                        "completion_tokens": 1}))  # fmt: skip
    assert out["usage"]["input_tokens_details"] == {"cached_tokens": 0}


def test_an_answer_that_is_no_chat_completion_is_refused() -> None:
    with pytest.raises(DialectError):
        responses.answer(read(input="x"), {"error": "x"})


# -- streams ------------------------------------------------------------------------------------


def run(chunks: list[dict[str, Any]], request: responses.ResponsesRequest | None = None,
        end: str = "finish") -> list[dict[str, Any]]:  # fmt: skip
    translator = ResponsesStream(request or read(input="x", stream=True),
                                 response_id="resp_1", created=1, ids=counter())  # fmt: skip
    events = [e for c in chunks for e in translator.feed(c)]
    events += getattr(translator, end)() if end != "fail" else translator.fail("engine died")
    return events


def test_a_streamed_answer_is_the_apis_events_in_order() -> None:
    events = run(stream(["Hel", "lo"]))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    response = check_responses(events)
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )
    assert response["status"] == "completed" and response["usage"]["input_tokens_details"] == {
        "cached_tokens": 96}  # fmt: skip
    assert response["output"][0]["content"][0]["text"] == "Hello"
    assert events[4] == {"type": "response.output_text.delta", "sequence_number": 4,
                         "item_id": "msg_1", "output_index": 0, "content_index": 0,
                         "delta": "Hel", "logprobs": []}  # fmt: skip


def test_streamed_tool_calls_and_reasoning_are_items_of_their_own() -> None:
    chunks = stream(["Let me look."], reasoning=["Hm", "m."], finish="tool_calls",
                    calls=[("c1", "get_weather", ['{"ci', 'ty":"Paris"}']),
                           ("c2", "get_weather", ['{"city":"Rome"}'])])  # fmt: skip
    events = run(chunks, read(input="x", tools=[TOOL], stream=True))
    response = check_responses(events)
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call",
                                                       "function_call"]  # fmt: skip
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": "Hmm."}]
    assert response["output"][2]["arguments"] == '{"city":"Paris"}'
    assert response["output"][3]["call_id"] == "c2" and response["status"] == "completed"
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"]) for e in done] == [
        ("get_weather", '{"city":"Paris"}'), ("get_weather", '{"city":"Rome"}')]  # fmt: skip


def test_interleaved_parallel_calls_lose_no_argument() -> None:
    chunks = stream([], finish="tool_calls", calls=[("c1", "f", ['{"a"']), ("c2", "g", ['{"b"'])])
    chunks.insert(-2, {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": ":1}"}}]}}]})  # fmt: skip
    chunks.insert(-2, {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 1, "function": {"arguments": ":2}"}}]}}]})  # fmt: skip
    response = check_responses(run(chunks))
    assert [i["arguments"] for i in response["output"]] == ['{"a":1}', '{"b":2}']


def test_an_answer_at_its_token_limit_ends_incomplete() -> None:
    events = run(stream(["Hel"], finish="length"))
    response = check_responses(events)
    assert events[-1]["type"] == "response.incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_refused_stream_ends_incomplete_for_content_filter_keeping_what_was_released() -> None:
    events = run(stream(["Safe ", "text"])[:2], end="refuse")
    response = check_responses(events)
    assert events[-1]["type"] == "response.incomplete"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert response["output"][0]["status"] == "incomplete"
    assert responses_text(events) == "Safe " == response["output"][0]["content"][0]["text"]


def test_a_refusal_before_any_text_is_a_whole_stream_too() -> None:
    translator = ResponsesStream(read(input="x", stream=True))
    events = translator.refuse()
    assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                          "response.incomplete"]  # fmt: skip
    assert check_responses(events)["output"] == []
    assert translator.feed(stream(["late"])[1]) == [] and translator.finish() == []


def test_a_failed_stream_says_why_then_fails() -> None:
    events = run(stream(["Hel"])[:2], end="fail")
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["message"] == "engine died" and events[-2]["code"] == "server_error"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "engine died"}
    check_responses(events)


def test_typed_events_are_written_with_their_names() -> None:
    raw = typed_sse(run(stream(["Hi"])))
    parsed = parse_sse(raw)
    assert all(name == data["type"] for name, data in parsed)
    assert b"[DONE]" not in raw


def test_usage_arriving_on_an_early_chunk_is_kept() -> None:
    chunks = stream(["a"], usage=None)
    chunks[1]["usage"] = USAGE
    assert check_responses(run(chunks))["usage"]["total_tokens"] == 129


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
# No deadline: a loaded machine's pauses are not the code's.
STREAMS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def chunked(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A text and some split of it into pieces (empty pieces included)."""
    text = draw(texts)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@STREAMS
@given(case=chunked(), arguments=chunked(), finish=st.sampled_from(["stop", "length"]))
def test_any_chunking_gives_the_same_text_and_a_well_formed_stream(case, arguments, finish) -> None:
    text, pieces = case
    args, arg_pieces = arguments
    events = run(stream(pieces, finish=finish, calls=[("c1", "f", arg_pieces)]))
    response = check_responses(events)
    assert responses_text(events) == text
    messages = [i for i in response["output"] if i["type"] == "message"]
    assert "".join(p["text"] for m in messages for p in m["content"]) == text
    assert response["output"][-1]["arguments"] == args


@STREAMS
@given(case=chunked(), cut=st.integers(0, 20))
def test_a_refusal_anywhere_ends_a_well_formed_stream_with_only_what_was_fed(case, cut) -> None:
    text, pieces = case
    chunks = stream(pieces)
    fed = chunks[:cut]
    events = run(fed, end="refuse")
    response = check_responses(events)
    released = "".join(c["choices"][0]["delta"].get("content", "") for c in fed if c["choices"])
    assert responses_text(events) == released
    assert response["incomplete_details"] == {"reason": "content_filter"}
    assert json.dumps(events).count("response.incomplete") == 1


def test_an_ending_takes_the_usage_the_gateway_counted_when_the_engines_did_not_come() -> None:
    from gateway.path.dialects.common import Usage

    translator = ResponsesStream(read(input="x", stream=True))
    for c in stream(["a"], usage=None):
        translator.feed(c)
    refused = translator.refuse(Usage(input=7, output=1))
    assert refused[-1]["response"]["usage"]["input_tokens"] == 7
    other = ResponsesStream(read(input="x", stream=True))
    for c in stream(["a"]):
        other.feed(c)
    done = other.finish(Usage(input=1, output=1))
    assert done[-1]["response"]["usage"]["input_tokens"] == 120  # the engine's own stands
