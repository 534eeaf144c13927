"""The guard judges all an engine reads of a dialect's request: the chat reader
(``gateway.path.body``) over the translated chat body finds a marker put in any field that
reaches the engine, and the whole-answer readers find one in any output."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.path import body as bodies
from gateway.path.dialects import messages, rerank, responses


def judged(chat: dict[str, Any]) -> str:
    return bodies.read(bodies.CHAT, chat).text


def markers(value: Any) -> list[str]:
    found = re.findall(r"M-[a-z]+", repr(value))
    assert found
    return found


RESPONSES_FIELDS = {
    "instructions": {"instructions": "M-instructions"},
    "text input": {"input": "M-text"},
    "developer": {"input": [{"role": "developer", "content": "M-developer"}]},
    "input part": {"input": [{"role": "user", "content": [{"type": "input_text",
                                                            "text": "M-part"}]}]},
    "assistant": {"input": [{"type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": "M-assistant"}]}]},
    "refusal": {"input": [{"type": "message", "role": "assistant",
                           "content": [{"type": "refusal", "refusal": "M-refusal"}]}]},
    "call name": {"input": [{"type": "function_call", "call_id": "c", "name": "M-name",
                             "arguments": "{}"}]},
    "call arguments": {"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                  "arguments": '{"x": "M-arguments"}'}]},
    "tool output": {"input": [{"type": "function_call_output", "call_id": "c",
                               "output": "M-output"}]},
    "tool output parts": {"input": [{"type": "function_call_output", "call_id": "c",
                                     "output": [{"type": "input_text", "text": "M-oparts"}]}]},
    "reasoning": {"input": [{"type": "reasoning", "summary": [],
                             "content": [{"type": "reasoning_text", "text": "M-reasoning"}]}]},
    "tool description": {"tools": [{"type": "function", "name": "f",
                                    "description": "M-description"}]},
    "tool schema": {"tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"M-schema": {"type": "string"}}}}]},
}  # fmt: skip


@pytest.mark.parametrize("field", sorted(RESPONSES_FIELDS))
def test_every_field_of_a_responses_request_is_judged(field: str) -> None:
    body = {"model": "m", "input": "hello", **RESPONSES_FIELDS[field]}
    if "input" in RESPONSES_FIELDS[field] and isinstance(body["input"], list):
        body["input"] = [*body["input"], {"role": "user", "content": "go on"}]
    text = judged(responses.chat_request(responses.read(body)))
    for marker in markers(RESPONSES_FIELDS[field]):
        assert marker in text, (field, marker)


def test_a_continued_conversation_is_judged_whole() -> None:
    first = responses.read({"model": "m", "input": "M-earlier-question"})
    answer = responses.answer(first, {"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "M-earlier-answer"}}]})  # fmt: skip
    history = responses.conversation([], first, answer)
    second = responses.read({"model": "m", "input": "next", "previous_response_id": answer["id"]})
    text = judged(responses.chat_request(second, history))
    assert "M-earlier-question" in text and "M-earlier-answer" in text


MESSAGES_FIELDS = {
    "system": {"system": "M-system"},
    "system blocks": {"system": [{"type": "text", "text": "M-sblock"}]},
    "user text": {"messages": [{"role": "user", "content": [{"type": "text", "text": "M-user"}]}]},
    "assistant text": {"messages": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": "M-assistant"}]},
    "thinking": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "M-thinking", "signature": ""}]}]},
    "tool use": {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "M-toolname", "input": {"a": "M-input"}}]}]},
    "tool result": {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "M-result"}]}]},
    "tool result blocks": {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t",
         "content": [{"type": "text", "text": "M-rblock"}]}]}]},
    "tool description": {"tools": [{"name": "f", "description": "M-tdesc",
                                    "input_schema": {"type": "object"}}]},
    "tool schema": {"tools": [{"name": "f", "input_schema": {
        "type": "object", "properties": {"M-tschema": {}}}}]},
}  # fmt: skip


@pytest.mark.parametrize("field", sorted(MESSAGES_FIELDS))
def test_every_field_of_a_messages_request_is_judged(field: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}],
            **MESSAGES_FIELDS[field]}  # fmt: skip
    text = judged(messages.chat_request(messages.read(body)))
    for marker in markers(MESSAGES_FIELDS[field]):
        assert marker in text, (field, marker)


def test_every_output_of_a_whole_answer_is_judged() -> None:
    chat = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "M-text", "reasoning_content": "M-reason",
        "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": "M-fn", "arguments": '{"a": "M-arg"}'}}]}}]}  # fmt: skip
    out = responses.answer(responses.read({"model": "m", "input": "x"}), chat)
    said = responses.output_text(out)
    message = messages.answer(messages.read({"model": "m", "max_tokens": 5,
                                             "messages": [{"role": "user", "content": "x"}]}),
                              chat)  # fmt: skip
    said_too = messages.answer_text(message)
    for marker in ("M-text", "M-reason", "M-fn", "M-arg"):
        assert marker in said and marker in said_too


def test_a_rerank_request_is_judged_query_and_documents() -> None:
    request = rerank.read({"model": "r", "query": "M-query", "documents": ["a", {"text": "M-doc"}]})
    text = rerank.judged_text(request)
    assert "M-query" in text and "M-doc" in text


def test_a_native_streams_events_give_the_text_they_carry() -> None:
    """What the guard would read of an engine's own stream: every delta, once."""
    from gateway.path.dialects.messages_stream import MessagesStream
    from gateway.path.dialects.responses_stream import ResponsesStream
    from tests.gateway.dialects.chat import stream

    chunks = stream(["M-te", "xt"], reasoning=["M-re"], finish="tool_calls",
                    calls=[("c", "M-fn", ['{"a": ', '"M-arg"}'])])  # fmt: skip
    r = ResponsesStream(responses.read({"model": "m", "input": "x"}))
    events = [e for c in chunks for e in r.feed(c)] + r.finish()
    assert "".join(responses.event_text(e) for e in events) == r.text()
    m = MessagesStream(messages.read({"model": "m", "max_tokens": 5,
                                      "messages": [{"role": "user", "content": "x"}]}))  # fmt: skip
    events = [e for c in chunks for e in m.feed(c)] + m.finish()
    said = "".join(messages.event_text(e) for e in events)
    for marker in ("M-text", "M-re", "M-fn", "M-arg"):
        assert marker in said
    assert responses.event_text("x") == messages.event_text(None) == ""
