"""The sim engine's tokenizer, the synthetic text a plain sim model writes, and what a
request emits of it under max tokens and stop strings.

Standard library only; no Django.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

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

WORDS = (
    "the", "model", "answers", "with", "quiet", "steady", "words", "that", "carry", "little",
    "meaning", "across", "a", "long", "line", "of", "tokens", "while", "every", "request",
    "waits", "its", "turn", "in", "queue", "cluster", "keeps", "time", "and", "counts",
    "each", "reply", "simple", "river", "stone", "light", "paper", "window", "signal", "north",
    "orange", "garden", "careful", "engine", "number", "morning", "harbor", "silver",
)  # fmt: skip


def text_seed(*parts: object) -> int:
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
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 11))]
        words[0] = words[0].capitalize()
        sentences.append(" ".join(words) + ".")
        tokens += len(words) + 1
    return " ".join(sentences)


# ---------------------------------------------------------------------------------------
# Generation


@dataclass
class Plan:
    """What a request generates: the emitted pieces and the tokens they cost."""

    pieces: list[str]  # emitted text, token by token; the last may be cut at a stop string
    generated: int  # usage.completion_tokens
    finish: str  # "stop" or "length"
    # The stop string it stopped at (vLLM's choice.stop_reason), None for none.
    matched: str | None = None


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
        found = [(at, s) for s in stops if (at := text.find(s, max(0, before - longest + 1))) >= 0]
        if found:
            cut, matched = min(found, key=lambda pair: pair[0])
            pieces, used = [], 0
            for kept in natural[: index + 1]:
                if used >= cut:
                    break
                pieces.append(kept[: cut - used])
                used += len(kept)
            return Plan(pieces, index + 1, "stop", matched)
    if len(natural) > limit:
        return Plan(natural[:limit], limit, "length")
    return Plan(list(natural), len(natural), "stop")
