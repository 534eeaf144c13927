"""OpenAI's Responses API (``POST /v1/responses``) as chat completions: plain Python, no I/O.

A request is read and checked (``read``: a ``DialectError`` names the field), its input
turned into items of one canonical shape (``input_items``), and the engine is asked the
chat completion those items and the instructions make (``chat_request``; a conversation
continued by ``previous_response_id`` is the stored items first, ``history``). The
engine's whole answer becomes a response object (``answer``); its stream becomes the
API's typed events through ``gateway.path.dialects.responses_stream.ResponsesStream``.

What is served: text or item input (messages of every role, ``function_call`` and
``function_call_output`` items, reasoning items, images by URL), ``instructions``,
function tools and ``tool_choice``, ``max_output_tokens``, ``temperature``, ``top_p``,
``parallel_tool_calls``, ``text.format`` (JSON schema or object), ``reasoning.effort``,
``stream``, ``store``, ``previous_response_id``, ``prompt_cache_key`` (the gateway's
session, not sent to the engine), ``metadata`` and ``user`` (repeated in the response).
What is refused with a clear error: hosted tools (web search, file search, computer
use...), ``input_file`` parts and file ids, ``item_reference`` items, ``background``,
``conversation`` and reusable ``prompt`` templates. Other fields are ignored, as newer
clients send fields older servers do not know.
"""

from __future__ import annotations

import json
import time
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
    optional_str,
    require_str,
    text_of_parts,
    usage_of,
)

PATH = "/v1/responses"
ENGINE_PATH = CHAT_PATH

