"""Anthropic's Messages API as chat completions: requests read and translated, whole
answers and streams written as the API's messages and events, refusals and failures
ended in the API's own way, errors in its shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.path.dialects import messages
from gateway.path.dialects.common import DialectError, Usage
from gateway.path.dialects.messages_stream import MessagesStream
from tests.gateway.dialects.chat import (
    USAGE,
    check_messages,
    messages_text,
    stream,
    whole,
)

TOOL = {"name": "get_weather", "description": "the weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


def read(**body: Any) -> messages.MessagesRequest:
    return messages.read({"model": "m", "max_tokens": 64, **body})


def test_system_and_messages_become_chat_messages() -> None:
    request = read(system="Be brief.", messages=[{"role": "user", "content": "Hi"}],
                   stop_sequences=["END"], temperature=0.5, top_k=5, stream=True)  # fmt: skip
    body = messages.chat_request(request)
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}]  # fmt: skip
    assert body["max_tokens"] == 64 and body["stop"] == ["END"]
    assert body["temperature"] == 0.5 and body["top_k"] == 5
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert messages.ENGINE_PATH == "/v1/chat/completions"


def test_blocks_become_what_a_chat_engine_reads() -> None:
    request = read(
        system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2; cch=ab12;"},
                {"type": "text", "text": "You are a coder.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be careful."}],
        messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "Weather? "},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "AAAA"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Paris.", "signature": "s"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "18 C"}]},
                {"type": "text", "text": "And now?"}]},
        ],
        tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather",
                                   "disable_parallel_tool_use": True},
    )  # fmt: skip
    body = messages.chat_request(request)
    assert body["messages"] == [
        {"role": "system", "content": "You are a coder.\nBe careful."},
        {"role": "user", "content": [
            {"type": "text", "text": "Weather? "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Paris.",
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "user", "content": "And now?"},
    ]  # fmt: skip
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": TOOL["input_schema"],
        "description": "the weather"}}]  # fmt: skip
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False


def test_a_system_string_is_kept_whole_even_with_a_billing_line() -> None:
    text = "x-anthropic-billing-header: cch=1;You are Claude Code."
    body = messages.chat_request(read(system=text, messages=[{"role": "user", "content": "x"}]))
    assert body["messages"][0] == {"role": "system", "content": text}


@pytest.mark.parametrize(("choice", "chat"), [({"type": "auto"}, "auto"),
                                              ({"type": "any"}, "required"),
                                              ({"type": "none"}, "none")])  # fmt: skip
def test_tool_choice_maps_to_chats(choice: dict[str, Any], chat: str) -> None:
    body = messages.chat_request(read(messages=[{"role": "user", "content": "x"}],
                                      tools=[TOOL], tool_choice=choice))  # fmt: skip
    assert body["tool_choice"] == chat


def test_the_session_key_never_reaches_the_engine() -> None:
    request = read(messages=[{"role": "user", "content": "x"}],
                   metadata={"user_id": "user_1_session_2"})  # fmt: skip
    assert request.user_id == "user_1_session_2"
    assert "metadata" not in messages.chat_request(request)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
         "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
         "messages[0].role"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]},
         "messages[0].content"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {}}]}]}, "messages[0].content[0].type"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
         "messages[0].content[0].source.type"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "x"}]}]}, "messages[0].content[0].tool_use_id"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {1: object()}}]}]},
         "messages[0].content[0].input"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "some"}}, "tool_choice.type"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "stop_sequences": "END"}, "stop_sequences"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "metadata": {"user_id": 7}}, "metadata.user_id"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
          "system": [{"type": "image"}]}, "system[0].type"),
    ],
)  # fmt: skip
def test_a_request_it_cannot_serve_names_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(DialectError) as caught:
        messages.read(body)
    assert caught.value.param == param, caught.value.message


# -- count_tokens -----------------------------------------------------------------------------


def test_count_tokens_asks_the_engine_to_tokenize_the_prompt() -> None:
    body = messages.count_request({"model": "m", "system": "S", "tools": [TOOL],
                                   "tool_choice": {"type": "any"},
                                   "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
    assert body["messages"] == [{"role": "system", "content": "S"},
                                {"role": "user", "content": "Hi"}]  # fmt: skip
    assert body["add_generation_prompt"] is True and body["tools"][0]["function"]["name"]
    assert "tool_choice" not in body
    assert messages.count_answer({"count": 12, "tokens": [1] * 12}) == {"input_tokens": 12}
    assert messages.count_answer({"input_tokens": 7}) == {"input_tokens": 7}
    assert messages.count_answer({"tokens": [1, 2]}) == {"input_tokens": 2}
    with pytest.raises(DialectError):
        messages.count_answer({"error": "x"})


# -- whole answers ----------------------------------------------------------------------------


def test_a_whole_answer_is_a_message_with_cache_reads() -> None:
    out = messages.answer(read(messages=[{"role": "user", "content": "x"}]),
                          whole("Hello there"), message_id="msg_1")  # fmt: skip
    assert out == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "Hello there"}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 24, "output_tokens": 9, "cache_read_input_tokens": 96,
                  "cache_creation_input_tokens": 0},
    }  # fmt: skip


def test_thinking_text_and_tool_uses_are_blocks_in_order() -> None:
    chat = whole("Let me check.", reasoning="Hm.", finish="tool_calls",
                 calls=[("call_1", "get_weather", '{"city": "Paris"}'),
                        ("call_2", "get_weather", "not json")])  # fmt: skip
    out = messages.answer(read(messages=[{"role": "user", "content": "x"}]), chat)
    assert [b["type"] for b in out["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert out["content"][2] == {"type": "tool_use", "id": "call_1", "name": "get_weather",
                                 "input": {"city": "Paris"}}  # fmt: skip
    assert out["content"][3]["input"] == {}  # not an object: the block must hold one
    assert out["stop_reason"] == "tool_use"
    assert messages.answer_text(out) == 'Hm.\nLet me check.\nget_weather\n{"city": "Paris"}\n' \
        'get_weather\n{}'  # fmt: skip


@pytest.mark.parametrize(
    ("finish", "matched", "reason", "sequence"),
    [("length", None, "max_tokens", None), ("content_filter", None, "refusal", None),
     ("stop", "END", "stop_sequence", "END"), ("stop", "OTHER", "end_turn", None),
     ("stop", None, "end_turn", None)],
)  # fmt: skip
def test_the_stop_reason_follows_the_finish(finish, matched, reason, sequence) -> None:
    request = read(messages=[{"role": "user", "content": "x"}], stop_sequences=["END"])
    out = messages.answer(request, whole("a", finish=finish, stop_reason=matched))
    assert (out["stop_reason"], out["stop_sequence"]) == (reason, sequence)


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (402, "billing_error"),
     (403, "permission_error"), (404, "not_found_error"), (405, "invalid_request_error"),
     (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
     (502, "api_error"), (503, "overloaded_error"), (504, "timeout_error"),
     (529, "overloaded_error")],
)  # fmt: skip
def test_errors_take_anthropics_type_for_their_status(status: int, kind: str) -> None:
    payload = messages.error_payload(status, "why", code="content_filter", request_id="req_1")
    assert payload == {"type": "error", "request_id": "req_1", "error": {
        "type": kind, "message": "why", "details": {"error_code": "content_filter"}}}  # fmt: skip


def test_an_openai_shaped_error_is_rewritten_keeping_its_message() -> None:
    raw = json.dumps({"error": {"code": 400, "message": "bad", "type": "invalid_request_error"}})
    assert json.loads(messages.from_openai_error(400, raw.encode())) == {
        "type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}  # fmt: skip
    assert json.loads(messages.from_openai_error(502, b"<html>gone</html>"))["error"] == {
        "type": "api_error", "message": "<html>gone</html>"}  # fmt: skip
    said = json.loads(messages.from_openai_error(429, json.dumps(
        {"error": {"message": "slow", "code": "rate_limit_exceeded"}}).encode()))  # fmt: skip
    assert said["error"]["details"] == {"error_code": "rate_limit_exceeded"}


# -- streams ------------------------------------------------------------------------------------


def run(chunks: list[dict[str, Any]], request: messages.MessagesRequest | None = None,
        end: str = "finish") -> list[dict[str, Any]]:  # fmt: skip
    translator = MessagesStream(request or read(messages=[{"role": "user", "content": "x"}],
                                                stream=True), message_id="msg_1")  # fmt: skip
    events = [e for c in chunks for e in translator.feed(c)]
    events += translator.fail("engine died") if end == "fail" else getattr(translator, end)()
    return events


def test_a_streamed_answer_is_the_apis_events_in_order() -> None:
    events = run(stream(["Hel", "lo"]))
    assert [e["type"] for e in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert events[0]["message"]["content"] == [] and events[0]["message"]["id"] == "msg_1"
    assert events[1] == {"type": "content_block_start", "index": 0,
                         "content_block": {"type": "text", "text": ""}}  # fmt: skip
    assert events[-2] == {"type": "message_delta",
                          "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                          "usage": {"input_tokens": 24, "output_tokens": 9,
                                    "cache_read_input_tokens": 96,
                                    "cache_creation_input_tokens": 0}}  # fmt: skip
    assert check_messages(events)[0]["text"] == "Hello"


def test_usage_known_at_the_first_chunk_is_in_message_start() -> None:
    chunks = stream(["a"])
    chunks[0]["usage"] = USAGE
    start = run(chunks)[0]["message"]["usage"]
    assert start["input_tokens"] == 24 and start["cache_read_input_tokens"] == 96
    assert start["output_tokens"] == 0


def test_thinking_text_and_tool_uses_stream_as_blocks() -> None:
    chunks = stream(["Checking."], reasoning=["Hm", "m."], finish="tool_calls",
                    calls=[("call_1", "get_weather", ['{"ci', 'ty": "Paris"}'])])  # fmt: skip
    events = run(chunks)
    blocks = check_messages(events)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == "Hmm." and blocks[1]["text"] == "Checking."
    assert blocks[2]["id"] == "call_1" and json.loads(blocks[2]["_json"]) == {"city": "Paris"}
    signature = [e for e in events if e.get("delta", {}).get("type") == "signature_delta"]
    assert len(signature) == 1 and signature[0]["index"] == 0
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_a_stop_string_named_by_the_engine_is_a_stop_sequence() -> None:
    request = read(messages=[{"role": "user", "content": "x"}], stop_sequences=["END"])
    events = run(stream(["a"], stop_reason="END"), request)
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_a_refused_stream_ends_with_stop_reason_refusal() -> None:
    translator = MessagesStream(read(messages=[{"role": "user", "content": "x"}]))
    events = [e for c in stream(["Safe ", "text"])[:2] for e in translator.feed(c)]
    events += translator.refuse(Usage(input=10, output=1))
    check_messages(events)
    assert messages_text(events) == "Safe "
    assert events[-2]["delta"] == {"stop_reason": "refusal", "stop_sequence": None,
                                   "stop_details": {"type": "refusal", "category": None,
                                                    "explanation": None}}  # fmt: skip
    assert events[-2]["usage"]["output_tokens"] == 1
    assert translator.message()["stop_reason"] == "refusal"
    assert translator.feed(stream(["late"])[1]) == [] and translator.finish() == []


def test_a_failed_stream_ends_with_the_apis_error_event() -> None:
    events = run(stream(["a"])[:2], end="fail")
    assert events[-1] == {"type": "error", "error": {"type": "api_error",
                                                    "message": "engine died"}}  # fmt: skip
    check_messages(events)


def test_the_ping_is_the_apis_keepalive() -> None:
    assert MessagesStream.ping() == {"type": "ping"}


STREAMS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


@st.composite
def chunked(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(texts)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@STREAMS
@given(case=chunked(), thought=chunked(), arguments=chunked())
def test_any_chunking_gives_the_same_blocks(case, thought, arguments) -> None:
    text, pieces = case
    reasoning, thought_pieces = thought
    args, arg_pieces = arguments
    events = run(stream(pieces, reasoning=thought_pieces, calls=[("c1", "f", arg_pieces)],
                        finish="tool_calls"))  # fmt: skip
    blocks = check_messages(events)
    assert messages_text(events) == text
    assert [b["type"] for b in blocks] == [k for k, t in (("thinking", reasoning),
                                                         ("text", text)) if t] + ["tool_use"]  # fmt: skip
    assert blocks[-1]["_json"] == args


@STREAMS
@given(case=chunked(), cut=st.integers(0, 20))
def test_a_refusal_anywhere_ends_a_well_formed_stream(case, cut) -> None:
    _, pieces = case
    fed = stream(pieces)[:cut]
    events = run(fed, end="refuse")
    check_messages(events)
    released = "".join(c["choices"][0]["delta"].get("content", "") for c in fed if c["choices"])
    assert messages_text(events) == released
    assert events[-2]["delta"]["stop_reason"] == "refusal"
