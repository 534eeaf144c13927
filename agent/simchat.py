"""The sim engine as a plain chat model: its ChatML template with tools and tool calls, the
tool calls a test asks for, and the reranker it also is.

The template writes the request's tools into the system turn (as Qwen's and Hermes's
templates do, one JSON object a line inside ``<tools>``), an assistant's tool calls after
its text (``<tool_call>`` and the call's JSON), and a tool's result as a ``tool`` turn, so
the prompt's token count and its prefix blocks hold all the engine reads.

A test makes the sim call a tool by ending the conversation with a user message of
``/call NAME ARGUMENTS`` lines (ARGUMENTS a JSON object; NAME one of the request's tools):
the answer is those calls, streamed as chat's ``tool_calls`` deltas, their arguments a
token at a time.

Rerank scores a document by the share of the query's words it holds: a lexical stand-in
for a cross-encoder, the same for the same texts.

Standard library only; no Django.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agent.simguard import BadRequest, content_text, parse_messages
from agent.simtext import text_seed

CALL = "/call "


def tool_names(tools: Any) -> list[str]:
    """The function names a request's ``tools`` define."""
    names = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return names


def _call_text(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise BadRequest("each tool call must have a 'function' object")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    name = json.dumps(function.get("name"))
    return f'\n<tool_call>\n{{"name": {name}, "arguments": {arguments}}}\n</tool_call>'


def render(raw_messages: Any, tools: Any, add_generation_prompt: bool = True) -> str:
    """The ChatML prompt of a plain model: the tools in the system turn, then each
    message (an assistant's tool calls after its text)."""
    parse_messages(raw_messages)  # checks the shape, says what is wrong
    turns: list[tuple[str, str]] = []
    for message in raw_messages:
        text = content_text(message.get("content"))
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise BadRequest("'tool_calls' must be a list")
            text += "".join(_call_text(c) for c in calls)
        turns.append((message["role"], text))
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be a list")
        block = "# Tools\n<tools>\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
        block += "\n</tools>"
        if turns and turns[0][0] == "system":
            turns[0] = ("system", turns[0][1] + "\n\n" + block)
        else:
            turns.insert(0, ("system", block))
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def calls_asked(raw_messages: Any, tools: Any) -> list[tuple[str, str, str]] | None:
    """The tool calls the last message asks for (``/call NAME ARGUMENTS`` lines), as (id,
    name, arguments); None when it asks none. A call naming a tool the request does not
    define, or with arguments that are not a JSON object, is a ``BadRequest``."""
    if not isinstance(raw_messages, list) or not raw_messages:
        return None
    last = raw_messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    text = content_text(last.get("content"))
    if not text.startswith(CALL):
        return None
    names = tool_names(tools)
    calls = []
    for number, line in enumerate(text.splitlines()):
        if not line.startswith(CALL):
            continue
        name, _, arguments = line[len(CALL) :].strip().partition(" ")
        if name not in names:
            raise BadRequest(f"/call names {name!r}, which is not among the request's tools")
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise BadRequest(f"/call {name}: the arguments must be a JSON object")
        ident = f"call_{text_seed(text, number) % 16**12:012x}"
        calls.append((ident, name, json.dumps(parsed)))
    return calls


_WORD = re.compile(r"\w+")


def relevance(query: str, document: str) -> float:
    """How much of the query's words the document holds, from 0 to 1."""
    words = set(_WORD.findall(query.lower()))
    if not words:
        return 0.0
    held = words & set(_WORD.findall(document.lower()))
    return round(len(held) / len(words), 6)


def rerank(query: str, documents: Sequence[str], top_n: int | None) -> list[dict[str, Any]]:
    """Results in vLLM's shape, highest relevance first (ties by index), cut to top_n."""
    scored = sorted(
        ((relevance(query, d), i) for i, d in enumerate(documents)), key=lambda p: (-p[0], p[1])
    )
    if top_n is not None:
        scored = scored[:top_n]
    return [
        {"index": i, "document": {"text": documents[i]}, "relevance_score": score}
        for score, i in scored
    ]
