"""An engine's own Responses and Messages answers, normalized (gateway.path.dialects.native):
the body the engine is sent, and its events read into the chat chunks the guard judges and
the dialect's own writer turns back into the API's events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.path.dialects import messages, native, responses
from gateway.path.dialects.messages_stream import MessagesStream
from gateway.path.dialects.native import MessagesNative, NativeError, ResponsesNative
from gateway.path.dialects.responses_stream import ResponsesStream


def _text(chunks: list[dict[str, Any]]) -> str:
    return native._text_of(chunks)


def _events(reader: Any, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in events:
        out += reader.feed(event)
    return out


def test_the_responses_body_is_the_checked_request_with_the_whole_conversation() -> None:
    data = {"model": "alias", "input": "And of Italy?", "previous_response_id": "resp_1",
            "instructions": "Be brief.", "max_output_tokens": 9, "prompt_cache_key": "s1",
            "include": ["reasoning.encrypted_content"], "truncation": "auto", "stream": True}  # fmt: skip
    request = responses.read(data)
    history = [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "unjudged"}],
                "content": [{"type": "reasoning_text", "text": "hmm"}]},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Capital of France?"}]},
               {"type": "message", "role": "assistant", "id": "msg_1",
                "content": [{"type": "output_text", "text": "Paris."}]}]  # fmt: skip
    body = native.responses_body(data, request, history, "qwen3-8b")
    assert body["model"] == "qwen3-8b"  # the name the engine knows
    assert [i["content"][0]["text"] for i in body["input"]] == \
        ["hmm", "Capital of France?", "Paris.", "And of Italy?"]  # fmt: skip
    # A reasoning summary is not in the chat body the guard judges: not sent either.
    assert body["input"][0]["summary"] == [] and "unjudged" not in json.dumps(body)
    # The engine keeps nothing and continues nothing: the gateway's store does.
    assert body["store"] is False and "previous_response_id" not in body
    # Only the fields the gateway serves; the session key is the gateway's.
    assert set(body) == {"model", "input", "instructions", "max_output_tokens", "stream", "store"}


def test_the_messages_body_leaves_out_the_billing_block_and_what_is_not_judged() -> None:
    data = {"model": "m", "max_tokens": 5, "stream": False, "mcp_servers": [],
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                       {"type": "text", "text": "You are terse."}],
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [
                             {"type": "redacted_thinking", "data": "b3BhcXVl"},
                             {"type": "text", "text": "Hello."}]},
                         {"role": "user", "content": "again"}],
            "stop_sequences": ["END"]}  # fmt: skip
    body = native.messages_body(data, messages.read(data), "served")
    # Opaque redacted thinking is not judged: not sent either.
    assert body["messages"][1]["content"] == [{"type": "text", "text": "Hello."}]
    assert body["system"] == [{"type": "text", "text": "You are terse."}]
    assert body["model"] == "served" and body["stop_sequences"] == ["END"]
    assert "mcp_servers" not in body


# A vLLM Responses stream (the openai package's event types, each numbered), with a
# function call after the text, and usage with cached tokens.
VLLM_RESPONSES = [
    {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_e"}},
    {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
     "item": {"type": "message", "id": "msg_e", "role": "assistant", "content": []}},
    {"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_e",
     "output_index": 0, "content_index": 0, "delta": "Par"},
    {"type": "response.output_text.delta", "sequence_number": 3, "item_id": "msg_e",
     "output_index": 0, "content_index": 0, "delta": "is"},
    {"type": "response.output_text.done", "sequence_number": 4, "item_id": "msg_e",
     "output_index": 0, "content_index": 0, "text": "Paris"},
    {"type": "response.output_item.added", "sequence_number": 5, "output_index": 1,
     "item": {"type": "function_call", "id": "fc_e", "call_id": "call_1", "name": "get",
              "arguments": ""}},
    {"type": "response.function_call_arguments.delta", "sequence_number": 6, "item_id": "fc_e",
     "output_index": 1, "delta": '{"city": '},
    {"type": "response.function_call_arguments.delta", "sequence_number": 7, "item_id": "fc_e",
     "output_index": 1, "delta": '"Oslo"}'},
    {"type": "response.completed", "sequence_number": 8, "response": {
        "id": "resp_e", "status": "completed", "output": [],
        "usage": {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 32},
                  "output_tokens": 6, "output_tokens_details": {"reasoning_tokens": 0}}}},
]  # fmt: skip


def test_a_native_responses_stream_is_written_again_by_the_gateway() -> None:
    reader = ResponsesNative()
    chunks = _events(reader, VLLM_RESPONSES)
    assert reader.ended
    assert _text(chunks) == 'Parisget{"city": "Oslo"}'
    writer = ResponsesStream(responses.read({"model": "m", "input": "x", "stream": True}))
    out = [e for c in chunks for e in writer.feed(c)] + writer.finish()
    # The gateway's own events: numbered from 0, its ids, the engine's usage.
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    final = out[-1]["response"]
    assert out[-1]["type"] == "response.completed" and final["id"].startswith("resp_")
    assert final["id"] != "resp_e"
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["arguments"] == '{"city": "Oslo"}'
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 32
    assert final["usage"]["input_tokens"] == 40 and final["usage"]["output_tokens"] == 6


def test_a_stream_without_numbers_or_deltas_loses_no_text() -> None:
    """llama-server's shape: no sequence_number, output_index or content_index; text the
    deltas did not carry comes whole in .done, and is carried then."""
    reader = ResponsesNative()
    chunks = _events(reader, [
        {"type": "response.created", "response": {"id": "r", "object": "response"}},
        {"type": "response.output_text.delta", "item_id": "m", "delta": "He"},
        {"type": "response.output_text.done", "item_id": "m", "text": "Hello"},
        {"type": "response.output_item.done", "item": {
            "type": "function_call", "id": "f", "call_id": "c", "name": "go",
            "arguments": "{}"}},
        {"type": "response.incomplete", "response": {
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}},
    ])  # fmt: skip
    assert _text(chunks) == "Hellogo{}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_an_unknown_event_with_text_is_judged_as_text() -> None:
    chunks = ResponsesNative().feed({"type": "response.reasoning_summary_text.delta",
                                     "delta": "thinking"})  # fmt: skip
    assert _text(chunks) == "thinking"
    # An event kind no reader knows, whose text event_text finds, is still carried.
    reader = MessagesNative()
    chunks = reader.feed({"type": "content_block_delta", "index": 0,
                          "delta": {"type": "citations_delta", "text": "cited"}})  # fmt: skip
    assert _text(chunks) == "cited"


@pytest.mark.parametrize("event", [
    {"type": "error", "message": "boom"},
    {"type": "response.failed", "response": {"error": {"message": "boom"}}},
])  # fmt: skip
def test_an_engines_failure_is_a_failure(event: dict[str, Any]) -> None:
    with pytest.raises(NativeError, match="boom"):
        ResponsesNative().feed(event)


# A vLLM Messages stream: the prompt's usage in message_start, a stop sequence.
VLLM_MESSAGES = [
    {"type": "message_start", "message": {"id": "msg_e", "usage": {
        "input_tokens": 3, "cache_read_input_tokens": 16, "output_tokens": 0}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "there"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "toolu_1", "name": "get", "input": {}}},
    {"type": "content_block_delta", "index": 1,
     "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'}},
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
     "usage": {"output_tokens": 4}},
    {"type": "message_stop"},
]  # fmt: skip


def test_a_native_messages_stream_is_written_again_by_the_gateway() -> None:
    reader = MessagesNative()
    chunks = _events(reader, VLLM_MESSAGES)
    assert reader.ended and _text(chunks) == 'Hi thereget{"a": 1}'
    request = messages.read({"model": "m", "max_tokens": 9, "stream": True,
                             "stop_sequences": ["END"],
                             "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    writer = MessagesStream(request)
    out = [e for c in chunks for e in writer.feed(c)] + writer.finish()
    assert out[-1] == {"type": "message_stop"}
    delta = out[-2]
    assert delta["delta"]["stop_reason"] == "stop_sequence"
    assert delta["delta"]["stop_sequence"] == "END"
    assert delta["usage"]["input_tokens"] == 3 and delta["usage"]["cache_read_input_tokens"] == 16
    assert delta["usage"]["output_tokens"] == 4
    message = writer.message()
    assert message["content"][1]["input"] == {"a": 1} and message["id"] != "msg_e"


def test_whole_native_answers_read_as_chat_answers() -> None:
    chat = ResponsesNative.whole({"id": "resp_e", "status": "completed", "output": [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Paris"}]},
        {"type": "function_call", "call_id": "c", "name": "get", "arguments": "{}"},
    ], "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 8},
                 "output_tokens": 2}})  # fmt: skip
    message = chat["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Paris", "hmm")
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
    again = responses.answer(responses.read({"model": "m", "input": "x"}), chat)
    assert again["id"] != "resp_e" and again["usage"]["input_tokens_details"]["cached_tokens"] == 8

    chat = MessagesNative.whole({"type": "message", "content": [
        {"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "t", "name": "get",
                                         "input": {"a": 1}}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 2, "cache_read_input_tokens": 6,
                                             "output_tokens": 3}})  # fmt: skip
    assert chat["usage"]["prompt_tokens"] == 8
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 6
    call = chat["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"a": 1}
    with pytest.raises(NativeError):
        MessagesNative.whole({"type": "error", "error": {"message": "no"}})
    with pytest.raises(NativeError):
        ResponsesNative.whole({"object": "chat.completion", "choices": []})
