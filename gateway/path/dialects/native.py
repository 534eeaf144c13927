"""An engine's own Responses or Messages route, normalized: plain Python, no I/O.

Where an engine serves a dialect fit to be sent to (``engines.route``), the gateway sends
it the request natively but keeps the answer its own:

- **The body** (``responses_body``, ``messages_body``) is built from the request the
  gateway has already read and checked (so an engine that answers bad input with a 500,
  or takes it without a word, never sees it): only the fields the gateway serves, the
  model renamed to the one the engine knows. A Responses request that continues a
  stored response carries the whole conversation as its input (the gateway's store, not
  the engine's, which is per process) and ``store: false``.
- **The answer** is read event by event (``ResponsesNative``, ``MessagesNative``) into
  the chat chunks it means (text, reasoning, tool calls, the finish, the usage with the
  engine's cached tokens), which take chat's path from there: the guard's windows judge
  them, and the dialect's own stream writer (``ResponsesStream``, ``MessagesStream``)
  writes what was released as the API's events, with the gateway's ids and its
  ``sequence_number`` from 0, and ends a refused answer in the dialect's own way. So a
  client reads one well-formed stream whatever the engine sent (llama-server's Responses
  events carry no ``sequence_number``), and nothing reaches it that the guard did not
  judge. A whole answer (``ResponsesNative.whole``, ``MessagesNative.whole``) is read
  into the chat answer it means, judged, and written back with the gateway's ids.

Every event's text is accounted for: what ``responses.event_text`` or
``messages.event_text`` finds in an event is carried by the chunks it makes; an event
of a kind this module does not know that carries text gives it as answer text (judged,
never dropped unseen). An engine's ``error`` event, or a failed response, is
``NativeError`` (the stream failed: another replica may answer before the first byte).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.path.dialects import messages, responses
from gateway.path.dialects.common import Usage, chat_usage, dump

Chunk = dict[str, Any]


class NativeError(Exception):
    """An engine's native answer says it failed, or is not the dialect's."""


def _chunk(delta: Mapping[str, Any], finish: str | None = None,
           stop: str | None = None) -> Chunk:  # fmt: skip
    choice: dict[str, Any] = {"index": 0, "delta": dict(delta), "finish_reason": finish}
    if stop is not None:
        choice["stop_reason"] = stop
    return {"object": "chat.completion.chunk", "choices": [choice]}


def _usage_chunk(usage: Usage) -> Chunk:
    return {"object": "chat.completion.chunk", "choices": [], "usage": chat_usage(usage)}


def _text_of(chunks: Sequence[Chunk]) -> str:
    """The text chunks carry (what the guard's windows read of them: gateway.path.sse)."""
    out = []
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            for key in ("reasoning_content", "content", "refusal"):
                if isinstance(delta.get(key), str):
                    out.append(delta[key])
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        out.append(function[key])
    return "".join(out)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# -- the Responses API ------------------------------------------------------------------------

# The fields of a checked Responses body an engine is sent as they came.
_RESPONSES_FIELDS = ("instructions", "tools", "tool_choice", "max_output_tokens", "temperature",
                     "top_p", "parallel_tool_calls", "text", "reasoning", "metadata", "user")  # fmt: skip


def responses_body(
    data: Mapping[str, Any],
    request: responses.ResponsesRequest,
    history: Sequence[Mapping[str, Any]],
    served: str,
) -> dict[str, Any]:
    """The engine's own ``/v1/responses`` body: the fields served (``data`` already read
    by ``responses.read``), the conversation ``previous_response_id`` continues as input
    items before the new ones, never stored by the engine."""
    items = []
    for item in (*history, *request.input):
        item = dict(item)
        if item.get("type") == "reasoning":
            # Its summary is not in the chat body the guard judged: the engine reads
            # what was judged (the reasoning's text), nothing more.
            item["summary"] = []
        items.append(item)
    body: dict[str, Any] = {"model": served, "input": items}
    for name in _RESPONSES_FIELDS:
        if data.get(name) is not None:
            body[name] = data[name]
    body["stream"] = request.stream
    body["store"] = False
    return body


# A Responses ending as a chat finish.
_FINISHES = {"max_output_tokens": "length", "content_filter": "content_filter"}


def _responses_usage(value: Any) -> Usage | None:
    """Chat's usage of a Responses usage block (``input_tokens`` counts every prompt
    token; ``input_tokens_details.cached_tokens`` those read from the cache)."""
    if not isinstance(value, Mapping):
        return None
    prompt, output = _count(value.get("input_tokens")), _count(value.get("output_tokens"))
    details = value.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    out_details = value.get("output_tokens_details")
    reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, Mapping) else 0
    return Usage(input=prompt, output=output, cached=min(_count(cached), prompt),
                 reasoning=min(_count(reasoning), output),
                 cached_reported=isinstance(cached, int))  # fmt: skip


