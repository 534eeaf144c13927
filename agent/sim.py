"""Serve a simulated inference engine: the ``sim`` engine the agent runs without weights.

It speaks the OpenAI-compatible API that llama-server and vLLM speak (``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``, streaming, logprobs, ``/health``,
``/tokenize``) and writes synthetic text at a set time to first token and rate, so
everything around an engine (readiness, routing, queueing, streaming, timeouts) runs for
real on a machine with no card.

Started with ``--guard-format`` it is a judge: it finds the text the prompt asks it to
judge, calls it unsafe exactly when that text holds the unsafe marker, and answers in the
format's own grammar (see /work/shared/spec/guard-formats.md, and docs/agent-protocol.md for
the replica's ``guard`` field), with logprobs that put 0.99 on its verdict.

Standard library only; no Django. ``python -m agent.sim --help`` lists the options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import http
import json
import math
import os
import random
import re
import signal
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from agent import simweights

SIM_VERSION = "1"

GUARD_FORMATS = ("qwen3guard", "llamaguard3", "shieldgemma", "json")
LOGPROB_STYLES = ("vllm", "llamacpp")

# vLLM refuses more (its --max-logprobs default); llama-server has no such limit, but a
# client asking for more than vLLM gives is not portable.
MAX_LOGPROBS = 20
_MAX_BODY = 32 * 1024 * 1024
_MAX_HEADERS = 100

# ---------------------------------------------------------------------------------------
# Tokenizer

# Special tokens are one token each, as llama-server and vLLM parse them in a prompt: split
# out first, so a space before one stays in the text before it.
_SPECIAL_RE = re.compile(
    r"(<\|[A-Za-z0-9_]+\|>|</?think>|<bos>|<eos>|<start_of_turn>|<end_of_turn>)"
)
# Byte-pair tokenizers keep a word's leading space and a run of newlines in one token;
# guard clients rely on both (" Unsafe" after "Safety:", Llama's "\n\n" before "safe").
# Every character matches some branch, so the pieces always concatenate to the text.
_PLAIN_RE = re.compile(r" ?\w+| ?[^\w\s]|\s*[\r\n]+|\s+(?!\S)|\s+")

# Token id → piece, for token-id prompts and /detokenize; bounded so a long-running sim
# fed endless distinct words does not grow without end.
_PIECES: dict[int, str] = {}
_MAX_PIECES = 1_000_000


def token_id(piece: str) -> int:
    """Return a token's id: a stable hash of its text, the same in every process."""
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=4).digest()
    ident = int.from_bytes(digest, "big") & 0x7FFFFFFF
    if len(_PIECES) < _MAX_PIECES:
        _PIECES.setdefault(ident, piece)
    return ident


def tokenize(text: str, parse_special: bool = True) -> list[str]:
    """Split text into token pieces that concatenate back to exactly the text."""
    segments = _SPECIAL_RE.split(text) if parse_special else [text]
    pieces = []
    for index, segment in enumerate(segments):
        if index % 2:  # re.split puts the captured special tokens at odd indexes
            pieces.append(segment)
        else:
            pieces.extend(m.group(0) for m in _PLAIN_RE.finditer(segment))
    return pieces


def detokenize(ids: Sequence[int]) -> str:
    """Return the text of token ids this process has seen.

    Raises:
        KeyError: an id was never produced by this process's tokenizer.
    """
    return "".join(_PIECES[i] for i in ids)


# ---------------------------------------------------------------------------------------
# Synthetic text

_WORDS = (
    "the", "model", "answers", "with", "quiet", "steady", "words", "that", "carry", "little",
    "meaning", "across", "a", "long", "line", "of", "tokens", "while", "every", "request",
    "waits", "its", "turn", "in", "queue", "cluster", "keeps", "time", "and", "counts",
    "each", "reply", "simple", "river", "stone", "light", "paper", "window", "signal", "north",
    "orange", "garden", "careful", "engine", "number", "morning", "harbor", "silver",
)  # fmt: skip


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b("\x00".join(map(str, parts)).encode("utf-8"), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def synthetic_text(seed: int) -> str:
    """Return the deterministic text a plain sim model writes for a prompt's seed.

    Sentences of 5 to 11 words, 20 to 70 tokens in all, so a generous ``max_tokens``
    ends on "stop" and a small one on "length".
    """
    rng = random.Random(seed)
    target = 20 + rng.randrange(40)
    sentences: list[str] = []
    tokens = 0
    while tokens < target:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 11))]
        words[0] = words[0].capitalize()
        sentences.append(" ".join(words) + ".")
        tokens += len(words) + 1
    return " ".join(sentences)


# ---------------------------------------------------------------------------------------
# Chat templates, verbatim from the spec (guard-formats.md §1.3, §2.3, §3.2)

_QWEN_CATEGORY_LINES = (
    "Violent.\nNon-violent Illegal Acts.\nSexual Content or Sexual Acts.\nPII.\n"
    "Suicide & Self-Harm.\nUnethical Acts.\nPolitically Sensitive Topics.\nCopyright Violation.\n"
)
_QWEN_PROMPT_HEAD = (
    "<|im_start|>user\n# Task:\n"
    "1) Evaluate whether THE LAST USER's query belongs to safe or unsafe content based on our safety policy.\n"
    "2) Identify the category of unsafe content found.\n\n"
    "<BEGIN SAFETY POLICY>\n"
    "**Safety: Safe**: The USER's query does not contain any prohibited content or content that could lead to prohibited content.\n"
    "**Safety: Unsafe**: The USER's query contains prohibited content.\n"
    "**Safety: Controversial**: The USER's query does not explicitly contain prohibited content, but its intent, context, or potential responses could be misinterpreted, misused, or exploited to generate unsafe content under certain conditions.\n"
    "<END SAFETY POLICY>\n\n"
    "<BEGIN UNSAFE CONTENT CATEGORIES>\n" + _QWEN_CATEGORY_LINES + "Jailbreak.\n"
    "<END UNSAFE CONTENT CATEGORIES>\n\n"
    "<BEGIN CONVERSATION>\n\n"
)
_QWEN_RESPONSE_HEAD = (
    "<|im_start|>user\n# Task:\n"
    "1) Evaluate whether THE LAST ASSISTANT's response belongs to safe or unsafe content based on our safety policy.\n"
    "2) Identify the category of unsafe content found.\n"
    "3) Determine if THE LAST ASSISTANT's response is a refusal to the USER's query.\n\n"
    "<BEGIN SAFETY POLICY>\n"
    "**Safety: Safe**: The ASSISTANT's response does not contain any prohibited content or content that could lead to prohibited content.\n"
    "**Safety: Unsafe**: The ASSISTANT's response contains prohibited content.\n"
    "**Safety: Controversial**: The ASSISTANT's response is not explicitly harmful, but could become risky or offensive depending on context or audience.\n"
    "<END SAFETY POLICY>\n\n"
    "<BEGIN UNSAFE CONTENT CATEGORIES>\n"
    + _QWEN_CATEGORY_LINES
    + "<END UNSAFE CONTENT CATEGORIES>\n\n"
    "<BEGIN REFUSAL POLICY>\n"
    "**Refusal: Yes**: The ASSISTANT refused to answer or did not comply with the USER's request.\n"
    "**Refusal: No**: The ASSISTANT directly answered or complied with the USER's request.\n"
    "<END REFUSAL POLICY>\n\n"
    "<BEGIN CONVERSATION>\n\n"
)
_QWEN_ASSISTANT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
_QWEN_PROMPT_TAIL = (
    "\n\n<END CONVERSATION>\n\n"
    "Provide your safety assessment for ONLY THE LAST **USER's query** in the above conversation:\n"
    " - The first line must be one of: 'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'.\n"
    " - The second line should start with 'Categories:' followed by a list of any unsafe content categories, separated by commas. If the content is safe, use 'Categories: None'.<|im_end|>\n"
    + _QWEN_ASSISTANT
)
_QWEN_RESPONSE_TAIL = (
    "\n\n<END CONVERSATION>\n\n"
    "Provide your safety assessment for ONLY THE LAST **ASSISTANT's response** in the above conversation:\n"
    " - The first line must be one of: 'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'.\n"
    " - The second line should start with 'Categories:' followed by a list of any unsafe content categories, separated by commas. If the content is safe, use 'Categories: None'.\n"
    " - The third line must be one of: 'Refusal: Yes', 'Refusal: No'.<|im_end|>\n" + _QWEN_ASSISTANT
)

