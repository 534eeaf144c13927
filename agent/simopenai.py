"""The sim engine's OpenAI answer shapes: a whole answer, a stream's chunk, usage and
logprobs, and the request bodies' parts (prompt, token ids, template kwargs, /echo).

Standard library only; no Django.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.simconfig import MAX_LOGPROBS, Config
from agent.simguard import Verdict
from agent.simhttp import HttpError
from agent.simtext import WORDS, Plan, detokenize, token_id, tokenize


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
    # Tokens of the prompt the prefix cache held (agent.simcache); None: no cache to say.
    cached: int | None = None
    # Tool calls asked by /call (agent.simchat): (id, name, arguments); the plan's pieces
    # are their arguments, call k's first piece at call_starts[k].
    calls: tuple[tuple[str, str, str], ...] = ()
    call_starts: tuple[int, ...] = ()
    # The prompt's tokens, kept in the prefix cache with the answer's once it is served.
    prompt_pieces: tuple[str, ...] = ()

    def call_of(self, index: int) -> int:
        """The tool call a piece of the plan belongs to."""
        k = 0
        while k + 1 < len(self.call_starts) and self.call_starts[k + 1] <= index:
            k += 1
        return k

    def arguments(self) -> list[tuple[tuple[str, str, str], str]]:
        """Each tool call the plan began, with its arguments as far as the plan emitted
        them (a call cut off by max_tokens before its first token is not made)."""
        out = ["" for _ in self.calls]
        for index, piece in enumerate(self.plan.pieces):
            out[self.call_of(index)] += piece
        begun = len(self.plan.pieces)
        return [(c, a) for c, a, s in zip(self.calls, out, self.call_starts, strict=True)
                if s < begun]  # fmt: skip


def _alternatives(piece: str, seed: int, index: int, count: int, avoid: set[str]) -> list[str]:
    rng = random.Random(seed * 1_000_003 + index)
    prefix = " " if piece.startswith(" ") else ""
    words = list(WORDS)
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


# The OpenAI answers' shapes: a whole answer, a stream's chunk, usage and logprobs.


def usage(job: Job) -> dict[str, Any]:
    """Return the OpenAI usage block of a job, with the prompt's cached tokens when the
    sim has a prefix cache (as llama-server and vLLM report them)."""
    out: dict[str, Any] = {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.plan.generated,
        "total_tokens": job.prompt_tokens + job.plan.generated,
    }
    if job.cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": job.cached}
    return out


def finish_reason(job: Job) -> str:
    """A job's finish: a tool call's whole arguments end in "tool_calls"."""
    if job.calls and job.plan.finish == "stop":
        return "tool_calls"
    return job.plan.finish


def whole(cfg: Config, job: Job) -> dict[str, Any]:
    """Return the non-streaming answer of a finished job."""
    text = "".join(job.plan.pieces)
    indexes = range(len(job.plan.pieces))
    logprobs = None if job.top_n is None else logprobs_of(cfg, job, indexes, 0)
    if job.chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if job.calls:
            message["content"] = None
            message["tool_calls"] = [
                {"id": ident, "type": "function", "function": {"name": name, "arguments": args}}
                for (ident, name, _), args in job.arguments()
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(job),
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": job.plan.finish,
        }
    # vLLM's: the stop string the answer stopped at, None for none.
    choice["stop_reason"] = job.plan.matched
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
        delta: dict[str, Any] = {"content": piece} if index is not None else {}
        if job.calls and index is not None:
            k = job.call_of(index)
            call: dict[str, Any] = {"index": k, "function": {"arguments": piece}}
            if index == job.call_starts[k]:
                ident, name, _ = job.calls[k]
                call = {"index": k, "id": ident, "type": "function",
                        "function": {"name": name, "arguments": piece}}  # fmt: skip
            delta = {"tool_calls": [call]}
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": piece}
    choice["logprobs"] = logprobs
    choice["finish_reason"] = finish
    if finish is not None:
        choice["stop_reason"] = job.plan.matched
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


def echo_text(text: str) -> str | None:
    """The answer a message asks for with ``/echo TEXT`` (tests tell the sim what to say)."""
    return text[len(ECHO) :] if text.startswith(ECHO) else None


def embedding_of(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    raw = [(b - 127.5) / 127.5 for b in digest[:EMBEDDING_DIM]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise HttpError(400, "'chat_template_kwargs' must be an object")
    return kwargs


def ids_text(ids: Any) -> str:
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise HttpError(400, "'tokens' must be a list of token ids")
    try:
        return detokenize(ids)
    except KeyError as exc:
        raise HttpError(400, f"token id {exc.args[0]} is not in the vocabulary") from None


def completion_prompt(value: Any) -> tuple[str, int]:
    """Return a completion's prompt text and its token count.

    Accepts a string, a list of token ids, or a one-element list of either.
    """
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value, len(tokenize(value))
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return ids_text(value), len(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str) for v in value):
        raise HttpError(400, "Only one prompt per request is supported")
    raise HttpError(400, "'prompt' must be a string or a list of token ids")


def generation_options(body: dict[str, Any], max_tokens: Any) -> tuple[list[str], dict[str, Any]]:
    """Check a generation request's options; return its stop strings and stream options.

    Raises:
        HttpError: 400 naming the option that is wrong (max_tokens, n, temperature, stop,
            stream_options).
    """
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0
    ):
        raise HttpError(400, "'max_tokens' must be a non-negative integer")
    n = body.get("n", 1)
    if n != 1:
        raise HttpError(400, "Only n=1 is supported")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0
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
    return stops, stream_options
