"""What the dialects share: their bad-request error, usage with cached tokens, ids and the
typed server-sent events both the Responses and the Messages APIs stream.

Plain Python, no I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The engine path every translated generating request goes to.
CHAT_PATH = "/v1/chat/completions"


class DialectError(ValueError):
    """A request a dialect cannot serve: ``param`` says where (a dotted path, as OpenAI's
    ``param`` does), the message what to send instead."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def new_id(prefix: str) -> str:
    """A fresh id in the vendors' style: ``prefix`` then 24 hex digits (``resp_``,
    ``msg_``, ``fc_``, ``call_``, ``toolu_``)."""
    return prefix + uuid.uuid4().hex[:24]


IdMaker = Callable[[str], str]


@dataclass(frozen=True)
class Usage:
    """An answer's token counts as chat completions give them: ``input`` counts every
    prompt token, ``cached`` those the engine read from its prefix cache (a part of
    ``input``), ``reasoning`` those of the output spent reasoning (a part of ``output``).
    ``cached_reported`` is false when the engine said nothing of its cache (then
    ``cached`` is 0)."""

    input: int = 0
    output: int = 0
    cached: int = 0
    reasoning: int = 0
    cached_reported: bool = False

    @property
    def total(self) -> int:
        return self.input + self.output


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def usage_of(chat_usage: Any) -> Usage | None:
    """The usage of a chat answer or chunk (``usage``), or None when it has none.

    Reads ``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``
    (llama-server, vLLM with ``--enable-prompt-tokens-details``, SGLang, the sim) and
    ``completion_tokens_details.reasoning_tokens``; a count that is not a whole number is
    read as 0, and cached tokens never exceed the prompt's."""
    if not isinstance(chat_usage, Mapping):
        return None
    prompt = _count(chat_usage.get("prompt_tokens")) or 0
    output = _count(chat_usage.get("completion_tokens")) or 0
    details = chat_usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    out_details = chat_usage.get("completion_tokens_details")
    reasoning = (
        _count(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else None
    )
    return Usage(
        input=prompt,
        output=output,
        cached=min(cached or 0, prompt),
        reasoning=min(reasoning or 0, output),
        cached_reported=cached is not None,
    )


def chat_usage(usage: Usage) -> dict[str, Any]:
    """Chat completions' usage block of ``usage``, cached tokens always said (0 when the
    engine reported none)."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.input,
        "completion_tokens": usage.output,
        "total_tokens": usage.total,
        "prompt_tokens_details": {"cached_tokens": usage.cached},
    }
    if usage.reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning}
    return out


def dump(value: Any) -> str:
    """JSON as the engines and the vendors write it in a stream: compact, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def typed_sse(events: Iterable[Mapping[str, Any]]) -> bytes:
    """Events as server-sent events named by their ``type``: ``event: <type>`` then
    ``data: <json>`` and a blank line, as OpenAI's Responses API and Anthropic's Messages
    API send them (the ``anthropic`` client skips an event with no ``event:`` line)."""
    return b"".join(
        b"event: " + str(e["type"]).encode() + b"\ndata: " + dump(e).encode() + b"\n\n"
        for e in events
    )


def text_of_parts(parts: Any, param: str, kinds: Mapping[str, str]) -> list[tuple[str, Any]]:
    """A list of content parts as (chat part kind, value) pairs: ``kinds`` maps a part's
    ``type`` to ``"text"`` (its ``text`` is read) or ``"image"`` (handed back whole);
    any other type is a ``DialectError`` at ``param[i].type``."""
    if not isinstance(parts, list):
        raise DialectError(f"{param} must be a string or a list of content parts", param)
    out: list[tuple[str, Any]] = []
    for i, part in enumerate(parts):
        where = f"{param}[{i}]"
        if not isinstance(part, Mapping):
            raise DialectError(f"{where} must be an object", where)
        kind = kinds.get(str(part.get("type")))
        if kind is None:
            served = ", ".join(repr(k) for k in kinds)
            raise DialectError(
                f"{where}.type is {part.get('type')!r}; this gateway serves {served} here",
                f"{where}.type",
            )
        if kind == "image":
            out.append(("image", part))
            continue
        text = part.get(kind)
        if not isinstance(text, str):
            raise DialectError(f"{where}.{kind} must be a string", f"{where}.{kind}")
        out.append((kind, text))
    return out


def require_str(body: Mapping[str, Any], name: str, where: str | None = None) -> str:
    value = body.get(name)
    path = where or name
    if not isinstance(value, str) or not value:
        raise DialectError(f"{path} must be a non-empty string", path)
    return value


def optional_str(body: Mapping[str, Any], name: str, where: str | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DialectError(f"{where or name} must be a string", where or name)
    return value


def optional_int(body: Mapping[str, Any], name: str, minimum: int = 1) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DialectError(f"{name} must be a whole number of at least {minimum}", name)
    return value


def optional_bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise DialectError(f"{name} must be true or false", name)
    return value


def optional_number(body: Mapping[str, Any], name: str) -> float | int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DialectError(f"{name} must be a number", name)
    return value


def arguments_text(arguments: Any, param: str) -> str:
    """A tool call's arguments as the chat API carries them: a JSON string (an object is
    written as JSON)."""
    if isinstance(arguments, str):
        return arguments
    try:
        return json.dumps(arguments, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise DialectError(f"{param} cannot be written as JSON", param) from None
