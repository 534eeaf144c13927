"""What the gateway reads from a client's request body: plain Python, no I/O.

The body goes to the engine unchanged but for what must change (``rewrite``): the served
name, an adapter, and ``stream_options.include_usage`` (always asked of the engine, so
usage is counted even when the client did not ask; the gateway removes it again).

``Request`` is the little the gateway needs to route, size and judge a request; a body it
cannot read is a ``BodyError`` with OpenAI's ``param`` naming where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Chat, completions and embeddings: the three kinds of request the gateway serves.
CHAT = "chat"
COMPLETION = "completion"
EMBEDDING = "embedding"
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


@dataclass(frozen=True)
class Request:
    """What the gateway needs of one request."""

    kind: str
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    # The text a judge reads (every message's text, or the prompt, or the input).
    text: str
    # The conversation's leading text, for prefix affinity and canary stickiness.
    affinity: str
    # How many bytes of text the prompt holds: an upper bound on its tokens.
    prompt_bytes: int
    messages: int


def _text_of(content: Any, param: str) -> str:
    """The text of a message's content: a string, or a list of parts (text parts read)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise BodyError(f"{param}[{i}] must be an object", f"{param}[{i}]")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BodyError(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
                parts.append(text)
        return "\n".join(parts)
    raise BodyError(f"{param} must be a string or a list of parts", param)


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BodyError(f"{name} must be a whole number of at least 1", name)
    return value


def read(kind: str, body: Any) -> Request:
    """Read a parsed JSON body of ``kind``; raise ``BodyError`` naming what is wrong."""
    if not isinstance(body, dict):
        raise BodyError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BodyError("model is required: name a model from GET /v1/models", "model")
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
    if kind == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BodyError("messages must be a non-empty list", "messages")
        texts: list[str] = []
        leading: list[str] = []
        past_leading = False
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise BodyError(f"messages[{i}] must be an object", f"messages[{i}]")
            role = message.get("role")
            if not isinstance(role, str):
                raise BodyError(f"messages[{i}].role must be a string", f"messages[{i}].role")
            text = _text_of(message.get("content"), f"messages[{i}].content")
            texts.append(text)
            # The leading system prompts and the first other message make the key.
            if not past_leading:
                leading.append(text)
                past_leading = role != "system"
        text = "\n".join(texts)
        affinity = "\x00".join(leading)[:AFFINITY_CHARS]
        count = len(messages)
    elif kind == COMPLETION:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            text = "\n".join(prompt)
        elif isinstance(prompt, str):
            text = prompt
        else:
            raise BodyError("prompt must be a string or a list of strings", "prompt")
        affinity = text[:AFFINITY_CHARS]
        count = 1
    elif kind == EMBEDDING:
        value = body.get("input")
        if isinstance(value, str):
            text = value
        elif isinstance(value, list) and value and all(isinstance(p, str) for p in value):
            text = "\n".join(value)
        elif isinstance(value, list) and value:
            # Token arrays: nothing to judge as text; their length bounds the tokens.
            text = ""
        else:
            raise BodyError("input must be a string or a non-empty list", "input")
        affinity = ""
        count = 1
        stream = False
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
        prompt_bytes=len(text.encode("utf-8", "surrogatepass")),
        messages=count,
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
