"""What the gateway reads from a client's request body: plain Python, no I/O.

The body goes to the engine unchanged but for what must change (``rewrite``): the served
name, an adapter, and ``stream_options.include_usage`` (always asked of the engine, so
usage is counted even when the client did not ask; the gateway removes it again).

``Request`` is the little the gateway needs to route, size and judge a request; a body it
cannot read is a ``BodyError`` with OpenAI's ``param`` naming where.

``Request.text`` is everything of a request the engine reads as text, so that a judge reads
it all: messages' content, reasoning and names, the tool calls (names and arguments) and
legacy ``function_call`` of assistant messages, and the tool and function definitions the
request sends (each serialised whole, as chat templates write them into the prompt). A
prompt or input given as token ids has no text a judge can read: ``Request.token_ids``
says so, and the gateway refuses it when the policy judges requests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# Chat, completions and embeddings: the three kinds of request the gateway serves.
CHAT = "chat"
COMPLETION = "completion"
EMBEDDING = "embedding"
# A query and documents to rank (POST /v1/rerank, /v2/rerank: gateway.path.reranking), read
# from the engine's body the dialect made of the client's.
RERANK = "rerank"
# Kinds whose answer holds no text of the engine's (numbers: vectors, scores).
NO_TEXT = frozenset({EMBEDDING, RERANK})
KINDS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/v1/embeddings": EMBEDDING,
}

# How much of the conversation's leading text the affinity key holds: enough to tell
# conversations apart, little enough that the next turn (which repeats it) maps the same.
AFFINITY_CHARS = 512


class BodyError(ValueError):
    """A request body the gateway cannot serve: ``param`` says where, as OpenAI does."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


NOT_JSON = "The body is not JSON: send a JSON object."


def _no_constant(name: str) -> Any:
    raise BodyError(
        f"The body is not JSON: {name} is not a JSON number (JSON has no NaN, Infinity or "
        "-Infinity): send a finite number, or null."
    )


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise BodyError(
            f"The body holds the number {text[:40]}, too large for a JSON number to carry (it "
            "reads as infinity): send a finite number."
        )
    return value


# Made once: ``json.loads`` with options makes a decoder (and its scanner) at each call.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
# ``json.dumps(value, ensure_ascii=False)``'s encoder, made once for the same reason.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, else ``BodyError``: what is not JSON (``NaN``,
    ``Infinity`` and ``-Infinity`` too, which Python's ``json`` reads by default but JSON
    has not, and numbers so large they read as infinity) or not an object. Bytes are
    read as ``json.loads`` reads them (UTF-8, -16 or -32, a UTF-8 BOM allowed)."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        data = _DECODER.decode(text)
    except BodyError:
        raise
    except (ValueError, RecursionError):
        raise BodyError(NOT_JSON) from None
    if not isinstance(data, dict):
        raise BodyError("the request body must be a JSON object")
    return data


def dumps(value: Any) -> bytes:
    """``value`` as JSON bytes (UTF-8, as ``json.dumps(value, ensure_ascii=False)``)."""
    return _ENCODER.encode(value).encode()


@dataclass(frozen=True)
class Request:
    """What the gateway needs of one request."""

    kind: str
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    # The text a judge reads: all the engine reads as text (the module's docstring).
    text: str
    # The conversation's leading text, for prefix affinity and canary stickiness.
    affinity: str
    # How many bytes of text the prompt holds: an upper bound on its tokens (for token
    # ids, their count: exactly its tokens).
    prompt_bytes: int
    messages: int
    # The prompt (completions) or input (embeddings) is token ids: no judge can read it.
    token_ids: bool = False
    # The first of tools, functions, tool_choice, function_call that asks for tools (None:
    # the request asks none).
    tools_param: str | None = None

    @property
    def uses_tools(self) -> bool:
        """Whether the request asks for tools (``tools``, ``tool_choice``, or the legacy
        ``functions``, ``function_call``): for a model whose capabilities list them."""
        return self.tools_param is not None


def _dump(value: Any, param: str) -> str:
    """A value as the engine's chat template writes it: JSON (strings as they are)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        raise BodyError(f"{param} cannot be read: send plain JSON", param) from None


def _text_of(content: Any, param: str) -> str:
    """The text of a message's content: a string, or a list of parts (text parts read:
    any part's ``text``, whatever its type, and an assistant's ``refusal``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise BodyError(f"{param}[{i}] must be an object", f"{param}[{i}]")
            text = part.get("text")
            if part.get("type") == "text" and not isinstance(text, str):
                raise BodyError(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
            for name in ("text", "refusal"):
                if isinstance(part.get(name), str):
                    parts.append(part[name])
        return "\n".join(parts)
    raise BodyError(f"{param} must be a string or a list of parts", param)


def _call_text(call: Any, param: str) -> list[str]:
    """A function call's name and arguments (a tool call's ``function``, or the legacy
    ``function_call``)."""
    if not isinstance(call, dict):
        raise BodyError(f"{param} must be an object", param)
    texts = []
    for name in ("name", "arguments"):
        if call.get(name) is not None:
            texts.append(_dump(call[name], f"{param}.{name}"))
    return texts


def _message_text(message: dict[str, Any], param: str) -> tuple[str, str]:
    """A message's content, and all of it the engine reads (content, reasoning, its
    name, its tool calls)."""
    content = _text_of(message.get("content"), f"{param}.content")
    texts = [content] if content else []
    for name in ("name", "reasoning_content", "reasoning"):
        if isinstance(message.get(name), str) and message[name]:
            texts.append(message[name])
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise BodyError(f"{param}.tool_calls must be a list", f"{param}.tool_calls")
        for j, call in enumerate(calls):
            where = f"{param}.tool_calls[{j}]"
            if not isinstance(call, dict):
                raise BodyError(f"{where} must be an object", where)
            texts.extend(_call_text(call.get("function") or {}, f"{where}.function"))
    if message.get("function_call") is not None:
        texts.extend(_call_text(message["function_call"], f"{param}.function_call"))
    return content, "\n".join(texts)


def _definitions(body: dict[str, Any]) -> list[str]:
    """The tools and legacy functions a chat request defines, each serialised whole: a
    chat template writes them into the prompt, every field the engine keeps included."""
    texts: list[str] = []
    for field in ("tools", "functions"):
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, list):
            raise BodyError(f"{field} must be a list", field)
        texts.extend(_dump(item, f"{field}[{i}]") for i, item in enumerate(value))
    return texts


