"""Chat-completions streams as engines send them, and the typed events' checks, for the
dialects' tests."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 9,
    "total_tokens": 129,
    "prompt_tokens_details": {"cached_tokens": 96},
}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    """One chat.completion.chunk with one choice."""
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    choice.update(extra)
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "engine-name", "choices": [choice]}  # fmt: skip


def stream(
    texts: Iterable[str] = (),
    *,
    reasoning: Iterable[str] = (),
    calls: Iterable[tuple[str, str, list[str]]] = (),
    finish: str = "stop",
    usage: dict[str, Any] | None = USAGE,
    stop_reason: str | None = None,
) -> list[dict[str, Any]]:
    """The chunks of an answer: the role, its reasoning pieces, its text pieces, each tool
    call (id, name, argument pieces), the finish, then usage (as include_usage asks)."""
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"reasoning_content": r}) for r in reasoning]
    out += [chunk({"content": t}) for t in texts]
    for k, (ident, name, pieces) in enumerate(calls):
        first = pieces[0] if pieces else ""
        out.append(chunk({"tool_calls": [{"index": k, "id": ident, "type": "function",
                                          "function": {"name": name, "arguments": first}}]}))  # fmt: skip
        out += [chunk({"tool_calls": [{"index": k, "function": {"arguments": p}}]})
                for p in pieces[1:]]  # fmt: skip
    extra = {"stop_reason": stop_reason} if stop_reason is not None else {}
    out.append(chunk({}, finish, **extra))
    if usage is not None:
        out.append({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                    "model": "engine-name", "choices": [], "usage": usage})  # fmt: skip
    return out


def whole(text: str | None = "Hello there", *, calls=(), reasoning: str | None = None,
          finish: str = "stop", usage: dict[str, Any] | None = USAGE,
          stop_reason: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A whole chat answer."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"id": i, "type": "function",
                                  "function": {"name": n, "arguments": a}}
                                 for i, n, a in calls]  # fmt: skip
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    choice = {"index": 0, "message": message, "finish_reason": finish}
    if stop_reason is not None:
        choice["stop_reason"] = stop_reason
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "engine-name",
            "choices": [choice], "usage": usage}  # fmt: skip


def parse_sse(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of each event of a typed SSE stream."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name = None
        data = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((name, json.loads("\n".join(data))))
    return out


def check_responses(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Hold the Responses stream's order; return the terminal response object."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    terminal = {"response.completed", "response.incomplete", "response.failed"}
    kinds = [e["type"] for e in events]
    assert kinds[-1] in terminal and sum(k in terminal for k in kinds) == 1, kinds
    added: dict[int, dict[str, Any]] = {}
    done: dict[int, dict[str, Any]] = {}
    texts: dict[tuple[int, int], str] = {}
    parts_open: set[tuple[int, int]] = set()
    arguments: dict[int, str] = {}
    for e in events[2:-1]:
        kind = e["type"]
        if kind == "error":
            continue
        index = e["output_index"]
        if kind == "response.output_item.added":
            assert index == len(added), "items are added in order, from 0"
            added[index] = e["item"]
            continue
        assert index in added and index not in done, (kind, index)
        if kind == "response.output_item.done":
            assert not any(k[0] == index for k in parts_open), "parts close before the item"
            done[index] = e["item"]
            assert e["item"]["id"] == added[index]["id"]
        elif kind == "response.content_part.added":
            key = (index, e["content_index"])
            assert key not in texts
            texts[key] = ""
            parts_open.add(key)
        elif kind in ("response.output_text.delta", "response.refusal.delta",
                      "response.reasoning_text.delta"):  # fmt: skip
            key = (index, e["content_index"])
            assert key in parts_open
            texts[key] += e["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert texts[(index, e["content_index"])] == e["text"]
        elif kind == "response.refusal.done":
            assert texts[(index, e["content_index"])] == e["refusal"]
        elif kind == "response.content_part.done":
            key = (index, e["content_index"])
            parts_open.discard(key)
            part = e["part"]
            assert texts[key] == part.get("text", part.get("refusal"))
        elif kind == "response.function_call_arguments.delta":
            arguments[index] = arguments.get(index, "") + e["delta"]
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == arguments.get(index, "")
        else:
            raise AssertionError(f"unexpected event {kind}")
    response = events[-1]["response"]
    if events[-1]["type"] != "response.failed":
        assert sorted(done) == sorted(added), "every item ends before the response"
        assert response["output"] == [done[i] for i in sorted(done)]
    return response


def responses_text(events: list[dict[str, Any]]) -> str:
    """The text deltas of a Responses stream, joined."""
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def check_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hold the Messages stream's order; return its blocks as the deltas built them."""
    assert events[0]["type"] == "message_start"
    kinds = [e["type"] for e in events]
    if kinds[-1] == "error":
        assert "message_stop" not in kinds
    else:
        assert kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert kinds.count("message_delta") == 1 and kinds.count("message_stop") == 1
    blocks: list[dict[str, Any]] = []
    stopped: set[int] = set()
    open_block: int | None = None
    for e in events[1:]:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks) and open_block is None
            blocks.append(dict(e["content_block"], _json=""))
            open_block = e["index"]
        elif e["type"] == "content_block_delta":
            block = blocks[e["index"]]
            delta = e["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                block["_json"] += delta["partial_json"]
            else:
                assert delta["type"] == "signature_delta"
        elif e["type"] == "content_block_stop":
            assert e["index"] == open_block and e["index"] not in stopped
            stopped.add(e["index"])
            open_block = None
        elif e["type"] == "message_delta":
            assert open_block is None and stopped == set(range(len(blocks)))
    return blocks


def messages_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"].get("text", "") for e in events
                   if e["type"] == "content_block_delta")  # fmt: skip
