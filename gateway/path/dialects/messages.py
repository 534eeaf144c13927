"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as chat
completions: plain Python, no I/O.

A request is read and checked (``read``: a ``DialectError`` names the field) and the
engine is asked the chat completion it makes (``chat_request``); the engine's whole answer
becomes a message (``answer``); its stream becomes the API's events through
``gateway.path.dialects.messages_stream.MessagesStream``. ``count_request`` and
``count_answer`` serve ``count_tokens`` through an engine's ``/tokenize`` where it has no
native route. Errors take Anthropic's shape, ``{"type": "error", "error": {"type",
"message"}}``, their type chosen by the HTTP status (``error_type``, ``error_body``).

Usage: Anthropic's ``input_tokens`` counts the prompt tokens *not* read from a cache,
``cache_read_input_tokens`` those that were (chat's ``cached_tokens``), and
``cache_creation_input_tokens`` those written to an explicit cache, which an engine's
automatic prefix cache has none of (0).

What is served: ``system`` (a string or text blocks), messages of text, image (base64 or
URL), ``tool_use``, ``tool_result`` (text and images), ``thinking`` blocks (the engine
reads them as reasoning; ``redacted_thinking`` is skipped), custom tools with an
``input_schema``, ``tool_choice`` (auto, any, tool, none; ``disable_parallel_tool_use``),
``max_tokens`` (required, as Anthropic's API has it), ``stop_sequences``, ``temperature``,
``top_p``, ``top_k``, ``stream``, ``metadata.user_id`` (the gateway's session; not sent to
the engine). Refused with a clear error: document and search-result blocks, server
tools (web search, code execution, bash, text editor), ``mcp_servers``, ``container``.
``cache_control`` marks are accepted and change nothing: the engine caches every prefix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.path.dialects.common import (
    CHAT_PATH,
    DialectError,
    IdMaker,
    Usage,
    arguments_text,
    new_id,
    optional_bool,
    optional_int,
    optional_number,
    require_str,
    usage_of,
)

PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
ENGINE_PATH = CHAT_PATH
# Where count_tokens is asked of an engine that has no native route: vLLM's and the sim's
# /tokenize take chat messages and answer {"count", ...}.
TOKENIZE_PATH = "/tokenize"

_REFUSED = {
    "mcp_servers": "MCP servers are not served: define the tools and run them yourself",
    "container": "code execution containers are not served",
}


@dataclass(frozen=True)
class MessagesRequest:
    """A checked Messages request."""

    model: str
    max_tokens: int
    stream: bool
    stop_sequences: tuple[str, ...]
    user_id: str | None
    # The chat messages and options the engine is sent.
    messages: tuple[dict[str, Any], ...]
    options: dict[str, Any] = field(default_factory=dict)


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    """A message's (or system's) content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise DialectError(f"{where} must be a string or a list of content blocks", where)
    for i, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise DialectError(f"{where}[{i}] must be a content block with a type",
                               f"{where}[{i}]")  # fmt: skip
    return content


def _text(block: Mapping[str, Any], where: str, key: str = "text") -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise DialectError(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An image block as chat's ``image_url`` part (a base64 source as a data: URL)."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise DialectError(f"{where}.source must be an object", f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media = source.get("media_type") or "image/jpeg"
        data = _text(source, f"{where}.source", "data")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        return {"type": "image_url", "image_url": {"url": _text(source, f"{where}.source", "url")}}
    raise DialectError(
        f"{where}.source.type is {kind!r}; this gateway serves base64 and url images",
        f"{where}.source.type",
    )


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat content of text and image parts: one string when it is text alone."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _refuse_block(kind: str, where: str) -> DialectError:
    return DialectError(
        f"{where}.type is {kind!r}; this gateway serves text, image, tool_use, tool_result "
        "and thinking blocks",
        f"{where}.type",
    )


def _user(blocks: list[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results first, one ``tool`` message each (chat wants them
    right after the assistant's tool calls), then its text and images as one message."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            tools.append({
                "role": "tool",
                "tool_call_id": require_str(block, "tool_use_id", f"{at}.tool_use_id"),
                "content": _tool_result(block.get("content"), f"{at}.content"),
            })  # fmt: skip
        else:
            raise _refuse_block(kind, at)
    out = tools
    if parts:
        out.append({"role": "user", "content": _content(parts)})
    return out


def _tool_result(content: Any, where: str) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, where)):
        at = f"{where}[{i}]"
        if block["type"] == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif block["type"] == "image":
            parts.append(_image(block, at))
        else:
            raise DialectError(f"{at}.type is {block['type']!r}; a tool result holds text "
                               "and images", f"{at}.type")  # fmt: skip
    return _content(parts)


def _assistant(blocks: list[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    """An assistant turn: its text, its thinking as ``reasoning_content``, its tool uses
    as ``tool_calls`` (their input written as JSON), in one message."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "thinking":
            thoughts.append(_text(block, at, "thinking"))
        elif kind == "redacted_thinking":
            continue  # opaque to any engine but Anthropic's
        elif kind == "tool_use":
            calls.append({
                "id": require_str(block, "id", f"{at}.id"),
                "type": "function",
                "function": {"name": require_str(block, "name", f"{at}.name"),
                             "arguments": arguments_text(block.get("input", {}), f"{at}.input")},
            })  # fmt: skip
        else:
            raise _refuse_block(kind, at)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if message["content"] is None and not calls and not thoughts:
        return []
    return [message]


# Claude Code's first system block (a block of its own): a billing attribution for Anthropic's API that changes
# on every request. Sent to an engine it would defeat the prefix cache and the prefix
# affinity of every turn; vLLM drops it too, llama-server masks its changing part.
BILLING_HEADER = "x-anthropic-billing-header:"


def _system(value: Any) -> str | None:
    if value is None:
        return None
    texts = []
    for i, block in enumerate(_blocks(value, "system")):
        if block["type"] != "text":
            raise DialectError(f"system[{i}].type must be 'text'", f"system[{i}].type")
        text = _text(block, f"system[{i}]")
        if not (isinstance(value, list) and text.startswith(BILLING_HEADER)):
            texts.append(text)
    return "\n".join(texts)


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Messages body's ``system`` and ``messages`` as chat messages."""
    out: list[dict[str, Any]] = []
    system = _system(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DialectError("messages must be a non-empty list of messages", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise DialectError(f"{where} must be an object", where)
        role = message.get("role")
        blocks = _blocks(message.get("content"), f"{where}.content")
        if role == "user":
            out.extend(_user(blocks, f"{where}.content"))
        elif role == "assistant":
            out.extend(_assistant(blocks, f"{where}.content"))
        else:
            raise DialectError(f"{where}.role must be 'user' or 'assistant', not {role!r}",
                               f"{where}.role")  # fmt: skip
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DialectError("tools must be a list of tools", "tools")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise DialectError(f"{where} must be an object", where)
        kind = tool.get("type")
        if kind not in (None, "custom") or not isinstance(tool.get("input_schema"), Mapping):
            raise DialectError(
                f"{where} is a {kind or 'tool with no input_schema'!r}; this gateway serves "
                "custom tools (a name, a description and an input_schema)",
                f"{where}.type" if kind not in (None, "custom") else f"{where}.input_schema",
            )
        function: dict[str, Any] = {"name": require_str(tool, "name", f"{where}.name"),
                                    "parameters": dict(tool["input_schema"])}  # fmt: skip
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> tuple[Any, bool | None]:
    """Chat's tool_choice and parallel_tool_calls of Anthropic's tool_choice."""
    if value is None:
        return None, None
    if not isinstance(value, Mapping):
        raise DialectError("tool_choice must be an object with a type", "tool_choice")
    kind = value.get("type")
    parallel = None
    if value.get("disable_parallel_tool_use") is True:
        parallel = False
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        name = require_str(value, "name", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}, parallel
    raise DialectError("tool_choice.type must be auto, any, tool or none", "tool_choice.type")


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise DialectError("stop_sequences must be a list of strings", "stop_sequences")
    return tuple(value)


def _user_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DialectError("metadata must be an object", "metadata")
    user = value.get("user_id")
    if user is not None and not isinstance(user, str):
        raise DialectError("metadata.user_id must be a string", "metadata.user_id")
    return user or None


def _options(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat options of a Messages body or a count_tokens body: tools and their
    choice (only these reach the prompt)."""
    options: dict[str, Any] = {}
    tools = _tools(body.get("tools"))
    if tools:
        options["tools"] = tools
    choice, parallel = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        options["tool_choice"] = choice
    if parallel is not None:
        options["parallel_tool_calls"] = parallel
    return options


def read(body: Any) -> MessagesRequest:
    """Check a Messages request body; raise ``DialectError`` naming what is wrong."""
    if not isinstance(body, Mapping):
        raise DialectError("the request body must be a JSON object")
    for name, why in _REFUSED.items():
        if body.get(name):
            raise DialectError(why, name)
    model = require_str(body, "model")
    max_tokens = optional_int(body, "max_tokens")
    if max_tokens is None:
        raise DialectError("max_tokens is required: the most tokens the answer may have",
                           "max_tokens")  # fmt: skip
    messages = chat_messages(body)
    options = _options(body)
    stops = _stops(body.get("stop_sequences"))
    if stops:
        options["stop"] = list(stops)
    for name in ("temperature", "top_p"):
        number = optional_number(body, name)
        if number is not None:
            options[name] = number
    top_k = optional_int(body, "top_k", minimum=0)
    if top_k is not None:
        options["top_k"] = top_k
    return MessagesRequest(
        model=model,
        max_tokens=max_tokens,
        stream=optional_bool(body, "stream", False),
        stop_sequences=stops,
        user_id=_user_id(body.get("metadata")),
        messages=tuple(messages),
        options=options,
    )


def chat_request(request: MessagesRequest) -> dict[str, Any]:
    """The chat completions body the engine is sent (at ``ENGINE_PATH``); usage always
    asked of a stream."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [dict(m) for m in request.messages],
        "max_tokens": request.max_tokens,
        **request.options,
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    return body


# -- count_tokens ---------------------------------------------------------------------------


def count_request(body: Any) -> dict[str, Any]:
    """A count_tokens body as the ``/tokenize`` request of an engine with no native route
    (vLLM's and the sim's take chat messages): the prompt the engine would read, its
    generation prompt included, as the API counts it."""
    if not isinstance(body, Mapping):
        raise DialectError("the request body must be a JSON object")
    model = require_str(body, "model")
    out: dict[str, Any] = {"model": model, "messages": chat_messages(body),
                           "add_generation_prompt": True, **_options(body)}  # fmt: skip
    out.pop("tool_choice", None)
    out.pop("parallel_tool_calls", None)
    return out


def count_answer(tokenized: Any) -> dict[str, Any]:
    """The count_tokens answer of an engine's ``/tokenize`` answer (``count``, or its
    ``tokens``), or of its native count_tokens answer (``input_tokens``)."""
    if isinstance(tokenized, Mapping):
        for key in ("input_tokens", "count"):
            value = tokenized.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return {"input_tokens": value}
        if isinstance(tokenized.get("tokens"), list):
            return {"input_tokens": len(tokenized["tokens"])}
    raise DialectError("the engine's token count is not a count")


# -- answers --------------------------------------------------------------------------------

# A chat finish_reason as a Messages stop_reason (a stop string, when the engine names it,
# is "stop_sequence": see ``stop_reason``).
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(finish: Any, matched: Any, stops: Sequence[str]) -> tuple[str, str | None]:
    """The ``stop_reason`` and ``stop_sequence`` of a chat finish: a finish at a stop
    string the engine names (vLLM's and the sim's ``stop_reason`` on the choice) that is
    one of the request's ``stop_sequences`` is ``stop_sequence``."""
    if finish == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return STOP_REASONS.get(str(finish), "end_turn"), None


def usage_block(usage: Usage | None) -> dict[str, Any]:
    """The Messages API's usage: ``input_tokens`` are those not read from the cache."""
    usage = usage or Usage()
    return {
        "input_tokens": usage.input - usage.cached,
        "output_tokens": usage.output,
        "cache_read_input_tokens": usage.cached,
        "cache_creation_input_tokens": 0,
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as a ``tool_use`` block's ``input`` object (arguments that
    are not a JSON object give ``{}``: the block must hold an object)."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def answer(
    request: MessagesRequest,
    chat: Any,
    *,
    message_id: str | None = None,
    ids: IdMaker = new_id,
) -> dict[str, Any]:
    """The message of an engine's whole chat answer: its thinking, text and tool uses as
    blocks (in that order), its stop reason and usage with cached tokens."""
    if not isinstance(chat, Mapping) or not isinstance(chat.get("choices"), list):
        raise DialectError("the engine's answer is not a chat completion")
    choice = chat["choices"][0] if chat["choices"] else {}
    message = choice.get("message") if isinstance(choice, Mapping) else None
    message = message if isinstance(message, Mapping) else {}
    content: list[dict[str, Any]] = []
    thought = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thought, str) and thought:
        content.append({"type": "thinking", "thinking": thought, "signature": ""})
    texts = [message.get(k) for k in ("content", "refusal")]
    text = "".join(t for t in texts if isinstance(t, str))
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            content.append({"type": "tool_use", "id": str(call.get("id") or ids("toolu_")),
                            "name": str(function.get("name") or ""),
                            "input": tool_input(function.get("arguments"))})  # fmt: skip
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                                   request.stop_sequences)  # fmt: skip
    return {
        "id": message_id or ids("msg_"),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_block(usage_of(chat.get("usage"))),
    }


def answer_text(message: Mapping[str, Any]) -> str:
    """Everything of a message a client reads: text, thinking, tool uses' names and
    inputs (what the guard judges of a whole answer)."""
    texts: list[str] = []
    for block in message.get("content") or ():
        if not isinstance(block, Mapping):
            continue
        for key in ("text", "thinking", "name"):
            if isinstance(block.get(key), str):
                texts.append(block[key])
        if block.get("type") == "tool_use":
            texts.append(json.dumps(block.get("input"), ensure_ascii=False))
    return "\n".join(t for t in texts if t)


def event_text(event: Any) -> str:
    """The text a Messages stream event from an engine's own ``/v1/messages`` puts before
    the client (a ``content_block_delta``'s text, thinking or partial JSON; a tool use's
    name in its ``content_block_start``), for the guard's windows on a native stream."""
    if not isinstance(event, Mapping):
        return ""
    if event.get("type") == "content_block_start":
        block = event.get("content_block")
        name = block.get("name") if isinstance(block, Mapping) else None
        return name if isinstance(name, str) else ""
    delta = event.get("delta") if event.get("type") == "content_block_delta" else None
    if not isinstance(delta, Mapping):
        return ""
    for key in ("text", "thinking", "partial_json"):
        if isinstance(delta.get(key), str):
            return delta[key]
    return ""


# -- errors ---------------------------------------------------------------------------------

# Anthropic's error type for each HTTP status it documents; another 4xx is an
# invalid_request_error, another 5xx an api_error (the gateway's 502 and 503 keep their
# status: the anthropic client retries both, as it does Anthropic's own 529).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def error_payload(
    status: int, message: str, *, code: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    """An error as Anthropic's API answers it: ``{"type": "error", "error": {"type",
    "message"}, "request_id"}``; the gateway's own ``code`` (``content_filter``,
    ``context_length_exceeded``...) rides in ``error.details.error_code``, where the
    ``anthropic`` client reads a stable cause (``APIStatusError.error_code``)."""
    error: dict[str, Any] = {"type": error_type(status), "message": message}
    if code:
        error["details"] = {"error_code": code}
    payload: dict[str, Any] = {"type": "error", "error": error}
    if request_id:
        payload["request_id"] = request_id
    return payload


def error_body(
    status: int, message: str, *, code: str | None = None, request_id: str | None = None
) -> bytes:
    return json.dumps(error_payload(status, message, code=code, request_id=request_id),
                      ensure_ascii=False).encode()  # fmt: skip


def from_openai_error(status: int, raw: bytes, request_id: str | None = None) -> bytes:
    """An error body in OpenAI's shape (the gateway's, an engine's: llama-server answers
    its /v1/messages errors so) in Anthropic's: its message and code kept, its type
    chosen by the status. Never raises."""
    message, code = None, None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    error = data.get("error") if isinstance(data, Mapping) else None
    if isinstance(error, Mapping):
        if isinstance(error.get("message"), str):
            message = error["message"]
        if isinstance(error.get("code"), str):
            code = error["code"]
    elif isinstance(error, str):
        message = error
    if not message:
        message = raw[:2000].decode("utf-8", "replace").strip() or f"HTTP {status}"
    return error_body(status, message, code=code, request_id=request_id)
