"""The sim engine's own ``/v1/responses`` and ``/v1/messages``, as vLLM serves them: each
request made the chat completion it means (``responses_chat``, ``messages_chat``), generated
as any chat completion is, and written back in the API's shape, whole
(``response_object``, ``message_object``) or as the API's typed events
(``response_events``, ``message_events``: each under its ``event:`` line, a Responses
event with its ``sequence_number``, no ``[DONE]``).

Stateless, as llama-server is: ``previous_response_id`` is refused (a gateway sends the
whole conversation), nothing is stored. Usage carries the prefix cache's tokens:
``input_tokens_details.cached_tokens`` (Responses), ``cache_read_input_tokens`` with
``input_tokens`` the uncached part (Messages).

Standard library only; no Django.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agent.simhttp import HttpError

Events = AsyncIterator[dict[str, Any]]


class Typed:
    """A stream of typed events (each written under ``event: <type>``, no ``[DONE]``)."""

    def __init__(self, events: Events) -> None:
        self.events = events


def _bad(message: str) -> HttpError:
    return HttpError(400, message, "invalid_request_error")


def _text_parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Content parts (Responses' or Anthropic's) as chat content."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{where}' must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            raise _bad(f"each part of '{where}' must be an object")
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "image" and isinstance(part.get("source"), Mapping):
            source = part["source"]
            url = (
                source.get("url") or f"data:{source.get('media_type')};base64,{source.get('data')}"
            )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _bad(f"a part of type {kind!r} in '{where}' is not served")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _max_tokens(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise _bad(f"'{name}' must be a positive integer")
    return value


def _function(tool: Mapping[str, Any], schema: str) -> dict[str, Any]:
    """A tool as chat's function (its name, description and parameters)."""
    function: dict[str, Any] = {"name": tool.get("name")}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    function["parameters"] = tool.get(schema) or {}
    return function


# -- the Responses API --------------------------------------------------------------------


