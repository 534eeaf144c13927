"""Read the logprobs of a judge's answer, in every shape the servers return them.

Shapes (guard-formats.md §5.1, §5.2; facts.md "Logprob shapes differ"):

- OpenAI legacy, vLLM and llama-cpp-python ``/v1/completions``: ``{"tokens": [...],
  "token_logprobs": [...], "top_logprobs": [{token: logprob}, ...]}``;
- llama-server ``/v1/completions`` and every chat endpoint: ``{"content": [{"token",
  "logprob", "top_logprobs": [{"token", "logprob"}]}]}``, or that list itself;
- llama-server ``/completion``: ``completion_probabilities``, the same entries, with
  ``prob`` / ``top_probs`` instead when ``post_sampling_probs`` is on;
- a whole response body: ``choices[0].logprobs`` is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class Position:
    """One generated token and the logprobs of its alternatives (the token's own included).

    The alternatives are read when first asked for: a score needs them at the verdict
    token only, and an answer runs to tens of tokens with five alternatives each (a
    malformed alternative raises ValueError then).
    """

    __slots__ = ("token", "_alternatives", "_read")

    def __init__(
        self,
        token: str,
        alternatives: Mapping[str, float] | None = None,
        read: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.token = token
        self._alternatives = alternatives
        self._read = read

    @property
    def alternatives(self) -> Mapping[str, float]:
        if self._alternatives is None:
            self._alternatives = self._read() if self._read is not None else {}
        return self._alternatives

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self.token == other.token and self.alternatives == other.alternatives

    def __repr__(self) -> str:
        return f"Position({self.token!r}, {dict(self.alternatives)!r})"


def positions(data: Any) -> list[Position] | None:
    """Return the generated tokens with their alternatives, or None when there are none.

    Raises:
        ValueError: ``data`` is in no shape a server returns (a malformed alternative:
            when that position's alternatives are read).
    """
    if data is None:
        return None
    if isinstance(data, Mapping):
        if "choices" in data:
            choices = data["choices"]
            if not isinstance(choices, Sequence) or not choices:
                return None
            choice = choices[0]
            if not isinstance(choice, Mapping):
                raise ValueError("choices[0] must be an object")
            return positions(choice.get("logprobs"))
        if "completion_probabilities" in data:
            return positions(data["completion_probabilities"])
        if "content" in data:
            # A llama-server /completion body without probabilities has its text here.
            content = data["content"]
            return None if isinstance(content, str) else positions(content)
        if "tokens" in data:
            return _legacy(data)
        raise ValueError("logprobs must hold content, tokens, completion_probabilities or choices")
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return [_entry(entry) for entry in data] or None
    raise ValueError("logprobs must be an object or a list of token entries")


# Rounding in a server's softmax may put a certain token a hair above probability 1.
_ROUNDING = 1e-4


def _logprob(value: Any, probability: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"a logprob must be a number, not {value!r}")
    if probability:
        if not 0.0 <= value <= 1.0 + _ROUNDING:
            raise ValueError(f"a probability must be within 0..1, not {value!r}")
        return math.log(min(value, 1.0)) if value > 0 else -math.inf
    if value > _ROUNDING:
        raise ValueError(f"a logprob must not be positive, not {value!r}")
    return min(float(value), 0.0)


def _token(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a token must be a string, not {value!r}")
    return value


def _add(alternatives: dict[str, float], token: str, logprob: float) -> None:
    # The same text twice (vLLM keys by decoded text; the chosen token is usually among
    # the top ones too) is one token: keep its likeliest reading rather than adding.
    alternatives[token] = max(logprob, alternatives.get(token, -math.inf))


def _entry(entry: Any) -> Position:
    """Return a chat-style token entry (llama-server, chat endpoints) as a position."""
    if not isinstance(entry, Mapping):
        raise ValueError("a token entry must be an object")
    token = _token(entry.get("token"))

    def read() -> dict[str, float]:
        alternatives: dict[str, float] = {}
        for key, top_key, probability in (
            ("logprob", "top_logprobs", False),
            ("prob", "top_probs", True),
        ):
            if key in entry and entry[key] is not None:
                _add(alternatives, token, _logprob(entry[key], probability))
            for top in entry.get(top_key) or ():
                if not isinstance(top, Mapping):
                    raise ValueError(f"each of {top_key} must be an object")
                value = top.get("prob" if probability else "logprob")
                _add(alternatives, _token(top.get("token")), _logprob(value, probability))
        return alternatives

    return Position(token, read=read)


def _legacy(data: Mapping[str, Any]) -> list[Position] | None:
    """Return OpenAI legacy completion logprobs as positions."""
    tokens = data.get("tokens") or []
    chosen = data.get("token_logprobs") or []
    tops = data.get("top_logprobs") or []
    for name, value in (("tokens", tokens), ("token_logprobs", chosen), ("top_logprobs", tops)):
        if not isinstance(value, Sequence) or isinstance(value, str | bytes):
            raise ValueError(f"{name} must be a list")

    def reader(index: int, token: str) -> Callable[[], dict[str, float]]:
        def read() -> dict[str, float]:
            alternatives: dict[str, float] = {}
            if index < len(chosen) and chosen[index] is not None:
                _add(alternatives, token, _logprob(chosen[index]))
            top = tops[index] if index < len(tops) else None
            if top is not None:
                if not isinstance(top, Mapping):
                    raise ValueError("each of top_logprobs must be an object of token: logprob")
                for alternative, value in top.items():
                    _add(alternatives, _token(alternative), _logprob(value))
            return alternatives

        return read

    out = []
    for index, raw in enumerate(tokens):
        token = _token(raw)
        out.append(Position(token, read=reader(index, token)))
    return out or None


_SPACE_RE = re.compile(r"\s+")


def _squeeze(text: str) -> str:
    return _SPACE_RE.sub("", text)


def label_of(token: str, labels: Sequence[tuple[str, str]]) -> str | None:
    """Return the verdict a token starts: the one whose spelling it begins, spaces aside.

    A token may be a verdict word's first piece only (Qwen3's " Cont…" for Controversial,
    §1.7); the spellings of one format start differently, so a piece names one verdict.
    """
    piece = token.strip()
    if not piece:
        return None
    found = {verdict for spelling, verdict in labels if spelling.startswith(piece)}
    return found.pop() if len(found) == 1 else None


def verdict_position(found: Sequence[Position], lead: str) -> int | None:
    """Return the index of the verdict token: the first word after ``lead``.

    ``lead`` is the answer's text before the verdict (Qwen3Guard's "Safety:", §1.7; the
    json shape's '{"safe":', §4), compared without whitespace. When the answer does not
    start with it, the caller prefilled it (§5.3), and the verdict is the first word. An
    empty lead (Llama Guard, whose answer starts with "\\n\\n" (§2.7), and ShieldGemma)
    also means the first word.
    """
    text = "".join(p.token for p in found)
    if lead and _squeeze(text).startswith(lead):
        before = ""
        for index, position in enumerate(found):
            if position.token.strip() and _squeeze(before) == lead:
                return index
            before += position.token
        return None
    for index, position in enumerate(found):
        if position.token.strip():
            return index
    return None


def verdict_odds(
    found: Sequence[Position], lead: str, labels: Sequence[tuple[str, str]]
) -> dict[str, float] | None:
    """Return each verdict's probability at the verdict token, renormalised over the verdicts.

    Spellings of one verdict add up (" Safe" and "Safe"). A verdict none of whose
    spellings was returned gets the most it can have: no more than the least likely
    alternative returned, nor than the probability the returned ones leave (§5.3). None
    when the verdict token is missing or no verdict's spelling is among its alternatives.
    """
    index = verdict_position(found, lead)
    if index is None:
        return None
    alternatives = found[index].alternatives
    verdicts = list(dict.fromkeys(verdict for _, verdict in labels))
    mass = dict.fromkeys(verdicts, 0.0)
    present: set[str] = set()
    for token, logprob in alternatives.items():
        verdict = label_of(token, labels)
        if verdict is not None:
            mass[verdict] += math.exp(logprob)
            present.add(verdict)
    if not present:
        return None
    probabilities = [math.exp(lp) for lp in alternatives.values()]
    bound = max(0.0, min(min(probabilities), 1.0 - sum(probabilities)))
    for verdict in verdicts:
        if verdict not in present:
            mass[verdict] = bound
    total = sum(mass.values())
    if total <= 0.0:
        return None
    return {verdict: mass[verdict] / total for verdict in verdicts}
