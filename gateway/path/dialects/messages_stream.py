"""A chat-completions stream as the Messages API's events: plain Python, no I/O.

``MessagesStream`` is fed the engine's chat chunks in order (only those the guard has
released) and returns the events they make, written out by ``common.typed_sse`` (the
``anthropic`` client reads an event only by its ``event:`` line):

``message_start`` (the message with no content yet; its usage as far as the first chunk
tells: an engine that sends usage on every chunk gives the prompt's count here, the rest
give it in ``message_delta``), then per content block ``content_block_start``,
``content_block_delta`` (``text_delta``, ``thinking_delta`` then a ``signature_delta``,
``input_json_delta`` for a tool use's input) and ``content_block_stop``, with indices from
0 in the order blocks start; then ``message_delta`` (``stop_reason``, ``stop_sequence``,
the usage's final counts: ``input_tokens`` not cached, ``cache_read_input_tokens``,
``output_tokens``) and ``message_stop``. ``refuse`` ends a refused answer the same way
with ``stop_reason: "refusal"``; ``fail`` sends the API's ``error`` event. ``ping`` is the
API's keep-alive.

One block is open at a time, as Anthropic's API streams them; a delta for a tool use whose
block has closed (an engine interleaving parallel calls' arguments) still goes out under
that block's index, which the ``anthropic`` client accumulates by index, so no argument
is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.path.dialects.common import IdMaker, Usage, new_id, usage_of
from gateway.path.dialects.messages import MessagesRequest, stop_reason, tool_input, usage_block

TEXT, THINKING, TOOL = "text", "thinking", "tool_use"


class MessagesStream:
    """The Messages events of one streamed answer (the module's docstring)."""

    def __init__(
        self, request: MessagesRequest, *, message_id: str | None = None, ids: IdMaker = new_id
    ) -> None:
        self.request = request
        self.ids = ids
        self.id = message_id or ids("msg_")
        self.begun = False
        self.ended = False
        self.blocks: list[dict[str, Any]] = []  # each block as it stands
        self._open: int | None = None  # the index of the open block
        self._tools: dict[int, int] = {}  # block index of each chat tool call index
        self.finish_reason: str | None = None
        self.matched: Any = None  # the stop string the engine says it stopped at
        self.usage: Usage | None = None
        self.stop_reason: str | None = None

    def begin(self) -> list[dict[str, Any]]:
        """``message_start``, once (the first call of ``feed`` or an ending makes it)."""
        if self.begun:
            return []
        self.begun = True
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage_block(self.usage), "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    @staticmethod
    def ping() -> dict[str, Any]:
        """The API's keep-alive event."""
        return {"type": "ping"}

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        """The events one chat chunk (parsed JSON) makes; [] once the stream ended."""
        if self.ended:
            return []
        if isinstance(chunk, Mapping):
            found = usage_of(chunk.get("usage"))
            if found is not None:
                self.usage = found
        out = self.begin()
        if not isinstance(chunk, Mapping) or not isinstance(chunk.get("choices"), list):
            return out
        for choice in chunk["choices"]:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                out.extend(self._delta(delta))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
                self.matched = choice.get("stop_reason")
        return out

    def _delta(self, delta: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        thought = delta.get("reasoning_content")
        if not isinstance(thought, str):
            thought = delta.get("reasoning")
        if isinstance(thought, str) and thought:
            out.extend(self._write(THINKING, thought))
        for key in ("content", "refusal"):
            text = delta.get(key)
            if isinstance(text, str) and text:
                out.extend(self._write(TEXT, text))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, Mapping):
                    out.extend(self._tool(call))
        return out

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._close()
        index = len(self.blocks)
        self.blocks.append(block)
        self._open = index
        start = dict(block)
        if block["type"] == TOOL:
            start["input"] = {}
            del start["arguments"]
        elif block["type"] == TEXT:
            start["text"] = ""
        else:
            start["thinking"] = ""
        out.append({"type": "content_block_start", "index": index, "content_block": start})
        return out

    def _write(self, kind: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._open is None or self.blocks[self._open]["type"] != kind:
            block = {"type": TEXT, "text": ""} if kind == TEXT else \
                {"type": THINKING, "thinking": "", "signature": ""}  # fmt: skip
            out.extend(self._start(block))
        assert self._open is not None
        self.blocks[self._open][kind] += text
        delta = {"type": "text_delta", "text": text} if kind == TEXT else \
            {"type": "thinking_delta", "thinking": text}  # fmt: skip
        out.append({"type": "content_block_delta", "index": self._open, "delta": delta})
        return out

    def _tool(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        index = call.get("index", 0)
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
        assert isinstance(function, Mapping)
        block_index = self._tools.get(index)
        if block_index is None:
            block = {"type": TOOL, "id": str(call.get("id") or self.ids("toolu_")),
                     "name": str(function.get("name") or ""), "input": {},
                     "arguments": ""}  # fmt: skip
            out.extend(self._start(block))
            block_index = self._tools[index] = len(self.blocks) - 1
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self.blocks[block_index]["arguments"] += arguments
            out.append({"type": "content_block_delta", "index": block_index,
                        "delta": {"type": "input_json_delta",
                                  "partial_json": arguments}})  # fmt: skip
        return out

    def _close(self) -> list[dict[str, Any]]:
        index, self._open = self._open, None
        if index is None:
            return []
        out: list[dict[str, Any]] = []
        if self.blocks[index]["type"] == THINKING:
            # The API ends a thinking block with its signature; an engine signs nothing.
            out.append({"type": "content_block_delta", "index": index,
                        "delta": {"type": "signature_delta", "signature": ""}})  # fmt: skip
        out.append({"type": "content_block_stop", "index": index})
        return out

    def _end(self, reason: str, sequence: str | None, usage: Usage | None,
             details: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
        out = self.begin()
        out.extend(self._close())
        self.ended = True
        self.stop_reason = reason
        if usage is not None:
            self.usage = usage
        delta: dict[str, Any] = {"stop_reason": reason, "stop_sequence": sequence}
        if details is not None:
            delta["stop_details"] = details
        out.append({"type": "message_delta", "delta": delta, "usage": usage_block(self.usage)})
        out.append({"type": "message_stop"})
        return out

    def finish(self, usage: Usage | None = None) -> list[dict[str, Any]]:
        """The engine's stream ended (``[DONE]``): the open block closes, then
        ``message_delta`` with the stop reason (``end_turn``, ``max_tokens``,
        ``tool_use``, ``stop_sequence``) and the usage, and ``message_stop``.
        ``usage``: what the gateway counted, when the engine's own count did not come."""
        if self.ended:
            return []
        reason, sequence = stop_reason(self.finish_reason, self.matched,
                                       self.request.stop_sequences)  # fmt: skip
        # The engine's own count stands; the gateway's is for an engine that sent none.
        return self._end(reason, sequence, usage if self.usage is None else None)

    def refuse(self, usage: Usage | None = None) -> list[dict[str, Any]]:
        """The guard refused the answer: what was released stays, the open block closes,
        and the message ends with ``stop_reason: "refusal"``. ``usage``: what the gateway
        counted, when the engine's own count did not arrive."""
        if self.ended:
            return []
        details = {"type": "refusal", "category": None, "explanation": None}
        return self._end("refusal", None, usage, details)

    def fail(self, message: str) -> list[dict[str, Any]]:
        """The engine's stream broke after its first byte: the API's ``error`` event
        (the ``anthropic`` client raises it as an ``APIStatusError``)."""
        if self.ended:
            return []
        out = self.begin()
        self.ended = True
        out.append({"type": "error", "error": {"type": "api_error", "message": message}})
        return out

    def message(self) -> dict[str, Any]:
        """The message as it stands (its blocks, stop reason and usage)."""
        content = []
        for block in self.blocks:
            block = dict(block)
            if block["type"] == TOOL:
                block["input"] = tool_input(block.pop("arguments"))
            content.append(block)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.request.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": usage_block(self.usage),
        }

    def text(self) -> str:
        """All the text the events carried so far (text, thinking, tool inputs' JSON)."""
        return "".join(
            b.get("text") or b.get("thinking") or b.get("arguments") or "" for b in self.blocks
        )