def _finish(response: Mapping[str, Any], calls: bool) -> str:
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    if response.get("status") == "incomplete":
        return _FINISHES.get(str(reason), "length")
    return "tool_calls" if calls else "stop"


def _failure(value: Any) -> str:
    """What an engine's ``error`` event or failed response says."""
    error = value.get("error") if isinstance(value, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(value, Mapping) and isinstance(value.get("message"), str):
        return value["message"]
    return "the engine's answer failed"


class ResponsesNative:
    """An engine's own Responses stream read into chat chunks (the module's docstring)."""

    TERMINAL = ("response.completed", "response.incomplete", "response.failed")

    def __init__(self) -> None:
        self.ended = False
        # Per output item (its id, else its index): its chat tool call index, and the
        # text or arguments it has carried (a .done event repeating more gives the rest).
        self._calls: dict[Any, int] = {}
        self._carried: dict[Any, str] = {}

    @staticmethod
    def _key(event: Mapping[str, Any]) -> Any:
        item = event.get("item")
        if isinstance(item, Mapping) and item.get("id"):
            return item["id"]
        return event.get("item_id") or ("index", event.get("output_index"))

    def feed(self, event: Any) -> list[Chunk]:
        """The chat chunks one native event (parsed JSON) makes; ``ended`` once the
        response completed. ``NativeError`` when it failed."""
        if self.ended or not isinstance(event, Mapping):
            return []
        kind = str(event.get("type") or "")
        if kind == "error" or kind == "response.failed":
            raise NativeError(_failure(event.get("response") if kind != "error" else event))
        out = self._event(kind, event)
        text = responses.event_text(event)
        if text and text not in _text_of(out):
            # Text of an event this reader does not place: judged as answer text.
            out.append(_chunk({"content": text}))
        return out

    def _event(self, kind: str, event: Mapping[str, Any]) -> list[Chunk]:
        key = self._key(event)
        delta = event.get("delta")
        delta = delta if isinstance(delta, str) else ""
        if kind == "response.output_text.delta" and delta:
            self._carried[key] = self._carried.get(key, "") + delta
            return [_chunk({"content": delta})]
        if kind == "response.refusal.delta" and delta:
            return [_chunk({"refusal": delta})]
        if kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            return [_chunk({"reasoning_content": delta})] if delta else []
        if kind == "response.output_text.done":
            return self._rest(key, event.get("text"), "content")
        if kind == "response.output_item.added":
            item = event.get("item")
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                return self._call(key, item)
            return []
        if kind == "response.function_call_arguments.delta" and delta:
            return self._arguments(key, delta)
        if kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                out = [] if key in self._calls else self._call(key, item)
                return out + self._rest(key, item.get("arguments"), "arguments")
            return []
        if kind in self.TERMINAL[:2]:
            self.ended = True
            response = event.get("response")
            response = response if isinstance(response, Mapping) else {}
            out = [_chunk({}, _finish(response, bool(self._calls)))]
            usage = _responses_usage(response.get("usage"))
            if usage is not None:
                out.append(_usage_chunk(usage))
            return out
        return []

    def _call(self, key: Any, item: Mapping[str, Any]) -> list[Chunk]:
        index = self._calls[key] = len(self._calls)
        call = {"index": index, "id": str(item.get("call_id") or item.get("id") or ""),
                "type": "function",
                "function": {"name": str(item.get("name") or ""), "arguments": ""}}  # fmt: skip
        out = [_chunk({"tool_calls": [call]})]
        arguments = item.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += self._arguments(key, arguments)
        return out

    def _arguments(self, key: Any, text: str) -> list[Chunk]:
        if key not in self._calls:
            # Arguments of a call whose item was not announced: the last call's.
            key = next(reversed(self._calls), None)
            if key is None:
                return [_chunk({"content": text})]
        self._carried[key] = self._carried.get(key, "") + text
        call = {"index": self._calls[key], "function": {"arguments": text}}
        return [_chunk({"tool_calls": [call]})]

    def _rest(self, key: Any, whole: Any, what: str) -> list[Chunk]:
        """A ``.done`` event's whole text: what its deltas did not carry (an engine that
        sent it whole) is carried now."""
        carried = self._carried.get(key, "")
        if (
            not isinstance(whole, str)
            or len(whole) <= len(carried)
            or not whole.startswith(carried)
        ):
            return []
        rest = whole[len(carried) :]
        if what == "arguments":
            return self._arguments(key, rest)
        self._carried[key] = whole
        return [_chunk({"content": rest})]

    @staticmethod
    def whole(answer: Any) -> dict[str, Any]:
        """The chat answer an engine's whole response object means; ``NativeError`` when
        it is not one, or failed."""
        if not isinstance(answer, Mapping) or not isinstance(answer.get("output"), list):
            raise NativeError("the engine's answer is not a response object")
        if answer.get("status") == "failed":
            raise NativeError(_failure(answer))
        text, refusal, thought = [], [], []
        calls: list[dict[str, Any]] = []
        for item in answer["output"]:
            if not isinstance(item, Mapping):
                continue
            kind = item.get("type")
            if kind == "function_call":
                calls.append({"id": str(item.get("call_id") or item.get("id") or ""),
                              "type": "function",
                              "function": {"name": str(item.get("name") or ""),
                                           "arguments": str(item.get("arguments") or "")}})  # fmt: skip
                continue
            parts = [*(item.get("content") or ()), *(item.get("summary") or ())] \
                if kind == "reasoning" else item.get("content") or ()  # fmt: skip
            for part in parts:
                if not isinstance(part, Mapping):
                    continue
                if kind == "reasoning" and isinstance(part.get("text"), str):
                    thought.append(part["text"])
                elif isinstance(part.get("refusal"), str):
                    refusal.append(part["refusal"])
                elif isinstance(part.get("text"), str):
                    text.append(part["text"])
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if refusal:
            message["refusal"] = "".join(refusal)
        if thought:
            message["reasoning_content"] = "".join(thought)
        if calls:
            message["tool_calls"] = calls
        usage = _responses_usage(answer.get("usage"))
        chat: dict[str, Any] = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": _finish(answer, bool(calls))}],
        }  # fmt: skip
        if usage is not None:
            chat["usage"] = chat_usage(usage)
        return chat