# Fields the gateway does not serve: the message says what to do instead.
_REFUSED = {
    "background": "background responses are not served: send the request and wait for it",
    "conversation": "the Conversations API is not served: continue a conversation with "
    "previous_response_id",
    "prompt": "reusable prompt templates are not served: send the input itself",
}
_INPUT_PARTS = {"input_text": "text", "input_image": "image"}
_OUTPUT_PARTS = {"output_text": "text", "input_text": "text", "refusal": "refusal"}
_ROLES = ("user", "system", "developer", "assistant")


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked Responses request: what the chat request, the stored conversation and the
    response object need of it."""

    model: str
    stream: bool
    store: bool
    previous_response_id: str | None
    prompt_cache_key: str | None
    instructions: str | None
    # The input as canonical items (a text input is one user message).
    input: tuple[dict[str, Any], ...]
    # Chat options the engine is sent (tools, tool_choice, max_tokens, ...).
    options: dict[str, Any] = field(default_factory=dict)
    # The request's fields a response object repeats.
    echo: dict[str, Any] = field(default_factory=dict)

    @property
    def max_output_tokens(self) -> int | None:
        return self.echo.get("max_output_tokens")


def read(body: Any) -> ResponsesRequest:
    """Check a Responses request body; raise ``DialectError`` naming what is wrong."""
    if not isinstance(body, Mapping):
        raise DialectError("the request body must be a JSON object")
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, False):
            raise DialectError(why, name)
    model = require_str(body, "model")
    if "input" not in body or body["input"] is None:
        raise DialectError("input is required: a string, or a list of input items", "input")
    items = input_items(body["input"])
    instructions = optional_str(body, "instructions")
    max_output = optional_int(body, "max_output_tokens")
    previous = optional_str(body, "previous_response_id")
    if previous == "":
        raise DialectError("previous_response_id must name a response", "previous_response_id")
    cache_key = optional_str(body, "prompt_cache_key")
    options: dict[str, Any] = {}
    tools = _tools(body.get("tools"))
    if tools:
        options["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        options["tool_choice"] = choice
    if max_output is not None:
        options["max_tokens"] = max_output
    for name in ("temperature", "top_p"):
        number = optional_number(body, name)
        if number is not None:
            options[name] = number
    if body.get("parallel_tool_calls") is not None:
        options["parallel_tool_calls"] = optional_bool(body, "parallel_tool_calls", True)
    response_format = _text_format(body.get("text"))
    if response_format is not None:
        options["response_format"] = response_format
    effort = _effort(body.get("reasoning"))
    if effort is not None:
        options["reasoning_effort"] = effort
    user = optional_str(body, "user")
    if user:
        options["user"] = user
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise DialectError("metadata must be an object of strings", "metadata")
    store = optional_bool(body, "store", True)
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_output,
        "metadata": dict(metadata or {}),
        "parallel_tool_calls": options.get("parallel_tool_calls", True),
        "previous_response_id": previous,
        "prompt_cache_key": cache_key,
        "reasoning": {"effort": effort, "summary": None},
        "store": store,
        "temperature": options.get("temperature", 1.0),
        "text": {"format": dict(body["text"]["format"])} if response_format else {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") if body.get("tool_choice") is not None else "auto",
        "tools": [dict(t) for t in body.get("tools") or ()],
        "top_p": options.get("top_p", 1.0),
        "truncation": body.get("truncation") if body.get("truncation") in ("auto", "disabled") else "disabled",
        "user": user,
    }  # fmt: skip
    return ResponsesRequest(
        model=model,
        stream=optional_bool(body, "stream", False),
        store=store,
        previous_response_id=previous,
        prompt_cache_key=cache_key,
        instructions=instructions,
        input=tuple(items),
        options=options,
        echo=echo,
    )


# -- input ----------------------------------------------------------------------------------


def input_items(value: Any, param: str = "input") -> list[dict[str, Any]]:
    """The input as canonical items: a string is one user message; a list is checked
    item by item (messages, ``function_call``, ``function_call_output``, ``reasoning``).

    A canonical message is ``{"type": "message", "role", "content": [parts]}`` with parts
    ``input_text``/``output_text``/``refusal``/``input_image``; the other items keep their
    fields (``call_id``, ``name``, ``arguments`` as a string, ``output``)."""
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}])]
    if not isinstance(value, list):
        raise DialectError(f"{param} must be a string or a list of input items", param)
    return [_item(item, f"{param}[{i}]") for i, item in enumerate(value)]


def _message(role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


def _item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise DialectError(f"{where} must be an object", where)
    kind = item.get("type")
    if kind in (None, "message") and "role" in item:
        return _message_item(item, where)
    if kind == "function_call":
        out = {
            "type": "function_call",
            "call_id": require_str(item, "call_id", f"{where}.call_id"),
            "name": require_str(item, "name", f"{where}.name"),
            "arguments": arguments_text(item.get("arguments", ""), f"{where}.arguments"),
        }
        if isinstance(item.get("id"), str):
            out["id"] = item["id"]
        return out
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            text_of_parts(output, f"{where}.output", _INPUT_PARTS)
            output = [dict(p) for p in output]
        elif not isinstance(output, str):
            raise DialectError(
                f"{where}.output must be a string or a list of input parts", f"{where}.output"
            )
        return {
            "type": "function_call_output",
            "call_id": require_str(item, "call_id", f"{where}.call_id"),
            "output": output,
        }
    if kind == "reasoning":
        return _reasoning_item(item, where)
    if kind == "item_reference":
        raise DialectError(
            f"{where} is an item_reference, which this gateway does not resolve: send the "
            "item itself, or continue the conversation with previous_response_id",
            f"{where}.type",
        )
    raise DialectError(
        f"{where}.type is {kind!r}; this gateway serves message, function_call, "
        "function_call_output and reasoning items",
        f"{where}.type",
    )


def _message_item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise DialectError(
            f"{where}.role must be one of {', '.join(_ROLES)}, not {role!r}", f"{where}.role"
        )
    content = item.get("content")
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return _message(role, [{"type": kind, "text": content}])
    kinds = _OUTPUT_PARTS if role == "assistant" else _INPUT_PARTS
    parts = text_of_parts(content, f"{where}.content", kinds)
    out: list[dict[str, Any]] = []
    for i, (part_kind, value) in enumerate(parts):
        if part_kind == "image":
            out.append(_image_part(value, f"{where}.content[{i}]"))
        elif part_kind == "refusal":
            out.append({"type": "refusal", "refusal": value})
        else:
            out.append({"type": kind, "text": value})
    message = _message(role, out)
    if role == "assistant" and isinstance(item.get("id"), str):
        message["id"] = item["id"]
    return message


def _image_part(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        if part.get("file_id") is not None:
            raise DialectError(
                f"{where}.file_id: file ids are not served; send image_url (a URL or a data: URL)",
                f"{where}.file_id",
            )
        raise DialectError(f"{where}.image_url must be a URL or a data: URL", f"{where}.image_url")
    out = {"type": "input_image", "image_url": url}
    if isinstance(part.get("detail"), str):
        out["detail"] = part["detail"]
    return out


def _reasoning_item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    texts = []
    for name in ("content", "summary"):
        parts = item.get(name) or []
        if not isinstance(parts, list):
            raise DialectError(f"{where}.{name} must be a list", f"{where}.{name}")
        for i, part in enumerate(parts):
            if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
                raise DialectError(
                    f"{where}.{name}[{i}] must be an object with a text", f"{where}.{name}[{i}]"
                )
            if name == "content":
                texts.append(part["text"])
    out: dict[str, Any] = {
        "type": "reasoning",
        "summary": [dict(p) for p in item.get("summary") or []],
        "content": [{"type": "reasoning_text", "text": t} for t in texts],
    }
    if isinstance(item.get("id"), str):
        out["id"] = item["id"]
    return out


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DialectError("tools must be a list of function tools", "tools")
    out = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise DialectError(f"{where} must be an object", where)
        if tool.get("type") != "function":
            raise DialectError(
                f"{where} is a {tool.get('type')!r} tool; this gateway serves function tools "
                "only (type 'function', with a name and parameters)",
                f"{where}.type",
            )
        function: dict[str, Any] = {"name": require_str(tool, "name", f"{where}.name")}
        if tool.get("description") is not None:
            function["description"] = optional_str(tool, "description", f"{where}.description")
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, Mapping):
                raise DialectError(
                    f"{where}.parameters must be a JSON schema object", f"{where}.parameters"
                )
            function["parameters"] = dict(parameters)
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        return {
            "type": "function",
            "function": {"name": require_str(value, "name", "tool_choice.name")},
        }
    raise DialectError(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
    )


def _text_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DialectError("text must be an object", "text")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise DialectError("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise DialectError("text.format.schema must be a JSON schema object",
                               "text.format.schema")  # fmt: skip
        out: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": dict(schema)}
        if isinstance(fmt.get("strict"), bool):
            out["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": out}
    raise DialectError(
        f"text.format.type is {kind!r}; this gateway serves text, json_object and json_schema",
        "text.format.type",
    )


def _effort(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise DialectError("reasoning must be an object", "reasoning")
    effort = value.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise DialectError("reasoning.effort must be a string", "reasoning.effort")
    return effort


# -- items to chat ------------------------------------------------------------------------


def _chat_parts(parts: Sequence[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's parts as chat content: one string when it is text alone (what every
    chat template reads), else a list of text and image_url parts."""
    texts = [p.get("text") if "text" in p else p.get("refusal") for p in parts]
    if all(isinstance(t, str) for t in texts):
        return "".join(t for t in texts if isinstance(t, str))
    out: list[dict[str, Any]] = []
    for part, text in zip(parts, texts, strict=True):
        if isinstance(text, str):
            out.append({"type": "text", "text": text})
        else:
            image: dict[str, Any] = {"url": part["image_url"]}
            if "detail" in part:
                image["detail"] = part["detail"]
            out.append({"type": "image_url", "image_url": image})
    return out


