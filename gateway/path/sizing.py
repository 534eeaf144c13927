"""Context length at the door: plain Python, no I/O.

A request whose prompt plus ``max_tokens`` exceeds the model's context length is refused
before a replica is used. Counting tokens exactly needs the engine's tokenizer, so the
bytes decide first:

- every token of a byte-level BPE or SentencePiece vocabulary (with byte fallback) covers
  at least one byte of text, so a prompt has at most as many tokens as bytes, plus what
  the chat template adds around each message (``TEMPLATE_TOKENS``, generous);
- no token covers more than ``MAX_TOKEN_BYTES`` bytes, so it has at least
  bytes / ``MAX_TOKEN_BYTES`` tokens.

``judge`` says ``FITS`` or ``EXCEEDS`` when the bounds settle it, else ``ASK`` (the lead
asks the engine's ``/tokenize``). ``effective_context`` is the context a request really
gets: llama-server divides ``--ctx-size`` across its ``--parallel`` slots.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent import slots

FITS = "fits"
EXCEEDS = "exceeds"
ASK = "ask"

TEMPLATE_TOKENS = 16
TEMPLATE_BASE = 16
MAX_TOKEN_BYTES = 128


def prompt_bounds(prompt_bytes: int, messages: int) -> tuple[int, int]:
    """The least and the most tokens a prompt of this many bytes can hold."""
    low = -(-prompt_bytes // MAX_TOKEN_BYTES) if prompt_bytes else 0
    high = prompt_bytes + TEMPLATE_BASE + TEMPLATE_TOKENS * max(1, messages)
    return low, high


def judge(prompt_bytes: int, messages: int, max_tokens: int, context: int) -> str:
    """Whether prompt plus ``max_tokens`` fits ``context`` (0: no limit known)."""
    if context <= 0:
        return FITS
    low, high = prompt_bounds(prompt_bytes, messages)
    if high + max_tokens <= context:
        return FITS
    if low + max_tokens > context:
        return EXCEEDS
    return ASK


def effective_context(
    context_length: int, args: Sequence[str], engine: str = "llamacpp"
) -> tuple[int, str]:
    """The context one request of a replica gets (``agent.slots``: llama-server's slots)."""
    return slots.effective_context(context_length, args, engine)