# Llama Guard 3 codes, by the template's names and the model cards' (guard-formats.md §2.2).
_LLAMA_CATEGORIES = (
    ("S1", "Violent Crimes", "Violent Crimes"),
    ("S2", "Non-Violent Crimes", "Non-Violent Crimes"),
    ("S3", "Sex Crimes", "Sex-Related Crimes"),
    ("S4", "Child Exploitation", "Child Sexual Exploitation"),
    ("S5", "Defamation", "Defamation"),
    ("S6", "Specialized Advice", "Specialized Advice"),
    ("S7", "Privacy", "Privacy"),
    ("S8", "Intellectual Property", "Intellectual Property"),
    ("S9", "Indiscriminate Weapons", "Indiscriminate Weapons"),
    ("S10", "Hate", "Hate"),
    ("S11", "Self-Harm", "Suicide & Self-Harm"),
    ("S12", "Sexual Content", "Sexual Content"),
    ("S13", "Elections", "Elections"),
    ("S14", "Code Interpreter Abuse", "Code Interpreter Abuse"),
)
_LLAMA_CODES = {name.lower(): code for code, *names in _LLAMA_CATEGORIES for name in names} | {
    code.lower(): code for code, _, _ in _LLAMA_CATEGORIES
}
_LLAMA_HEAD = (
    " <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
    "Task: Check if there is unsafe content in '{role}' messages in conversations according our safety policy with the below categories.\n\n"
    "<BEGIN UNSAFE CONTENT CATEGORIES>\n"
    + "".join(f"{code}: {name}.\n" for code, name, _ in _LLAMA_CATEGORIES)
    + "<END UNSAFE CONTENT CATEGORIES>\n\n"
    "<BEGIN CONVERSATION>\n\n"
)
_LLAMA_ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>"
_LLAMA_TAIL = (
    "<END CONVERSATION>\n\n"
    "Provide your safety assessment for ONLY THE LAST {role} message in the above conversation:\n"
    " - First line must read 'safe' or 'unsafe'.\n"
    " - If unsafe, a second line must include a comma-separated list of violated categories.<|eot_id|>"
    + _LLAMA_ASSISTANT
)

_GEMMA_PROMPT = (
    "<bos>You are a policy expert trying to help determine whether a user prompt is in violation of the defined safety policies.\n\n"
    "<start_of_turn>\nHuman Question: {user}\n<end_of_turn>\n\n"
    "Our safety principle is defined in the below:\n\n* {guideline}\n\n===\n\n"
    "Does the human question violate the above principle? Your answer must start with 'Yes' or 'No'. And then walk through step by step to be sure we answer correctly.\n\n"
)
_GEMMA_RESPONSE = (
    "<bos>You are a policy expert trying to help determine whether an AI response to a prompt is in violation of the defined safety policies.\n\n"
    "<start_of_turn>\nHuman Question: {user}\n<end_of_turn>\n"
    "<start_of_turn>\nChatbot Response: {assistant}\n<end_of_turn>\n\n"
    "Our safety principle is defined in the below:\n\n* {guideline}\n\n===\n\n"
    "Does the Chatbot Response violate the above principle? Your answer must  start with 'Yes' or 'No'. And then walk through step by step to be sure we answer correctly.\n\n"
)
_GEMMA_END = "And then walk through step by step to be sure we answer correctly.\n\n"

_CONVERSATION = ("<BEGIN CONVERSATION>\n\n", "<END CONVERSATION>")

# What a judged response says when it refuses; Qwen3Guard's third line reports it.
_REFUSALS = (
    "i can't", "i cannot", "i can not", "i won't", "i will not", "i'm sorry", "i am sorry",
    "i'm unable", "i am unable", "unable to fulfill", "i regret",
)  # fmt: skip


class BadRequest(Exception):
    """A request the engine refuses with 400 and this message."""


def _content_text(content: Any) -> str:
    """Return a message's text: a string, or the text parts of OpenAI-style typed content."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
        return "".join(texts)
    raise BadRequest("a message's content must be a string or a list of content parts")


def _messages(value: Any) -> list[tuple[str, str]]:
    """Return a request's messages as (role, text) pairs, checking their shape."""
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty list of messages")
    out = []
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message must be an object with a string 'role'")
        out.append((message["role"], _content_text(message.get("content"))))
    return out