def _tool_output(output: Any) -> str | list[dict[str, Any]]:
    if isinstance(output, str):
        return output
    return _chat_parts([_image_part(p, "output") if p.get("type") == "input_image" else p
                        for p in output])  # fmt: skip


def messages_of(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Canonical items as chat messages: a ``developer`` message is a ``system`` one (few
    chat templates know the role), assistant text and the function calls after it are one
    assistant message with ``tool_calls``, each ``function_call_output`` a ``tool``
    message, a reasoning item the next assistant message's ``reasoning_content``."""
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []

    def assistant() -> dict[str, Any]:
        """The assistant message the next assistant item joins (made when there is none)."""
        if out and out[-1]["role"] == "assistant" and "_open" in out[-1]:
            return out[-1]
        message: dict[str, Any] = {"role": "assistant", "content": None, "_open": True}
        out.append(message)
        return message

    for item in items:
        kind = item.get("type")
        if kind == "message" and item["role"] != "assistant":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _chat_parts(item["content"])})
        elif kind == "message":
            message = assistant()
            text = _chat_parts(item["content"])
            if message["content"] is None or message.get("tool_calls"):
                if message.get("tool_calls"):
                    message = {"role": "assistant", "content": None, "_open": True}
                    out.append(message)
                message["content"] = text
            elif isinstance(message["content"], str) and isinstance(text, str):
                message["content"] += text
            else:
                message = {"role": "assistant", "content": text, "_open": True}
                out.append(message)
        elif kind == "function_call":
            message = assistant()
            message.setdefault("tool_calls", []).append({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })  # fmt: skip
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _tool_output(item["output"])})  # fmt: skip
        elif kind == "reasoning":
            reasoning.extend(p["text"] for p in item.get("content") or ())
            if reasoning:
                assistant()["reasoning_content"] = "".join(reasoning)
                reasoning = []
    for message in out:
        message.pop("_open", None)
    return out