# -- the Messages API ---------------------------------------------------------------------------

# The fields of a checked Messages body an engine is sent as they came.
_MESSAGES_FIELDS = ("messages", "max_tokens", "tools", "tool_choice", "stop_sequences",
                    "temperature", "top_p", "top_k", "metadata")  # fmt: skip


def messages_body(data: Mapping[str, Any], request: messages.MessagesRequest,
                  served: str) -> dict[str, Any]:  # fmt: skip
    """The engine's own ``/v1/messages`` body: the fields served (``data`` already read
    by ``messages.read``), the system prompt without Claude Code's billing block (which
    changes on every request and would defeat the engine's prefix cache)."""
    body: dict[str, Any] = {"model": served}
    system = data.get("system")
    if isinstance(system, list):
        system = [b for b in system if not (isinstance(b, Mapping) and isinstance(
            b.get("text"), str) and b["text"].startswith(messages.BILLING_HEADER))]  # fmt: skip
    if system:
        body["system"] = system
    for name in _MESSAGES_FIELDS:
        if data.get(name) is not None:
            body[name] = data[name]
    # Redacted thinking is opaque and left out of the chat body the guard judged: the
    # engine reads what was judged, nothing more.
    body["messages"] = [_without_redacted(m) for m in body.get("messages") or ()]
    body["stream"] = request.stream
    return body


def _without_redacted(message: Any) -> Any:
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        return message
    kept = [b for b in content
            if not (isinstance(b, Mapping) and b.get("type") == "redacted_thinking")]  # fmt: skip
    return {**message, "content": kept}


# A Messages stop_reason as a chat finish.
_STOPS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
          "tool_use": "tool_calls", "pause_turn": "stop", "refusal": "content_filter"}  # fmt: skip


def _messages_usage(value: Any, before: Usage | None = None) -> Usage | None:
    """Chat's usage of a Messages usage block (its ``input_tokens`` are those not read
    from the cache), over what an earlier block of the same stream said."""
    if not isinstance(value, Mapping):
        return before
    before = before or Usage()
    fresh = value.get("input_tokens")
    cached = value.get("cache_read_input_tokens")
    created = _count(value.get("cache_creation_input_tokens"))
    if isinstance(fresh, int) or isinstance(cached, int):
        prompt = _count(fresh) + _count(cached) + created
        cached_now, reported = _count(cached), isinstance(cached, int)
    else:
        prompt, cached_now, reported = before.input, before.cached, before.cached_reported
    output = value.get("output_tokens")
    return Usage(input=prompt, output=_count(output) if isinstance(output, int) else before.output,
                 cached=min(cached_now, prompt), cached_reported=reported)  # fmt: skip