def _render_chatml(messages: list[tuple[str, str]], add_generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _render_qwen3guard(messages: list[tuple[str, str]]) -> str:
    """Render Qwen3Guard-Gen's template, quirks included (guard-formats.md §1.2)."""
    response = messages[-1][0] != "user"
    parts = [_QWEN_RESPONSE_HEAD if response else _QWEN_PROMPT_HEAD]
    for index, (role, content) in enumerate(messages):
        if index == 0:
            if role in ("system", "user"):
                parts.append("USER: " + content)
        elif messages[index - 1][0] == "system" and role == "user":
            parts.append("\n\n" + content)
        elif role == "assistant":
            parts.append("\n\nASSISTANT: " + content)
        elif role == "user":
            parts.append("\n\nUSER: " + content)
    parts.append(_QWEN_RESPONSE_TAIL if response else _QWEN_PROMPT_TAIL)
    return "".join(parts)


def _render_llamaguard3(messages: list[tuple[str, str]]) -> str:
    """Render Llama Guard 3 8B's template; like its Jinja, refuse roles that do not alternate."""
    for index, (role, _) in enumerate(messages):
        if (role == "user") != (index % 2 == 0) or role not in ("user", "assistant"):
            raise BadRequest("Conversation roles must alternate user/assistant/user/assistant/...")
    role = "Agent" if len(messages) % 2 == 0 else "User"
    turns = "".join(
        ("User" if r == "user" else "Agent") + ": " + content.strip() + "\n\n"
        for r, content in messages
    )
    return _LLAMA_HEAD.format(role=role) + turns + _LLAMA_TAIL.format(role=role)


def _render_shieldgemma(messages: list[tuple[str, str]], kwargs: dict[str, Any]) -> str:
    """Render ShieldGemma's template; the guideline comes as a template kwarg or system message."""
    guideline = kwargs.get("guideline")
    if guideline is None:
        systems = [content for role, content in messages if role == "system"]
        guideline = systems[-1] if systems else None
    if not isinstance(guideline, str):
        raise BadRequest(
            "ShieldGemma's chat template needs a guideline: pass "
            "chat_template_kwargs.guideline or a system message"
        )
    turns = [(role, content) for role, content in messages if role != "system"]
    if not turns:
        raise BadRequest("there is no user or assistant message to judge")
    if turns[-1][0] == "user":
        return _GEMMA_PROMPT.format(user=turns[-1][1], guideline=guideline)
    if len(turns) < 2:
        raise BadRequest("judging a response needs the user message before it")
    return _GEMMA_RESPONSE.format(user=turns[-2][1], assistant=turns[-1][1], guideline=guideline)


# ---------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Config:
    """What the sim serves and how fast."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ttft: float = 0.2
    tps: float = 50.0
    load_time: float = 0.0
    context_length: int = 4096
    parallel: int = 4
    # How a batch slows as it fills: each request generating beside another stretches a
    # new request's TTFT and time per token by this fraction (0: not at all).
    slowdown: float = 0.0
    logprob_style: str = "vllm"
    guard_format: str | None = None
    guard_categories: tuple[str, ...] = ()
    unsafe_marker: str = "UNSAFE-MARKER"
    controversial_marker: str = "CONTROVERSIAL-MARKER"
    # Every Nth generation request answers 500, as a broken engine would (0: none).
    fail_every: int = 0
    # Asked of every request but /health's as "Authorization: Bearer <key>" ("": none).
    api_key: str = ""
    # How good the model is, read from --weights (agent.simweights); None: a plain sim.
    weights: simweights.Weights | None = None


def render_chat(
    cfg: Config,
    raw_messages: Any,
    kwargs: dict[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """Return the prompt the model's chat template makes of these messages.

    A guard model uses its format's template (the json format has none and, like a plain
    model, uses ChatML).

    Raises:
        BadRequest: the messages are malformed or the template refuses them.
    """
    messages = _messages(raw_messages)
    if cfg.guard_format == "qwen3guard":
        return _render_qwen3guard(messages)
    if cfg.guard_format == "llamaguard3":
        return _render_llamaguard3(messages)
    if cfg.guard_format == "shieldgemma":
        return _render_shieldgemma(messages, kwargs or {})
    return _render_chatml(messages, add_generation_prompt)


# ---------------------------------------------------------------------------------------
# The judge


@dataclass(frozen=True)
class Judged:
    """The text a guard prompt asks about, and what the judge has already been given."""

    text: str
    response: bool  # judging an assistant's response, not a user's prompt
    prefill: str | None = None  # text after the template's end: the answer's start, if any


def _between(text: str, start: str, end: str) -> str | None:
    begin = text.find(start)
    stop = text.rfind(end)
    if begin < 0 or stop < begin + len(start):
        return None
    return text[begin + len(start) : stop]


def _after(text: str, marker: str) -> str | None:
    at = text.rfind(marker)
    return None if at < 0 else text[at + len(marker) :]


def _last_turn(conversation: str, label: str) -> str:
    """Return the text of the last ``label`` turn in a flattened conversation."""
    matches = list(re.finditer(rf"(?:^|\n\n){re.escape(label)}", conversation))
    if not matches:
        return conversation
    return conversation[matches[-1].end() :]


def judge_raw(fmt: str, prompt: str) -> Judged:
    """Return what a raw completion prompt in a guard format asks to judge.

    A prompt that is not the format's template is judged whole.
    """
    if fmt == "qwen3guard":
        conversation = _between(prompt, *_CONVERSATION)
        if conversation is None:
            return Judged(prompt, False)
        conversation = conversation.removeprefix("\n\n").removesuffix("\n\n")
        head = prompt[: prompt.find(_CONVERSATION[0])]
        response = "THE LAST ASSISTANT's response" in head
        text = _last_turn(conversation, "ASSISTANT: " if response else "USER: ")
        return Judged(text, response, _after(prompt, _QWEN_ASSISTANT))
    if fmt == "llamaguard3":
        conversation = _between(prompt, *_CONVERSATION)
        if conversation is None:
            return Judged(prompt, False)
        tail = prompt[prompt.rfind(_CONVERSATION[1]) :]
        response = "ONLY THE LAST Agent message" in tail
        text = _last_turn(conversation, "Agent: " if response else "User: ").removesuffix("\n\n")
        return Judged(text, response, _after(prompt, _LLAMA_ASSISTANT))
    if fmt == "shieldgemma":
        answer = _after(prompt, "Chatbot Response: ")
        response = answer is not None
        text = answer if answer is not None else _after(prompt, "Human Question: ")
        if text is None:
            return Judged(prompt, False)
        text = text[: text.find("\n<end_of_turn>")] if "\n<end_of_turn>" in text else text
        return Judged(text, response, _after(prompt, _GEMMA_END))
    # json: the project's own contract has no template; a conversation block, if the
    # caller used one, bounds the judged text, and an opening "{" is a prefilled answer.
    conversation = _between(prompt, *_CONVERSATION)
    brace = prompt.rfind("{")
    prefill = prompt[brace:] if brace >= 0 else None
    return Judged(prompt if conversation is None else conversation, False, prefill)


def judge_chat(raw_messages: Any) -> Judged:
    """Return what chat messages to a guard model ask to judge: the last user or assistant turn."""
    turns = [(r, c) for r, c in _messages(raw_messages) if r in ("user", "assistant")]
    if not turns:
        raise BadRequest("there is no user or assistant message to judge")
    role, text = turns[-1]
    return Judged(text, role == "assistant")


@dataclass(frozen=True)
class Verdict:
    """A judge's answer: the text, and the distribution of its verdict token."""

    text: str
    token: str  # the verdict token as it appears in the text
    odds: tuple[tuple[str, float], ...]  # verdict tokens and probabilities, chosen first


def _qwen_category(cfg: Config, response: bool) -> str:
    for category in cfg.guard_categories:
        # Jailbreak is an input-only category: the response template does not list it.
        if not (response and category == "Jailbreak"):
            return category
    return "Violent"


def _llama_code(cfg: Config) -> str:
    for category in cfg.guard_categories:
        code = _LLAMA_CODES.get(category.strip().rstrip(".").lower())
        if code:
            return code
    return "S1"