def chat_request(
    request: ResponsesRequest, history: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The chat completions body the engine is sent (at ``ENGINE_PATH``): the
    instructions as the first system message, then ``history`` (the items of the
    conversation ``previous_response_id`` continues: its inputs and outputs, in order;
    the previous instructions are not carried over, as OpenAI's API does), then the
    input; usage always asked of a stream."""
    messages = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    messages.extend(messages_of([*history, *request.input]))
    if not messages:
        raise DialectError("input holds no message: send at least one", "input")
    body: dict[str, Any] = {"model": request.model, "messages": messages, **request.options}
    body["stream"] = request.stream
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def conversation(
    history: Sequence[Mapping[str, Any]],
    request: ResponsesRequest,
    response: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """What a stored response keeps so a later request can continue it: the history it
    continued, its input, its output items (reasoning, messages, function calls)."""
    return [*(dict(i) for i in history), *(dict(i) for i in request.input),
            *(dict(i) for i in response.get("output") or ())]  # fmt: skip


# -- answers --------------------------------------------------------------------------------


def usage_block(usage: Usage | None) -> dict[str, Any] | None:
    """The Responses API's usage: ``input_tokens`` counts every prompt token, cached
    ones (``input_tokens_details.cached_tokens``) among them."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.input,
        "input_tokens_details": {"cached_tokens": usage.cached},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning},
        "total_tokens": usage.total,
    }