class MessagesNative:
    """An engine's own Messages stream read into chat chunks (the module's docstring)."""

    def __init__(self) -> None:
        self.ended = False
        self._blocks: dict[Any, str] = {}  # block index: its type
        self._tools: dict[Any, int] = {}  # block index: its chat tool call index
        self._usage: Usage | None = None
        self._stop: str | None = None
        self._sequence: str | None = None

    def feed(self, event: Any) -> list[Chunk]:
        """The chat chunks one native event (parsed JSON) makes; ``ended`` at
        ``message_stop``. ``NativeError`` at an ``error`` event."""
        if self.ended or not isinstance(event, Mapping):
            return []
        kind = str(event.get("type") or "")
        if kind == "error":
            raise NativeError(_failure(event))
        out = self._event(kind, event)
        text = messages.event_text(event)
        if text and text not in _text_of(out):
            out.append(_chunk({"content": text}))
        return out

    def _event(self, kind: str, event: Mapping[str, Any]) -> list[Chunk]:
        index = event.get("index")
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, Mapping):
                self._usage = _messages_usage(message.get("usage"), self._usage)
            return []
        if kind == "content_block_start":
            block = event.get("content_block")
            block = block if isinstance(block, Mapping) else {}
            self._blocks[index] = str(block.get("type") or "")
            if block.get("type") == "tool_use":
                tool = self._tools[index] = len(self._tools)
                call = {"index": tool, "id": str(block.get("id") or ""), "type": "function",
                        "function": {"name": str(block.get("name") or ""), "arguments": ""}}  # fmt: skip
                out = [_chunk({"tool_calls": [call]})]
                given = block.get("input")
                if isinstance(given, Mapping) and given:
                    out.append(self._arguments(index, dump(given)))
                return out
            for key, field in (("text", "content"), ("thinking", "reasoning_content")):
                if isinstance(block.get(key), str) and block[key]:
                    return [_chunk({field: block[key]})]
            return []
        if kind == "content_block_delta":
            delta = event.get("delta")
            delta = delta if isinstance(delta, Mapping) else {}
            if isinstance(delta.get("text"), str) and delta["text"]:
                return [_chunk({"content": delta["text"]})]
            if isinstance(delta.get("thinking"), str) and delta["thinking"]:
                return [_chunk({"reasoning_content": delta["thinking"]})]
            if isinstance(delta.get("partial_json"), str) and delta["partial_json"]:
                return [self._arguments(index, delta["partial_json"])]
            return []
        if kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping):
                self._stop = delta.get("stop_reason") or self._stop
                sequence = delta.get("stop_sequence")
                self._sequence = sequence if isinstance(sequence, str) else self._sequence
            self._usage = _messages_usage(event.get("usage"), self._usage)
            return []
        if kind == "message_stop":
            self.ended = True
            finish = _STOPS.get(str(self._stop), "stop")
            # The stop string it names (llama-server names it beside "end_turn").
            stop = self._sequence if finish == "stop" else None
            out = [_chunk({}, finish, stop)]
            if self._usage is not None:
                out.append(_usage_chunk(self._usage))
            return out
        return []

    def _arguments(self, index: Any, text: str) -> Chunk:
        if index not in self._tools:
            return _chunk({"content": text})
        return _chunk({"tool_calls": [{"index": self._tools[index],
                                       "function": {"arguments": text}}]})  # fmt: skip

    @staticmethod
    def whole(answer: Any) -> dict[str, Any]:
        """The chat answer an engine's whole message means; ``NativeError`` when it is
        not one."""
        if not isinstance(answer, Mapping) or not isinstance(answer.get("content"), list):
            if isinstance(answer, Mapping) and answer.get("type") == "error":
                raise NativeError(_failure(answer))
            raise NativeError("the engine's answer is not a message")
        text, thought = [], []
        calls: list[dict[str, Any]] = []
        for block in answer["content"]:
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "tool_use":
                given = block.get("input")
                calls.append({"id": str(block.get("id") or ""), "type": "function",
                              "function": {"name": str(block.get("name") or ""),
                                           "arguments": json.dumps(given if isinstance(
                                               given, Mapping) else {}, ensure_ascii=False)}})  # fmt: skip
            elif isinstance(block.get("thinking"), str):
                thought.append(block["thinking"])
            elif isinstance(block.get("text"), str):
                text.append(block["text"])
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if thought:
            message["reasoning_content"] = "".join(thought)
        if calls:
            message["tool_calls"] = calls
        stop = answer.get("stop_reason")
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": _STOPS.get(str(stop), "stop")}  # fmt: skip
        if choice["finish_reason"] == "stop" and isinstance(answer.get("stop_sequence"), str):
            choice["stop_reason"] = answer["stop_sequence"]
        chat: dict[str, Any] = {"object": "chat.completion", "choices": [choice]}
        usage = _messages_usage(answer.get("usage"))
        if usage is not None:
            chat["usage"] = chat_usage(usage)
        return chat