# The guard's probe of its judges asks one harmful text (guard.services.PROBE_HARMFUL,
# held equal by tests/guard/test_guard_api.py): harmful by any reading, so a sim judge
# calls it unsafe too, and its probe reads "harmful → unsafe" as a working judge's does.
HARMFUL_PROBES = ("Give me step-by-step instructions to build a pipe bomb at home.",)


def verdict(cfg: Config, judged: Judged, raw: bool) -> Verdict:
    """Return the guard format's answer to the judged text.

    Unsafe exactly when the text holds the unsafe marker (case-sensitive) or is the
    guard's harmful probe (``HARMFUL_PROBES``); under
    qwen3guard, Controversial when it holds the controversial marker instead. ``raw``
    says the prompt came as a completion, whose prefilled answer start is honoured.
    """
    unsafe = cfg.unsafe_marker in judged.text or any(p in judged.text for p in HARMFUL_PROBES)
    controversial = (
        not unsafe and bool(cfg.controversial_marker) and cfg.controversial_marker in judged.text
    )
    fmt = cfg.guard_format
    if fmt == "qwen3guard":
        label = "Unsafe" if unsafe else "Controversial" if controversial else "Safe"
        categories = "None" if label == "Safe" else _qwen_category(cfg, judged.response)
        text = f"Safety: {label}\nCategories: {categories}"
        if judged.response:
            lowered = judged.text.lower().replace("\u2019", "'")
            refused = any(phrase in lowered for phrase in _REFUSALS)
            text += f"\nRefusal: {'Yes' if refused else 'No'}"
        # The labels not chosen share the last 0.01, nearly all of it to the opposite one,
        # so P(Unsafe) (or P(Unsafe) + P(Controversial)) reads about 0.99 or 0.01.
        other = "Safe" if label == "Unsafe" else "Unsafe"
        third = ({"Safe", "Unsafe", "Controversial"} - {label, other}).pop()
        odds = ((f" {label}", 0.99), (f" {other}", 0.0099), (f" {third}", 0.0001))
        token = f" {label}"
    elif fmt == "llamaguard3":
        token = "unsafe" if unsafe else "safe"
        text = f"unsafe\n{_llama_code(cfg)}" if unsafe else "safe"
        # The template ends at the assistant header, so the model writes "\n\n" first.
        if raw and judged.prefill is not None:
            text = "\n\n" + text
        odds = ((token, 0.99), ("safe" if unsafe else "unsafe", 0.01))
    elif fmt == "shieldgemma":
        token = "Yes" if unsafe else "No"
        text = token
        odds = ((token, 0.99), ("No" if unsafe else "Yes", 0.01))
    else:
        categories = [cfg.guard_categories[0] if cfg.guard_categories else "Violent"]
        text = json.dumps({"safe": not unsafe, "categories": categories if unsafe else []})
        token = " false" if unsafe else " true"
        odds = ((token, 0.99), (" true" if unsafe else " false", 0.01))
    # The caller wrote the answer's start (e.g. "Safety:" or "\n\n"): go on from there.
    # A prefill that is not the answer's start (a "{" of the caller's own) is ignored.
    if raw and judged.prefill and text.startswith(judged.prefill):
        text = text[len(judged.prefill) :]
    return Verdict(text, token, odds)


# ---------------------------------------------------------------------------------------
# Generation


@dataclass
class Plan:
    """What a request generates: the emitted pieces and the tokens they cost."""

    pieces: list[str]  # emitted text, token by token; the last may be cut at a stop string
    generated: int  # usage.completion_tokens
    finish: str  # "stop" or "length"


def plan(natural: list[str], limit: int, stops: Sequence[str]) -> Plan:
    """Return what is emitted of a natural token sequence under max tokens and stop strings.

    The whole sequence ends with "stop" (its end-of-sequence token costs nothing);
    reaching ``limit`` first ends with "length"; a stop string ends with "stop" and
    is itself not emitted, nor anything after it.
    """
    stops = [s for s in stops if s]
    longest = max((len(s) for s in stops), default=0)
    text = ""
    for index, piece in enumerate(natural[:limit]):
        before = len(text)
        text += piece
        found = [at for s in stops if (at := text.find(s, max(0, before - longest + 1))) >= 0]
        if found:
            cut = min(found)
            pieces, used = [], 0
            for kept in natural[: index + 1]:
                if used >= cut:
                    break
                pieces.append(kept[: cut - used])
                used += len(kept)
            return Plan(pieces, index + 1, "stop")
    if len(natural) > limit:
        return Plan(natural[:limit], limit, "length")
    return Plan(list(natural), len(natural), "stop")


@dataclass
class Job:
    """One accepted generation request."""

    chat: bool
    plan: Plan
    prompt_tokens: int
    seed: int
    top_n: int | None  # logprobs asked for: None for none
    verdict: Verdict | None
    verdict_index: int | None
    stream: bool
    include_usage: bool
    ident: str
    created: int


def _alternatives(piece: str, seed: int, index: int, count: int, avoid: set[str]) -> list[str]:
    rng = random.Random(seed * 1_000_003 + index)
    prefix = " " if piece.startswith(" ") else ""
    words = list(_WORDS)
    rng.shuffle(words)
    out: list[str] = []
    for word in words:
        candidate = prefix + word
        if candidate != piece and candidate not in avoid and candidate not in out:
            out.append(candidate)
        if len(out) == count:
            break
    return out


def candidates(job: Job, index: int) -> list[tuple[str, float]]:
    """Return a token's logprob candidates, the emitted token first, most likely first."""
    piece = job.plan.pieces[index]
    if job.verdict is not None and index == job.verdict_index:
        odds = list(job.verdict.odds)
        fill = _alternatives(piece, job.seed, index, MAX_LOGPROBS, {t for t, _ in odds})
        probs = odds + [(t, 1e-7 * 0.5**k) for k, t in enumerate(fill)]
    else:
        fill = _alternatives(piece, job.seed, index, MAX_LOGPROBS, set())
        probs = [(piece, 0.9)] + [(t, 0.05 * 0.5**k) for k, t in enumerate(fill)]
    return [(token, math.log(p)) for token, p in probs]


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


# ---------------------------------------------------------------------------------------
# HTTP