def _tools_param(body: dict[str, Any]) -> str | None:
    for field in ("tools", "functions"):
        if body.get(field):
            return field
    for field in ("tool_choice", "function_call"):
        if body.get(field) not in (None, "none"):
            return field
    return None


def _token_count(value: Any) -> int | None:
    """How many token ids ``value`` holds (a non-empty list of them, or a non-empty list
    of such lists); None when it is not token ids."""

    def ids(items: Any) -> int | None:
        if not isinstance(items, list) or not items:
            return None
        ok = all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in items)
        return len(items) if ok else None

    flat = ids(value)
    if flat is not None or not isinstance(value, list) or not value:
        return flat
    counts = [ids(row) for row in value]
    return None if None in counts else sum(c for c in counts if c is not None)


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BodyError(f"{name} must be a whole number of at least 1", name)
    return value


def _what(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string"
    return "a list" if isinstance(value, list) else "an object"


def read(kind: str, body: Any) -> Request:
    """Read a parsed JSON body of ``kind``; raise ``BodyError`` naming what is wrong."""
    if not isinstance(body, dict):
        raise BodyError("the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise BodyError("model is required: name a model from GET /v1/models", "model")
    if not isinstance(model, str) or not model:
        raise BodyError(
            f"model must be a string naming a model from GET /v1/models, not {_what(model)}",
            "model",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BodyError("stream must be true or false", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise BodyError("stream_options must be an object", "stream_options")
        include_usage = options.get("include_usage") is True
    max_tokens = _positive_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _positive_int(body, "max_tokens")
    tokens: int | None = None
    if kind == CHAT:
        text, affinity, count = _chat(body)
    elif kind == COMPLETION:
        text, tokens = _prompt(body.get("prompt"), "prompt", "a list of strings")
        affinity, count = text[:AFFINITY_CHARS], 1
    elif kind == EMBEDDING:
        text, tokens = _prompt(body.get("input"), "input", "a non-empty list of strings")
        affinity, count, stream = "", 1, False
    elif kind == RERANK:
        # The query and every document: what the engine reads, what the guard judges.
        documents = body.get("documents")
        text = "\n".join([str(body.get("query", "")), *map(str, documents or [])])
        affinity, count, stream = "", 1, False
    else:  # pragma: no cover - the route table names only the three kinds
        raise BodyError(f"unknown kind {kind}")
    return Request(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        text=text,
        affinity=f"{model}\x00{affinity}" if affinity else "",
        prompt_bytes=tokens if tokens is not None else len(text.encode("utf-8", "surrogatepass")),
        messages=count,
        token_ids=tokens is not None,
        tools_param=_tools_param(body),
    )


def _chat(body: dict[str, Any]) -> tuple[str, str, int]:
    """Return a chat's text (tools first, where chat templates put them, then each
    message's), its affinity key (the leading system prompts and the first other
    message) and how many messages it has."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BodyError("messages must be a non-empty list", "messages")
    texts: list[str] = _definitions(body)
    leading: list[str] = []
    past_leading = False
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BodyError(f"messages[{i}] must be an object", f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str):
            raise BodyError(f"messages[{i}].role must be a string", f"messages[{i}].role")
        content, read_text = _message_text(message, f"messages[{i}]")
        texts.append(read_text)
        if not past_leading:
            leading.append(content)
            past_leading = role != "system"
    return "\n".join(texts), "\x00".join(leading)[:AFFINITY_CHARS], len(messages)


def _prompt(value: Any, field: str, strings: str) -> tuple[str, int | None]:
    """Return a completion's prompt or an embedding's input as text, or "" and its count
    of token ids; ``strings`` says which lists of strings it takes."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        return "\n".join(value), None
    if field == "prompt" and value == []:
        return "", None  # an empty list of strings, as a completion takes it
    tokens = _token_count(value)
    if tokens is not None:
        return "", tokens
    raise BodyError(
        f"{field} must be a string, {strings}, or token ids (a list of whole numbers, or a "
        "list of such lists)",
        field,
    )


def rewrite(
    body: dict[str, Any], *, served: str, stream: bool, adapter: str | None = None
) -> dict[str, Any]:
    """The body as the engine gets it: its served name, usage always asked when streaming."""
    out = dict(body)
    out["model"] = adapter or served
    if stream:
        options = dict(out.get("stream_options") or {})
        options["include_usage"] = True
        out["stream_options"] = options
    return out