def responses_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion a Responses body means (a 400 naming what is wrong)."""
    if body.get("previous_response_id"):
        raise _bad("this engine keeps no responses: send the whole conversation as input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    value = body.get("input")
    items = [{"role": "user", "content": value}] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise _bad("'input' must be a string or a non-empty list of items")
    for item in items:
        if not isinstance(item, Mapping):
            raise _bad("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(f"an input message's role is {role!r}")
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _text_parts(item.get("content"), "input")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _text_parts(output, "output")})  # fmt: skip
        elif kind != "reasoning":
            raise _bad(f"an input item of type {kind!r} is not served")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages,
                            "stream": bool(body.get("stream"))}  # fmt: skip
    tools = []
    for tool in body.get("tools") or ():
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise _bad("only function tools are served")
        tools.append({"type": "function", "function": _function(tool, "parameters")})
    if tools:
        chat["tools"] = tools
    limit = _max_tokens(body, "max_output_tokens")
    if limit is not None:
        chat["max_tokens"] = limit
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _response_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def _response(body: Mapping[str, Any], ident: str, created: int, status: str,
              output: list[dict[str, Any]], usage: Any, finish: str | None) -> dict[str, Any]:  # fmt: skip
    return {
        "id": ident, "object": "response", "created_at": created, "status": status,
        "model": body.get("model"), "output": output, "usage": _response_usage(usage),
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "error": None, "instructions": body.get("instructions"), "store": False,
        "max_output_tokens": body.get("max_output_tokens"), "tools": body.get("tools") or [],
        "parallel_tool_calls": True, "tool_choice": "auto", "text": {"format": {"type": "text"}},
    }  # fmt: skip


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _message_item(ident: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": ident, "role": "assistant", "status": status,
            "content": [part]}  # fmt: skip


def _call_item(ident: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": ident, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def response_object(body: Mapping[str, Any], chat: Mapping[str, Any]) -> dict[str, Any]:
    """A whole chat answer as the response object."""
    choice = chat["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    status = _status(finish)
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message_item(_id("msg_"), message["content"], status))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        output.append(_call_item(_id("fc_"), call["id"], function["name"],
                                 function["arguments"], "completed"))  # fmt: skip
    return _response(body, _id("resp_"), int(time.time()), status, output, chat.get("usage"),
                     finish)  # fmt: skip


async def response_events(body: Mapping[str, Any], chunks: Events) -> Events:
    """A chat stream as the Responses API's events."""
    ident, created = _id("resp_"), int(time.time())
    sequence = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal sequence
        out = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return out

    output: list[dict[str, Any]] = []
    message: dict[str, Any] | None = None  # the open message item
    calls: dict[int, dict[str, Any]] = {}  # open function calls by the chat call's index
    usage, finish = None, None
    begun = _response(body, ident, created, "in_progress", [], None, None)
    yield event("response.created", response=begun)
    yield event("response.in_progress", response=begun)

    def close_message() -> list[dict[str, Any]]:
        nonlocal message
        if message is None:
            return []
        item, message = message, None
        index, text = output.index(item), item["content"][0]["text"]
        item["status"] = "completed"
        part = item["content"][0]
        return [
            event("response.output_text.done", item_id=item["id"], output_index=index,
                  content_index=0, text=text, logprobs=[]),
            event("response.content_part.done", item_id=item["id"], output_index=index,
                  content_index=0, part=part),
            event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                finish = choice.get("finish_reason") or finish
                if delta.get("content"):
                    if message is None:
                        message = _message_item(_id("msg_"), "", "in_progress")
                        output.append(message)
                        index = len(output) - 1
                        added = {**message, "content": []}
                        yield event("response.output_item.added", output_index=index, item=added)
                        yield event("response.content_part.added", item_id=message["id"],
                                    output_index=index, content_index=0,
                                    part={**message["content"][0], "text": ""})  # fmt: skip
                    message["content"][0]["text"] += delta["content"]
                    yield event("response.output_text.delta", item_id=message["id"],
                                output_index=output.index(message), content_index=0,
                                delta=delta["content"], logprobs=[])  # fmt: skip
                for call in delta.get("tool_calls") or ():
                    for closing in close_message():
                        yield closing
                    item = calls.get(call["index"])
                    if item is None:
                        function = call["function"]
                        item = calls[call["index"]] = _call_item(
                            _id("fc_"), call["id"], function["name"], "", "in_progress")  # fmt: skip
                        output.append(item)
                        yield event("response.output_item.added", output_index=len(output) - 1,
                                    item=dict(item))  # fmt: skip
                    piece = call["function"].get("arguments") or ""
                    if piece:
                        item["arguments"] += piece
                        yield event("response.function_call_arguments.delta", item_id=item["id"],
                                    output_index=output.index(item), delta=piece)  # fmt: skip
    for closing in close_message():
        yield closing
    for item in calls.values():
        item["status"] = "completed"
        index = output.index(item)
        yield event("response.function_call_arguments.done", item_id=item["id"],
                    output_index=index, arguments=item["arguments"])  # fmt: skip
        yield event("response.output_item.done", output_index=index, item=item)
    status = _status(finish)
    done = _response(body, ident, created, status, output, usage, finish)
    yield event("response.completed" if status == "completed" else "response.incomplete",
                response=done)  # fmt: skip


# -- the Messages API -----------------------------------------------------------------------

BILLING_HEADER = "x-anthropic-billing-header"
_STOPS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def messages_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion a Messages body means (a 400 naming what is wrong)."""
    limit = _max_tokens(body, "max_tokens")
    if limit is None:
        raise _bad("'max_tokens' is required")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b.get("text") or "" for b in system if isinstance(b, Mapping)
                         and not str(b.get("text") or "").startswith(BILLING_HEADER))  # fmt: skip
    if isinstance(system, str) and system:
        out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list")
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            raise _bad("each message must be an object with role 'user' or 'assistant'")
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _bad("a message's content must be a string or a list of blocks")
        parts, calls = [], []
        for block in content:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "tool_use":
                calls.append({"id": block.get("id"), "type": "function",
                              "function": {"name": block.get("name"),
                                           "arguments": json.dumps(block.get("input") or {})}})  # fmt: skip
            elif kind == "tool_result":
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _text_parts(block.get("content") or "", "tool_result")})  # fmt: skip
            elif kind in ("text", "image"):
                parts.append(block)
            elif kind not in ("thinking", "redacted_thinking"):
                raise _bad(f"a block of type {kind!r} is not served")
        if parts or calls:
            chat: dict[str, Any] = {"role": role,
                                    "content": _text_parts(parts, "content") if parts else None}  # fmt: skip
            if calls:
                chat["tool_calls"] = calls
            out.append(chat)
    chat_body: dict[str, Any] = {"model": body.get("model"), "messages": out, "max_tokens": limit,
                                 "stream": bool(body.get("stream"))}  # fmt: skip
    tools = []
    for tool in body.get("tools") or ():
        if not isinstance(tool, Mapping):
            raise _bad("each tool must be an object")
        tools.append({"type": "function", "function": _function(tool, "input_schema")})
    if tools:
        chat_body["tools"] = tools
    if body.get("stop_sequences"):
        chat_body["stop"] = body["stop_sequences"]
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat_body[name] = body[name]
    if chat_body["stream"]:
        chat_body["stream_options"] = {"include_usage": True}
    return chat_body


def _message_usage(prompt: int, cached: int | None, output: int) -> dict[str, Any]:
    return {"input_tokens": prompt - (cached or 0), "cache_read_input_tokens": cached or 0,
            "cache_creation_input_tokens": 0, "output_tokens": output}  # fmt: skip


def _stop(finish: str | None, matched: Any) -> tuple[str, str | None]:
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return _STOPS.get(str(finish), "end_turn"), None


def message_object(body: Mapping[str, Any], chat: Mapping[str, Any]) -> dict[str, Any]:
    """A whole chat answer as the Messages API's message."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"] or "{}")})  # fmt: skip
    reason, sequence = _stop(choice["finish_reason"], choice.get("stop_reason"))
    usage = chat["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"id": _id("msg_"), "type": "message", "role": "assistant",
            "model": body.get("model"), "content": content, "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _message_usage(usage["prompt_tokens"], cached,
                                    usage["completion_tokens"])}  # fmt: skip