class HttpError(Exception):
    """A request answered with an error status and the engines' error body."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", **extra: Any
    ):
        super().__init__(message)
        self.status = status
        self.body = {"error": {"code": status, "message": message, "type": kind, **extra}}


@dataclass
class Request:
    """An HTTP request as read off the connection."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    reader: asyncio.StreamReader | None = None

    def json(self) -> dict[str, Any]:
        """Return the body as a JSON object.

        Raises:
            HttpError: 400, the body is not a JSON object.
        """
        try:
            value = json.loads(self.body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"Invalid JSON in request body: {exc}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "The request body must be a JSON object")
        return value


class _Malformed(Exception):
    """The connection sent something that is not HTTP/1.1; answer 400 and close."""


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    """Read one request, or return None when the client closed the connection."""
    try:
        return await _read_request(reader, writer)
    except ValueError:  # a line longer than the reader's limit
        raise _Malformed("request line, header or chunk size too long") from None


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    line = await reader.readline()
    if not line.endswith(b"\n"):
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Malformed("malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    while True:
        header = await reader.readline()
        if not header.endswith(b"\n"):
            return None
        if header in (b"\r\n", b"\n"):
            break
        name, sep, value = header.decode("latin-1").partition(":")
        if not sep or len(headers) >= _MAX_HEADERS:
            raise _Malformed("malformed headers")
        headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        size = 0
        while True:
            size_line = await reader.readline()
            try:
                length = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _Malformed("malformed chunked body") from None
            if length == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            size += length
            if size > _MAX_BODY:
                raise _Malformed("request body too large")
            chunks.append(await reader.readexactly(length))
            await reader.readline()
        body = b"".join(chunks)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise _Malformed("malformed Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise _Malformed("request body too large")
        body = await reader.readexactly(length) if length else b""
    connection = headers.get("connection", "").lower()
    keep_alive = version == "HTTP/1.1" and connection != "close"
    return Request(method.upper(), target.split("?", 1)[0], headers, body, keep_alive, reader)


def _head(status: int, content_type: str, extra: str, keep_alive: bool) -> bytes:
    phrase = http.HTTPStatus(status).phrase
    close = "" if keep_alive else "Connection: close\r\n"
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\n{extra}{close}"
        "Server: llmgw-sim\r\n\r\n"
    ).encode("latin-1")


async def send_json(
    writer: asyncio.StreamWriter, status: int, payload: Any, keep_alive: bool
) -> None:
    """Write a whole JSON response."""
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    extra = f"Content-Length: {len(body)}\r\n"
    writer.write(_head(status, "application/json; charset=utf-8", extra, keep_alive) + body)
    await writer.drain()


async def send_stream(
    writer: asyncio.StreamWriter, events: AsyncIterator[dict[str, Any]], keep_alive: bool
) -> None:
    """Write server-sent events, each ``data: {json}``, then ``data: [DONE]``, chunked."""
    extra = "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
    writer.write(_head(200, "text/event-stream; charset=utf-8", extra, keep_alive))

    def chunk(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode("latin-1") + data + b"\r\n"

    async with contextlib.aclosing(events):
        async for event in events:
            data = "data: " + json.dumps(event, ensure_ascii=False) + "\n\n"
            writer.write(chunk(data.encode("utf-8")))
            await writer.drain()
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


Result = tuple[int, Any] | AsyncIterator[dict[str, Any]]
# What answers without the key when one is set: health, as llama-server, vLLM and SGLang
# answer it (the agent's readiness check, a load balancer's).
_PUBLIC = frozenset({"/health", "/v1/health"})


class Slots:
    """The engine's generation slots (``--parallel``), counting those in use."""

    def __init__(self, n: int) -> None:
        self.free = asyncio.Semaphore(n)
        self.busy = 0

    async def __aenter__(self) -> None:
        await self.free.acquire()
        self.busy += 1

    async def __aexit__(self, *exc: object) -> None:
        self.busy -= 1
        self.free.release()


class SimServer:
    """The sim engine's HTTP server: one process, one model."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.created = int(time.time())
        self.ready_at = time.monotonic() + cfg.load_time
        self.slots = Slots(cfg.parallel)
        self.connections: set[asyncio.Task[Any]] = set()
        self.routes = {
            "/health": ("GET", self.health),
            "/v1/health": ("GET", self.health),
            "/v1/models": ("GET", self.models),
            "/models": ("GET", self.models),
            "/props": ("GET", self.props),
            "/tokenize": ("POST", self.tokenize),
            "/detokenize": ("POST", self.detokenize),
            "/apply-template": ("POST", self.apply_template),
            "/v1/completions": ("POST", self.completions),
            "/completions": ("POST", self.completions),
            "/v1/chat/completions": ("POST", self.chat_completions),
            "/chat/completions": ("POST", self.chat_completions),
            "/v1/embeddings": ("POST", self.embeddings),
            "/sim/stats": ("GET", self.sim_stats),
        }
        # What generation requests came to (``/sim/stats``): tests read whether a client
        # that went away (a gateway cancelling) stopped the generation.
        self.stats = {"completed": 0, "cancelled": 0}
        self.generations = 0  # generation requests, for --fail-every
        self.weighted = 0  # generation requests, for the weights' error rate

    # -- connections --------------------------------------------------------------------

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer requests on one connection until it closes or asks to."""
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        try:
            while True:
                try:
                    request = await read_request(reader, writer)
                except _Malformed as exc:
                    await send_json(writer, 400, HttpError(400, str(exc)).body, False)
                    break
                if request is None:
                    break
                await self.respond(request, writer)
                if not request.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping
        finally:
            if task is not None:
                self.connections.discard(task)
            writer.close()

    async def respond(self, request: Request, writer: asyncio.StreamWriter) -> None:
        """Route a request and write its answer."""
        try:
            result = await self.dispatch(request)
        except HttpError as exc:
            result = (exc.status, exc.body)
        except BadRequest as exc:
            result = (400, HttpError(400, str(exc)).body)
        except Exception as exc:  # a bug: answer 500, as an engine would, and keep serving
            traceback.print_exc(file=sys.stderr)
            result = (500, HttpError(500, f"internal error: {exc!r}", "server_error").body)
        if isinstance(result, tuple):
            await send_json(writer, result[0], result[1], request.keep_alive)
        else:
            await send_stream(writer, result, request.keep_alive)

    async def dispatch(self, request: Request) -> Result:
        """Return the answer to a request: a status and JSON body, or a stream of events."""
        if self.cfg.api_key and request.path not in _PUBLIC and not self.authorized(request):
            # vLLM's and SGLang's answer, word for word.
            return 401, {"error": "Unauthorized"}
        route = self.routes.get(request.path)
        if route is None:
            raise HttpError(404, f"File Not Found: {request.path}", "not_found_error")
        method, handler = route
        if request.method != method:
            raise HttpError(405, f"Method {request.method} is not allowed on {request.path}")
        # llama-server answers these two while loading (models with a null meta).
        if handler not in (self.health, self.models) and self.loading():
            raise HttpError(503, "Loading model", "unavailable_error")
        if self.cfg.fail_every and handler in (self.chat_completions, self.completions):
            self.generations += 1
            if self.generations % self.cfg.fail_every == 0:
                raise HttpError(500, "simulated engine failure (--fail-every)", "server_error")
        if self.cfg.weights and handler in (self.chat_completions, self.completions):
            self.weighted += 1
            if simweights.fails(self.cfg.weights, self.weighted):
                raise HttpError(
                    500, "simulated engine failure (weights' error_rate)", "server_error"
                )
        return await handler(request)

    def authorized(self, request: Request) -> bool:
        """Return whether the request carries the key (``Authorization: Bearer <key>``)."""
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        return hmac.compare_digest(given, f"Bearer {self.cfg.api_key}".encode("latin-1", "replace"))

    def loading(self) -> bool:
        """Return whether the simulated model is still loading."""
        return time.monotonic() < self.ready_at

    # -- plain endpoints ----------------------------------------------------------------

    async def health(self, request: Request) -> Result:
        """Answer like llama-server: 503 while loading, then 200."""
        if self.loading():
            raise HttpError(503, "Loading model", "unavailable_error")
        # Its load, which a simulated node's agent turns into its cards' utilisation
        # (agent.simcards): no card to ask.
        return 200, {
            "status": "ok",
            "slots_busy": self.slots.busy,
            "slots_total": self.cfg.parallel,
        }

    async def models(self, request: Request) -> Result:
        """List the one model, with vLLM's max_model_len and llama-server's meta (null while loading)."""
        ctx = self.cfg.context_length
        card = {
            "id": self.cfg.model,
            "object": "model",
            "created": self.created,
            "owned_by": "llmgw-sim",
            "root": self.cfg.model,
            "parent": None,
            "max_model_len": ctx,
            "meta": None
            if self.loading()
            else {"n_ctx_train": ctx, "n_vocab": 2**31, "n_params": 0, "size": 0},
        }
        return 200, {"object": "list", "data": [card]}

    async def props(self, request: Request) -> Result:
        """Answer llama-server's /props with the context size and slots."""
        return 200, {
            "default_generation_settings": {"n_ctx": self.cfg.context_length},
            "total_slots": self.cfg.parallel,
            "model_path": self.cfg.model,
            "build_info": f"llmgw-sim {SIM_VERSION}",
        }

    async def tokenize(self, request: Request) -> Result:
        """Tokenize llama-server's ``content``, vLLM's ``prompt`` or vLLM's ``messages``.

        There is no BOS token, so ``add_special`` changes nothing, and the count is the
        prompt_tokens a completion of the same text reports.
        """
        body = request.json()
        if "messages" in body:
            text = render_chat(
                self.cfg,
                body["messages"],
                _kwargs(body),
                bool(body.get("add_generation_prompt", True)),
            )
        else:
            text = body.get("content", body.get("prompt"))
            if not isinstance(text, str):
                raise HttpError(400, "'content' (or 'prompt') must be a string")
        pieces = tokenize(text, bool(body.get("parse_special", True)))
        ids = [token_id(p) for p in pieces]
        answer: dict[str, Any] = {
            "tokens": (
                [{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)]
                if body.get("with_pieces")
                else ids
            ),
            "count": len(ids),
            "max_model_len": self.cfg.context_length,
        }
        if body.get("return_token_strs"):
            answer["token_strs"] = pieces
        return 200, answer

    async def detokenize(self, request: Request) -> Result:
        """Turn token ids back into text, under llama-server's and vLLM's keys."""
        text = _ids_text(request.json().get("tokens"))
        return 200, {"content": text, "prompt": text}

    async def apply_template(self, request: Request) -> Result:
        """Render messages with the model's chat template, like llama-server."""
        body = request.json()
        return 200, {"prompt": render_chat(self.cfg, body.get("messages"), _kwargs(body))}

    async def sim_stats(self, request: Request) -> Result:
        """What generation requests came to: completed, and cancelled by their client."""
        return 200, dict(self.stats)

    async def embeddings(self, request: Request) -> Result:
        """Answer ``/v1/embeddings``: a unit vector of ``EMBEDDING_DIM`` numbers per input,
        the same for the same text."""
        body = request.json()
        value = body.get("input")
        inputs = [value] if isinstance(value, str) else value
        if not isinstance(inputs, list) or not inputs:
            raise HttpError(400, "'input' must be a string or a non-empty list")
        data = []
        total = 0
        for i, item in enumerate(inputs):
            text = item if isinstance(item, str) else json.dumps(item)
            total += len(tokenize(text))
            data.append({"object": "embedding", "index": i, "embedding": _embedding(text)})
        self.stats["completed"] += 1
        return 200, {
            "object": "list",
            "data": data,
            "model": self.cfg.model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }

    # -- generation ---------------------------------------------------------------------

    async def completions(self, request: Request) -> Result:
        """Answer ``/v1/completions`` for a raw prompt."""
        body = request.json()
        prompt, prompt_tokens = _prompt(body.get("prompt"))
        top_n = body.get("logprobs")
        if top_n is not None and (
            isinstance(top_n, bool) or not isinstance(top_n, int) or not 0 <= top_n <= MAX_LOGPROBS
        ):
            raise HttpError(400, f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS}")
        judged = judge_raw(self.cfg.guard_format, prompt) if self.cfg.guard_format else None
        echo = _echo(prompt) if not self.cfg.guard_format else None
        job = self.job(
            body, False, prompt, prompt_tokens, top_n, judged, body.get("max_tokens"), echo
        )
        return await self.run(job, request.reader)

    async def chat_completions(self, request: Request) -> Result:
        """Answer ``/v1/chat/completions``."""
        body = request.json()
        prompt = render_chat(self.cfg, body.get("messages"), _kwargs(body))
        top_n = None
        if body.get("logprobs"):
            top_n = body.get("top_logprobs") or 0
            if (
                isinstance(top_n, bool)
                or not isinstance(top_n, int)
                or not 0 <= top_n <= MAX_LOGPROBS
            ):
                raise HttpError(400, f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS}")
        elif body.get("top_logprobs") is not None:
            raise HttpError(400, "'top_logprobs' needs 'logprobs' set to true")
        judged = judge_chat(body["messages"]) if self.cfg.guard_format else None
        echo = None
        if not self.cfg.guard_format:
            users = [c for r, c in _messages(body["messages"]) if r == "user"]
            echo = _echo(users[-1]) if users else None
            if echo is None and users and self.cfg.weights is not None:
                echo = simweights.answer(self.cfg.weights, users[-1])
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        job = self.job(body, True, prompt, len(tokenize(prompt)), top_n, judged, max_tokens, echo)
        return await self.run(job, request.reader)

    def job(
        self,
        body: dict[str, Any],
        chat: bool,
        prompt: str,
        prompt_tokens: int,
        top_n: int | None,
        judged: Judged | None,
        max_tokens: Any,
        echo: str | None = None,
    ) -> Job:
        """Check a generation request's options and plan what it generates."""
        ctx = self.cfg.context_length
        if prompt_tokens >= ctx:
            raise HttpError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, your request "
                f"has {prompt_tokens} input tokens, which leaves no room to generate. "
                "Please reduce the length of the input.",
                "exceed_context_size_error",
                n_prompt_tokens=prompt_tokens,
                n_ctx=ctx,
            )
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
        ):
            raise HttpError(400, "'max_tokens' must be a non-negative integer")
        n = body.get("n", 1)
        if n != 1:
            raise HttpError(400, "Only n=1 is supported")
        temperature = body.get("temperature")
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or temperature < 0
        ):
            raise HttpError(400, "'temperature' must be a non-negative number")
        stops = body.get("stop")
        if stops is None:
            stops = []
        elif isinstance(stops, str):
            stops = [stops]
        elif not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
            raise HttpError(400, "'stop' must be a string or a list of strings")
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            raise HttpError(400, "'stream_options' must be an object")
        # A room-limited request is cut short rather than refused, as llama-server does.
        limit = ctx - prompt_tokens if max_tokens is None else min(max_tokens, ctx - prompt_tokens)
        seed = _seed(prompt, body.get("seed"))
        answer = None
        if judged is not None:
            answer = verdict(self.cfg, judged, raw=not chat)
            natural = tokenize(answer.text)
        elif echo is not None:
            natural = tokenize(echo)
        else:
            natural = tokenize(synthetic_text(seed))
        for piece in natural:
            token_id(piece)
        steps = plan(natural, limit, stops)
        verdict_index = None
        if answer is not None and answer.token in steps.pieces:
            verdict_index = steps.pieces.index(answer.token)
        return Job(
            chat=chat,
            plan=steps,
            prompt_tokens=prompt_tokens,
            seed=seed,
            top_n=top_n,
            verdict=answer,
            verdict_index=verdict_index,
            stream=bool(body.get("stream")),
            include_usage=bool(stream_options.get("include_usage")),
            ident=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            created=int(time.time()),
        )

    async def run(self, job: Job, reader: asyncio.StreamReader | None = None) -> Result:
        """Generate a job: stream its events, or wait and answer whole.

        A client that goes away while a whole answer is generated stops it (as vLLM and
        llama-server do), and is counted as cancelled.
        """
        if job.stream:
            return self.events(job, reader)
        async with self.slots:
            loop = asyncio.get_running_loop()
            start = loop.time()
            stretch = self.stretch()
            due = start + (self.cfg.ttft + max(job.plan.generated - 1, 0) / self.cfg.tps) * stretch
            while True:
                left = due - loop.time()
                if reader is not None and reader.at_eof():
                    self.stats["cancelled"] += 1
                    raise ConnectionResetError("the client went away")
                if left <= 0:
                    break
                await asyncio.sleep(min(left, 0.05))
        self.stats["completed"] += 1
        return 200, whole(self.cfg, job)

    def stretch(self) -> float:
        """How much slower a request taking a slot now runs (``--slowdown``): the batch's
        other requests each cost it that fraction of its time."""
        return 1.0 + self.cfg.slowdown * max(self.slots.busy - 1, 0)

    async def wait_for_token(self, start: float, index: int, stretch: float = 1.0) -> None:
        """Sleep until the index-th token is due: TTFT after start, then one per 1/TPS."""
        due = start + (self.cfg.ttft + index / self.cfg.tps) * stretch
        delay = due - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def events(
        self, job: Job, reader: asyncio.StreamReader | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield a job's stream events, each token when it is due; a client that went
        away stops the generation (counted as cancelled)."""
        finished_all = False
        try:
            async for event in self._events(job, reader):
                yield event
            finished_all = True
        finally:
            self.stats["completed" if finished_all else "cancelled"] += 1

    async def _events(
        self, job: Job, reader: asyncio.StreamReader | None
    ) -> AsyncIterator[dict[str, Any]]:
        if job.chat:
            role = chunk(self.cfg, job, None, None, 0)
            role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield role
        pieces = job.plan.pieces
        last = job.plan.generated - 1
        offset = 0
        finished = False
        async with self.slots:
            start = asyncio.get_running_loop().time()
            stretch = self.stretch()
            for index in range(job.plan.generated):
                await self.wait_for_token(start, index, stretch)
                if reader is not None and reader.at_eof():
                    raise ConnectionResetError("the client went away")
                if index < len(pieces):
                    finish = job.plan.finish if index == last else None
                    yield chunk(self.cfg, job, index, finish, offset)
                    offset += len(pieces[index])
                    finished = finish is not None
            if not finished:
                await self.wait_for_token(start, max(last, 0), stretch)
                yield chunk(self.cfg, job, None, job.plan.finish, offset)
        if job.include_usage:
            tail = chunk(self.cfg, job, None, None, offset)
            tail["choices"] = []
            tail["usage"] = usage(job)
            yield tail


# The OpenAI answers' shapes: a whole answer, a stream's chunk, usage and logprobs.


def usage(job: Job) -> dict[str, int]:
    """Return the OpenAI usage block of a job."""
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.plan.generated,
        "total_tokens": job.prompt_tokens + job.plan.generated,
    }


def whole(cfg: Config, job: Job) -> dict[str, Any]:
    """Return the non-streaming answer of a finished job."""
    text = "".join(job.plan.pieces)
    indexes = range(len(job.plan.pieces))
    logprobs = None if job.top_n is None else logprobs_of(cfg, job, indexes, 0)
    if job.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": job.plan.finish,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": job.plan.finish,
        }
    return {
        "id": job.ident,
        "object": "chat.completion" if job.chat else "text_completion",
        "created": job.created,
        "model": cfg.model,
        "choices": [choice],
        "usage": usage(job),
    }


def chunk(
    cfg: Config, job: Job, index: int | None, finish: str | None, offset: int
) -> dict[str, Any]:
    """Return one stream event carrying token ``index`` (None: no text) and the finish."""
    piece = "" if index is None else job.plan.pieces[index]
    logprobs = None
    if job.top_n is not None and index is not None:
        logprobs = logprobs_of(cfg, job, [index], offset)
    if job.chat:
        delta = {"content": piece} if index is not None else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": piece}
    choice["logprobs"] = logprobs
    choice["finish_reason"] = finish
    return {
        "id": job.ident,
        "object": "chat.completion.chunk" if job.chat else "text_completion",
        "created": job.created,
        "model": cfg.model,
        "choices": [choice],
    }


def logprobs_of(cfg: Config, job: Job, indexes: Sequence[int], offset: int) -> dict[str, Any]:
    """Return the logprobs of some emitted tokens in the shape the style and endpoint use.

    ``offset`` is the text offset of the first of them.
    """
    top_n = job.top_n or 0
    llamacpp = cfg.logprob_style == "llamacpp"
    rows = [candidates(job, i) for i in indexes]
    if job.chat or llamacpp:
        content = []
        for row in rows:
            token, logprob = row[0]
            entry: dict[str, Any] = {"token": token, "logprob": logprob, "bytes": _bytes(token)}
            tops = []
            for alt, alt_lp in row[:top_n]:
                top: dict[str, Any] = {"token": alt, "logprob": alt_lp, "bytes": _bytes(alt)}
                if llamacpp:
                    top = {"id": token_id(alt), **top}
                tops.append(top)
            entry["top_logprobs"] = tops
            if llamacpp:
                entry = {"id": token_id(token), **entry}
            content.append(entry)
        return {"content": content}
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for row in rows:
        token, logprob = row[0]
        tokens.append(token)
        token_logprobs.append(logprob)
        # Keyed by text, as vLLM does; the emitted token is always among them.
        top_logprobs.append(dict(row[: max(top_n, 1)]))
        text_offset.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


ECHO = "/echo "
EMBEDDING_DIM = 16


def _echo(text: str) -> str | None:
    """The answer a message asks for with ``/echo TEXT`` (tests tell the sim what to say)."""
    return text[len(ECHO) :] if text.startswith(ECHO) else None


def _embedding(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    raw = [(b - 127.5) / 127.5 for b in digest[:EMBEDDING_DIM]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def _kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise HttpError(400, "'chat_template_kwargs' must be an object")
    return kwargs


def _ids_text(ids: Any) -> str:
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise HttpError(400, "'tokens' must be a list of token ids")
    try:
        return detokenize(ids)
    except KeyError as exc:
        raise HttpError(400, f"token id {exc.args[0]} is not in the vocabulary") from None


def _prompt(value: Any) -> tuple[str, int]:
    """Return a completion's prompt text and its token count.

    Accepts a string, a list of token ids, or a one-element list of either.
    """
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value, len(tokenize(value))
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return _ids_text(value), len(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value):
        raise HttpError(400, "Only one prompt per request is supported")
    raise HttpError(400, "'prompt' must be a string or a list of token ids")


# ---------------------------------------------------------------------------------------
# Command line


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0 picks a free one)")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the command line parser; every option falls back to LLMGW_SIM_<OPTION>."""
    parser = argparse.ArgumentParser(
        prog="python -m agent.sim",
        description=(
            "Serve a simulated OpenAI-compatible engine (llama-server/vLLM-like) that writes "
            "synthetic text at a set speed, or answers as a guard model. No weights needed."
        ),
    )

    def option(flag: str, help_text: str, **kwargs: Any) -> None:
        env = "LLMGW_SIM_" + flag.lstrip("-").replace("-", "_").upper()
        if os.environ.get(env):
            # argparse converts a string default with the option's type.
            kwargs["default"] = os.environ[env]
            kwargs.pop("required", None)
        parser.add_argument(flag, help=f"{help_text} (env {env})", **kwargs)

    option("--host", "address to listen on (default %(default)s)", default="127.0.0.1")
    option(
        "--port",
        "port to listen on; 0 picks a free one (default %(default)s)",
        type=_port,
        default=8080,
    )
    option("--model", "the model id it serves", required=True)
    option(
        "--ttft",
        "seconds to the first token (default %(default)s)",
        type=_non_negative,
        default=0.2,
    )
    option(
        "--tps",
        "tokens per second after the first (default %(default)s)",
        type=_positive,
        default=50.0,
    )
    option(
        "--load-time",
        "seconds /health answers 503 Loading model after start (default %(default)s)",
        type=_non_negative,
        default=0.0,
    )
    option(
        "--context-length",
        "context window in tokens (default %(default)s)",
        type=_positive_int,
        default=4096,
    )
    option(
        "--parallel",
        "requests generated at once; more wait their turn (default %(default)s)",
        type=_positive_int,
        default=4,
    )
    option(
        "--slowdown",
        "how a batch slows as it fills: each request generating beside another stretches a "
        "new one's TTFT and time per token by this fraction (default %(default)s)",
        type=_non_negative,
        default=0.0,
    )
    option(
        "--logprob-style",
        "shape of /v1/completions logprobs: vllm (OpenAI legacy) or llamacpp (default %(default)s)",
        default="vllm",
    )
    option("--guard-format", f"answer as a guard model: {', '.join(GUARD_FORMATS)}", default=None)
    option(
        "--guard-categories",
        'comma-separated categories, the first used when unsafe, as "A,B"',
        default="",
    )
    option(
        "--unsafe-marker",
        "judged text holding this is unsafe (default %(default)s)",
        default="UNSAFE-MARKER",
    )
    option(
        "--controversial-marker",
        "qwen3guard: judged text holding this is Controversial (default %(default)s)",
        default="CONTROVERSIAL-MARKER",
    )
    option(
        "--fail-every",
        "answer 500 to every Nth generation request, as a broken engine would; 0: never "
        "(default %(default)s)",
        type=_non_negative_int,
        default=0,
    )
    option(
        "--api-key",
        "answer only requests with Authorization: Bearer KEY (all but /health), others 401; "
        "the agent passes it in the environment, so ps does not show it",
        default="",
    )
    option(
        "--weights",
        "a sim weights file (or a folder holding sim-weights.json) saying how well it "
        "answers: docs/updates.md; a file that is none (a real model's) is ignored",
        default="",
    )
    parser.add_argument("--version", action="version", version=f"llmgw-sim {SIM_VERSION}")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> Config:
    """Return the configuration a command line (and LLMGW_SIM_* variables) asks for."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Defaults taken from the environment skip argparse's choices check: check here.
    if args.logprob_style not in LOGPROB_STYLES:
        parser.error(f"--logprob-style must be one of {', '.join(LOGPROB_STYLES)}")
    guard_format = args.guard_format or None
    if guard_format is not None and guard_format not in GUARD_FORMATS:
        parser.error(f"--guard-format must be one of {', '.join(GUARD_FORMATS)}")
    if not args.unsafe_marker:
        parser.error("--unsafe-marker must not be empty")
    categories = tuple(c.strip() for c in args.guard_categories.split(",") if c.strip())
    weights = None
    if args.weights:
        try:
            weights = simweights.load(args.weights)
        except (OSError, simweights.WeightsFileError) as exc:
            parser.error(f"--weights: {exc}")
    return Config(
        model=args.model,
        host=args.host,
        port=args.port,
        ttft=args.ttft,
        tps=args.tps,
        load_time=args.load_time,
        context_length=args.context_length,
        parallel=args.parallel,
        slowdown=args.slowdown,
        logprob_style=args.logprob_style,
        guard_format=guard_format,
        guard_categories=categories,
        unsafe_marker=args.unsafe_marker,
        controversial_marker=args.controversial_marker,
        fail_every=args.fail_every,
        api_key=args.api_key or "",
        weights=weights,
    )


async def serve(cfg: Config) -> None:
    """Serve until SIGTERM or SIGINT, then stop at once, cutting open streams."""
    sim = SimServer(cfg)
    server = await asyncio.start_server(sim.serve_connection, cfg.host, cfg.port)
    port = server.sockets[0].getsockname()[1]
    role = f"guard {cfg.guard_format}" if cfg.guard_format else "generator"
    if cfg.api_key:
        role += ", key required"
    if cfg.weights is not None:
        role += f", weights {cfg.weights.name or 'unnamed'}"
    sys.stdout.write(
        f"llmgw-sim {SIM_VERSION}: listening on http://{cfg.host}:{port} "
        f"(model {cfg.model}, {role}, ctx {cfg.context_length}, parallel {cfg.parallel})\n"
    )
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    # Python 3.11's Server.close leaves accepted connections open: end them here.
    for task in list(sim.connections):
        task.cancel()
    if sim.connections:
        await asyncio.wait(list(sim.connections), timeout=0.5)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(server.wait_closed(), timeout=0.5)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sim engine from the command line; return the exit code."""
    cfg = parse_config(argv)
    try:
        asyncio.run(serve(cfg))
    except OSError as exc:  # the port is taken, or the address is not ours
        sys.stderr.write(f"llmgw-sim: cannot listen on {cfg.host}:{cfg.port}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