def response_object(
    request: ResponsesRequest,
    *,
    response_id: str,
    created: int,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
    completed: int | None = None,
) -> dict[str, Any]:
    """A response object as the API gives it (its status, output and usage, and the
    request's fields it repeats)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "completed_at": completed,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": request.model,
        "output": output,
        "usage": usage_block(usage),
        **request.echo,
    }


# A chat finish_reason as a Responses ending: (status, incomplete reason).
ENDINGS = {
    "stop": ("completed", None),
    "tool_calls": ("completed", None),
    "function_call": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"),
}


def answer(
    request: ResponsesRequest,
    chat: Any,
    *,
    response_id: str | None = None,
    created: int | None = None,
    ids: IdMaker = new_id,
) -> dict[str, Any]:
    """The response object of an engine's whole chat answer: its reasoning, its text (one
    message), its tool calls (one ``function_call`` item each), its usage with cached
    tokens; ``status`` from the finish (``length``: incomplete, reason
    ``max_output_tokens``; ``content_filter``: incomplete, reason ``content_filter``)."""
    if not isinstance(chat, Mapping) or not isinstance(chat.get("choices"), list):
        raise DialectError("the engine's answer is not a chat completion")
    choice = chat["choices"][0] if chat["choices"] else {}
    message = choice.get("message") if isinstance(choice, Mapping) else None
    message = message if isinstance(message, Mapping) else {}
    status, reason = ENDINGS.get(str(choice.get("finish_reason")), ("completed", None))
    item_status = "incomplete" if status == "incomplete" else "completed"
    output: list[dict[str, Any]] = []
    thought = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thought, str) and thought:
        output.append(reasoning_item(ids("rs_"), thought))
    text = message.get("content")
    refusal = message.get("refusal")
    if isinstance(text, str) and text or isinstance(refusal, str) and refusal:
        parts = []
        if isinstance(text, str) and text:
            parts.append(text_part(text))
        if isinstance(refusal, str) and refusal:
            parts.append({"type": "refusal", "refusal": refusal})
        output.append(message_item(ids("msg_"), parts, item_status))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        output.append(call_item(ids("fc_"), str(call.get("id") or ids("call_")),
                                str(function.get("name") or ""),
                                str(function.get("arguments") or ""), item_status))  # fmt: skip
    now = int(time.time()) if created is None else created
    return response_object(
        request,
        response_id=response_id or ids("resp_"),
        created=now,
        status=status,
        output=output,
        usage=usage_of(chat.get("usage")),
        incomplete=reason,
        completed=now if status == "completed" else None,
    )


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(ident: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"type": "message", "id": ident, "role": "assistant", "status": status,
            "content": parts}  # fmt: skip


def call_item(ident: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": ident, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def reasoning_item(ident: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": ident, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def output_text(response: Mapping[str, Any]) -> str:
    """Everything of a response's output a client reads: texts, refusals, reasoning and
    function calls' names and arguments (what the guard judges of a whole answer)."""
    texts: list[str] = []
    for item in response.get("output") or ():
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "function_call":
            texts.extend(str(item.get(k) or "") for k in ("name", "arguments"))
            continue
        for part in item.get("content") or ():
            if isinstance(part, Mapping):
                for key in ("text", "refusal"):
                    if isinstance(part.get(key), str):
                        texts.append(part[key])
    return "\n".join(t for t in texts if t)


# The native events whose text a client reads, and the field holding it.
_EVENT_TEXT = {
    "response.output_text.delta": "delta",
    "response.refusal.delta": "delta",
    "response.reasoning_text.delta": "delta",
    "response.reasoning_summary_text.delta": "delta",
    "response.function_call_arguments.delta": "delta",
}


def event_text(event: Any) -> str:
    """The text a Responses stream event from an engine's own ``/v1/responses`` puts
    before the client (its deltas, and a function call's name as its item is added; the
    ``.done`` events and the lifecycle repeat text already counted), for the guard's
    windows on a native stream."""
    if not isinstance(event, Mapping):
        return ""
    if event.get("type") == "response.output_item.added":
        item = event.get("item")
        name = item.get("name") if isinstance(item, Mapping) else None
        return name if isinstance(name, str) else ""
    key = _EVENT_TEXT.get(str(event.get("type")))
    value = event.get(key) if key else None
    return value if isinstance(value, str) else ""


# -- errors ---------------------------------------------------------------------------------


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> bytes:
    """An error as the Responses API answers it: OpenAI's shape, as chat's (the gateway's
    ``ApiError.body()`` is already this; a ``DialectError`` becomes a 400 of it)."""
    payload = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return json.dumps(payload, ensure_ascii=False).encode()