async def message_events(body: Mapping[str, Any], prompt: int, cached: int | None,
                         chunks: Events) -> Events:  # fmt: skip
    """A chat stream as the Messages API's events (the prompt's usage in ``message_start``,
    as vLLM and llama-server send it)."""
    start = {"id": _id("msg_"), "type": "message", "role": "assistant", "model": body.get("model"),
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": _message_usage(prompt, cached, 0)}  # fmt: skip
    yield {"type": "message_start", "message": start}
    index = -1
    open_kind: str | None = None
    tools: dict[int, int] = {}
    finish, matched, output = None, None, 0
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            if chunk.get("usage"):
                output = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if choice.get("finish_reason"):
                    finish, matched = choice["finish_reason"], choice.get("stop_reason")
                if delta.get("content"):
                    if open_kind != "text":
                        if open_kind is not None:
                            yield {"type": "content_block_stop", "index": index}
                        index, open_kind = index + 1, "text"
                        yield {"type": "content_block_start", "index": index,
                               "content_block": {"type": "text", "text": ""}}  # fmt: skip
                    yield {"type": "content_block_delta", "index": index,
                           "delta": {"type": "text_delta", "text": delta["content"]}}  # fmt: skip
                for call in delta.get("tool_calls") or ():
                    if call["index"] not in tools:
                        if open_kind is not None:
                            yield {"type": "content_block_stop", "index": index}
                        index, open_kind = index + 1, "tool_use"
                        tools[call["index"]] = index
                        block = {"type": "tool_use", "id": call["id"],
                                 "name": call["function"]["name"], "input": {}}  # fmt: skip
                        yield {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": block,
                        }
                    piece = call["function"].get("arguments") or ""
                    if piece:
                        yield {"type": "content_block_delta", "index": tools[call["index"]],
                               "delta": {"type": "input_json_delta", "partial_json": piece}}  # fmt: skip
    if open_kind is not None:
        yield {"type": "content_block_stop", "index": index}
    reason, sequence = _stop(finish, matched)
    yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
           "usage": {"output_tokens": output}}  # fmt: skip
    yield {"type": "message_stop"}
