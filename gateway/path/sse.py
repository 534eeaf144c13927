"""Server-sent events as engines send them: plain Python, no I/O.

``Framer`` cuts a byte stream into whole events however the network split it (an event
may arrive in many reads, several in one, ``\\r\\n`` or ``\\n`` line ends), bounded: an
event larger than ``max_event`` bytes is a ``FrameError``, never an unbounded buffer.
``data_of`` gives an event's data; ``chunk_text`` the text an OpenAI chunk carries.
Events are forwarded as the engine framed them; only those the guard or the usage
counter needs are parsed.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"[DONE]"
MAX_EVENT = 1 << 20


class FrameError(ValueError):
    """An event stream the gateway will not buffer further."""


class Framer:
    """Whole events from a stream of byte chunks."""

    __slots__ = ("_buf", "max_event")

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self._buf = b""
        self.max_event = max_event

    def feed(self, data: bytes) -> list[bytes]:
        """The events completed by ``data``, each without its blank line."""
        buf = self._buf + data if self._buf else data
        hold = b""
        if buf.endswith(b"\r"):
            # It may be the first half of a \r\n split between two reads.
            buf, hold = buf[:-1], b"\r"
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            event = buf[start:end].strip(b"\n")
            if event:
                events.append(event)
            start = end + 2
        self._buf = buf[start:] + hold
        if len(self._buf) > self.max_event:
            raise FrameError(f"an event of over {self.max_event} bytes")
        return events

    def rest(self) -> bytes:
        """What is left unframed when the stream ends (an engine that ended mid-event)."""
        return self._buf.strip(b"\r\n")


def data_of(event: bytes) -> bytes | None:
    """An event's data (its ``data:`` lines joined), or None when it has none."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:]  # one data line, as engines send nearly every event
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    parts = [line[5:].removeprefix(b" ") for line in lines]
    return b"\n".join(parts)


def encode(data: bytes | str) -> bytes:
    """One event carrying ``data``, with its blank line."""
    raw = data.encode() if isinstance(data, str) else data
    return b"data: " + raw.replace(b"\n", b"\ndata: ") + b"\n\n"


def encode_json(value: Any) -> bytes:
    return encode(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def chunk_text(chunk: Any) -> str:
    """The text an OpenAI chunk (chat delta or completion) carries, all choices joined:
    content, reasoning, refusals, tool calls' names and arguments, completions' text."""
    if not isinstance(chunk, dict):
        return ""
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return ""
    texts: list[str] = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for key in ("content", "reasoning_content", "refusal"):
                value = delta.get(key)
                if isinstance(value, str):
                    texts.append(value)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    # The name too: a client shows it and acts on it (it comes once, in
                    # the call's first delta, before its arguments).
                    for key in ("name", "arguments"):
                        value = call["function"].get(key)
                        if isinstance(value, str):
                            texts.append(value)
        text = choice.get("text")
        if isinstance(text, str):
            texts.append(text)
    return "".join(texts)


def carries_token(chunk: Any) -> bool:
    """Whether a streamed chunk is the answer's first token or later: text, a tool call,
    a finish, usage, or anything that is not an OpenAI chunk (an error event). Not the
    chunk carrying only the role, which some engines send before the first token."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return True
    if chunk_text(chunk) or chunk.get("usage"):
        return True
    for choice in chunk["choices"]:
        if not isinstance(choice, dict) or choice.get("finish_reason"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("tool_calls"):
            return True
    return False
