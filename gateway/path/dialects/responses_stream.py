"""A chat-completions stream as the Responses API's typed events: plain Python, no I/O.

``ResponsesStream`` is fed the engine's chat chunks in order (only those the guard has
released: what it holds, it has judged) and returns the events they make, each with the
next ``sequence_number`` (from 0), written out by ``common.typed_sse``:

``response.created``, ``response.in_progress``; per output item ``response.output_item.added``
then its content: a message's ``response.content_part.added``, ``response.output_text.delta``
(``response.refusal.delta`` for a refusal part), ``response.output_text.done``,
``response.content_part.done``; a reasoning item's ``response.reasoning_text.*``; a
function call's ``response.function_call_arguments.delta`` and ``.done``; then
``response.output_item.done``. The stream ends with ``finish`` (``response.completed``, or
``response.incomplete`` with reason ``max_output_tokens`` when the engine stopped at the
limit), ``refuse`` (the guard refused the answer: open items end ``incomplete``, then
``response.incomplete`` with reason ``content_filter``) or ``fail`` (the engine's stream
broke: an ``error`` event, then ``response.failed``). There is no ``[DONE]``.

A text or reasoning item closes when another item begins; function calls stay open until
text begins or the answer ends, so parallel calls whose arguments interleave lose nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from gateway.path.dialects.common import IdMaker, Usage, new_id, usage_of
from gateway.path.dialects.responses import (
    ENDINGS,
    ResponsesRequest,
    call_item,
    message_item,
    reasoning_item,
    response_object,
    text_part,
)

TEXT, REFUSAL, REASONING, CALL = "text", "refusal", "reasoning", "call"


class _Item:
    """One output item being streamed."""

    __slots__ = ("index", "id", "kind", "parts", "part_kind", "call_id", "name", "arguments",
                 "done", "status")  # fmt: skip

    def __init__(self, index: int, ident: str, kind: str) -> None:
        self.index = index
        self.id = ident
        self.kind = kind  # "message", REASONING or CALL
        self.parts: list[list[str]] = []  # a message's parts: [kind, text]
        self.part_kind: str | None = None  # the open part's kind
        self.call_id = ""
        self.name = ""
        self.arguments = ""
        self.done = False
        self.status = "in_progress"


class ResponsesStream:
    """The Responses events of one streamed answer (the module's docstring)."""

    def __init__(
        self,
        request: ResponsesRequest,
        *,
        response_id: str | None = None,
        created: int | None = None,
        ids: IdMaker = new_id,
    ) -> None:
        self.request = request
        self.ids = ids
        self.id = response_id or ids("resp_")
        self.created = int(time.time()) if created is None else created
        self.sequence = 0
        self.begun = False
        self.ended = False
        self.items: list[_Item] = []
        self._message: _Item | None = None  # the open message item
        self._reasoning: _Item | None = None  # the open reasoning item
        self._calls: dict[int, _Item] = {}  # open function calls by the chat call's index
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.status = "in_progress"
        self.incomplete: str | None = None
        self.error: dict[str, Any] | None = None

    # -- events -------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _lifecycle(self, kind: str) -> dict[str, Any]:
        return self._event(kind, response=self.response())

    def begin(self) -> list[dict[str, Any]]:
        """``response.created`` and ``response.in_progress``, once (the first call of
        ``feed`` or of an ending makes them when no one did)."""
        if self.begun:
            return []
        self.begun = True
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def feed(self, chunk: Any) -> list[dict[str, Any]]:
        """The events one chat chunk (parsed JSON) makes; [] once the stream ended."""
        if self.ended:
            return []
        out = self.begin()
        if not isinstance(chunk, Mapping):
            return out
        found = usage_of(chunk.get("usage"))
        if found is not None:
            self.usage = found
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return out
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                out.extend(self._delta(delta))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def _delta(self, delta: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        thought = delta.get("reasoning_content")
        if not isinstance(thought, str):
            thought = delta.get("reasoning")
        if isinstance(thought, str) and thought:
            out.extend(self._reason(thought))
        for key, kind in (("content", TEXT), ("refusal", REFUSAL)):
            text = delta.get(key)
            if isinstance(text, str) and text:
                out.extend(self._text(kind, text))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, Mapping):
                    out.extend(self._call(call))
        return out

    def _add(self, kind: str, prefix: str) -> _Item:
        item = _Item(len(self.items), self.ids(prefix), kind)
        self.items.append(item)
        return item

    def _reason(self, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        item = self._reasoning
        if item is None:
            out.extend(self._close_message())
            out.extend(self._close_calls())
            item = self._reasoning = self._add(REASONING, "rs_")
            item.parts.append([REASONING, ""])
            added = {"type": "reasoning", "id": item.id, "summary": [], "content": [],
                     "status": "in_progress"}  # fmt: skip
            out.append(self._event("response.output_item.added", output_index=item.index,
                                   item=added))  # fmt: skip
            out.append(self._event("response.content_part.added", item_id=item.id,
                                   output_index=item.index, content_index=0,
                                   part={"type": "reasoning_text", "text": ""}))  # fmt: skip
        item.parts[0][1] += text
        out.append(self._event("response.reasoning_text.delta", item_id=item.id,
                               output_index=item.index, content_index=0, delta=text))  # fmt: skip
        return out

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        item = self._message
        if item is None:
            out.extend(self._close_reasoning())
            out.extend(self._close_calls())
            item = self._message = self._add("message", "msg_")
            added = {"type": "message", "id": item.id, "role": "assistant", "content": [],
                     "status": "in_progress"}  # fmt: skip
            out.append(self._event("response.output_item.added", output_index=item.index,
                                   item=added))  # fmt: skip
        if item.part_kind != kind:
            out.extend(self._close_part(item))
            item.parts.append([kind, ""])
            item.part_kind = kind
            part = text_part("") if kind == TEXT else {"type": "refusal", "refusal": ""}
            out.append(self._event("response.content_part.added", item_id=item.id,
                                   output_index=item.index, content_index=len(item.parts) - 1,
                                   part=part))  # fmt: skip
        item.parts[-1][1] += text
        name = "response.output_text.delta" if kind == TEXT else "response.refusal.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == TEXT else {}
        out.append(self._event(name, item_id=item.id, output_index=item.index,
                               content_index=len(item.parts) - 1, delta=text,
                               **extra))  # fmt: skip
        return out

    def _call(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        index = call.get("index", 0)
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
        assert isinstance(function, Mapping)
        item = self._calls.get(index)
        if item is None:
            out.extend(self._close_message())
            out.extend(self._close_reasoning())
            item = self._calls[index] = self._add(CALL, "fc_")
            item.call_id = str(call.get("id") or self.ids("call_"))
            item.name = str(function.get("name") or "")
            added = call_item(item.id, item.call_id, item.name, "", "in_progress")
            out.append(self._event("response.output_item.added", output_index=item.index,
                                   item=added))  # fmt: skip
        elif isinstance(function.get("name"), str) and not item.name:
            item.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.arguments += arguments
            out.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                   output_index=item.index, delta=arguments))  # fmt: skip
        return out

    # -- closing items --------------------------------------------------------------------

    def _item_status(self) -> str:
        return "completed" if self.status in ("in_progress", "completed") else "incomplete"

    def _done(self, item: _Item) -> None:
        item.done = True
        item.status = self._item_status()

    def _close_part(self, item: _Item) -> list[dict[str, Any]]:
        if item.part_kind is None:
            return []
        kind, text = item.parts[-1]
        index = len(item.parts) - 1
        item.part_kind = None
        if kind == TEXT:
            done = self._event("response.output_text.done", item_id=item.id,
                               output_index=item.index, content_index=index, text=text,
                               logprobs=[])  # fmt: skip
            part = text_part(text)
        else:
            done = self._event("response.refusal.done", item_id=item.id,
                               output_index=item.index, content_index=index,
                               refusal=text)  # fmt: skip
            part = {"type": "refusal", "refusal": text}
        return [done, self._event("response.content_part.done", item_id=item.id,
                                  output_index=item.index, content_index=index,
                                  part=part)]  # fmt: skip

    def _close_message(self) -> list[dict[str, Any]]:
        item, self._message = self._message, None
        if item is None:
            return []
        out = self._close_part(item)
        self._done(item)
        out.append(self._event("response.output_item.done", output_index=item.index,
                               item=self._item(item)))  # fmt: skip
        return out

    def _close_reasoning(self) -> list[dict[str, Any]]:
        item, self._reasoning = self._reasoning, None
        if item is None:
            return []
        text = item.parts[0][1]
        self._done(item)
        return [
            self._event("response.reasoning_text.done", item_id=item.id,
                        output_index=item.index, content_index=0, text=text),
            self._event("response.content_part.done", item_id=item.id,
                        output_index=item.index, content_index=0,
                        part={"type": "reasoning_text", "text": text}),
            self._event("response.output_item.done", output_index=item.index,
                        item=self._item(item)),
        ]  # fmt: skip

    def _close_calls(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for item in sorted(self._calls.values(), key=lambda i: i.index):
            self._done(item)
            out.append(self._event("response.function_call_arguments.done", item_id=item.id,
                                   output_index=item.index, name=item.name,
                                   arguments=item.arguments))  # fmt: skip
            out.append(self._event("response.output_item.done", output_index=item.index,
                                   item=self._item(item)))  # fmt: skip
        self._calls.clear()
        return out

    def _close_all(self) -> list[dict[str, Any]]:
        return [*self._close_reasoning(), *self._close_message(), *self._close_calls()]

    def _item(self, item: _Item) -> dict[str, Any]:
        """An item as it stands (``completed`` once done, else ``in_progress``)."""
        status = item.status
        if item.kind == CALL:
            return call_item(item.id, item.call_id, item.name, item.arguments, status)
        if item.kind == REASONING:
            return reasoning_item(item.id, item.parts[0][1], status)
        parts = [text_part(t) if k == TEXT else {"type": "refusal", "refusal": t}
                 for k, t in item.parts]  # fmt: skip
        return message_item(item.id, parts, status)

    # -- endings --------------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        """The response object as it stands: what the lifecycle events carry, and what a
        stored response keeps once the stream ended."""
        ended = self.status == "completed"
        return response_object(
            self.request,
            response_id=self.id,
            created=self.created,
            status=self.status,
            output=[self._item(i) for i in self.items] if self.status != "in_progress" else [],
            usage=self.usage if self.status != "in_progress" else None,
            incomplete=self.incomplete,
            error=self.error,
            completed=int(time.time()) if ended else None,
        )

    def finish(self, usage: Usage | None = None) -> list[dict[str, Any]]:
        """The engine's stream ended (``[DONE]``): open items close, then
        ``response.completed``, or ``response.incomplete`` for a finish at the token
        limit (reason ``max_output_tokens``) or the engine's own content filter.
        ``usage``: what the gateway counted, when the engine's own count did not come."""
        if self.ended:
            return []
        if usage is not None and self.usage is None:
            self.usage = usage
        out = self.begin()
        self.status, self.incomplete = ENDINGS.get(str(self.finish_reason),
                                                   ("completed", None))  # fmt: skip
        out.extend(self._close_all())
        self.ended = True
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        out.append(self._lifecycle(kind))
        return out

    def refuse(self, usage: Usage | None = None) -> list[dict[str, Any]]:
        """The guard refused the answer: what was released stays, its items close
        ``incomplete``, and ``response.incomplete`` says reason ``content_filter``.
        ``usage``: what the gateway counted (the engine's count comes after the text)."""
        if self.ended:
            return []
        if usage is not None:
            self.usage = usage
        out = self.begin()
        self.status, self.incomplete = "incomplete", "content_filter"
        out.extend(self._close_all())
        self.ended = True
        out.append(self._lifecycle("response.incomplete"))
        return out

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """The engine's stream broke after its first byte: open items close
        ``incomplete``, an ``error`` event says why, then ``response.failed``."""
        if self.ended:
            return []
        out = self.begin()
        self.status = "failed"
        out.extend(self._close_all())
        self.ended = True
        self.error = {"code": code, "message": message}
        out.append(self._event("error", code=code, message=message, param=None))
        out.append(self._lifecycle("response.failed"))
        return out

    def text(self) -> str:
        """All the text the events carried so far (texts, refusals, reasoning, function
        calls' names and arguments), in output order."""
        texts = []
        for item in self.items:
            texts.extend(t for _, t in item.parts)
            texts.extend((item.name, item.arguments))
        return "".join(texts)
