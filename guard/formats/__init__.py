"""Write each judge format's prompt and read its verdict: plain data in, plain data out.

Formats (catalog ``guard.format``, ``catalog.rules.GUARD_FORMATS``): ``qwen3guard``,
``llamaguard3``, ``shieldgemma`` and ``json``. Each is a ``Format`` in ``FORMATS``:

- ``render(request, answer=None, *, categories, variant, for_raw_completion)``: the
  prompt, byte for byte as the model's chat template writes it (or, with
  ``for_raw_completion``, as a raw completion endpoint wants it: no BOS text);
- ``prompts(...)``: every prompt one judgement takes (ShieldGemma: one per policy);
- ``parse(text, *, categories, answer, variant)``: the ``Verdict``, or
  ``UnreadableAnswer`` (a judge failure, not a verdict);
- ``odds(logprobs)`` and ``unsafe_score(logprobs, controversial=...)``: the verdict
  token's probabilities from the answer's logprobs, in any server's shape.

Judged text is neutralised before it is written into a template (``neutralise``).
Everything follows /work/shared/spec/guard-formats.md; nothing here does I/O or imports
Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from guard.formats.base import (
    CONTROVERSIAL,
    SAFE,
    UNSAFE,
    VERDICTS,
    Format,
    Prompt,
    UnreadableAnswer,
    Verdict,
    merge,
)
from guard.formats.injection import neutralise
from guard.formats.json_judge import JSON_DEFAULT_CATEGORIES, JsonJudge, json_schema
from guard.formats.llamaguard3 import LLAMA_GUARD_CATEGORIES, LlamaGuard3
from guard.formats.qwen3guard import (
    QWEN3GUARD_ANSWER_CATEGORIES,
    QWEN3GUARD_CATEGORIES,
    Qwen3Guard,
)
from guard.formats.shieldgemma import (
    SHIELDGEMMA_POLICIES,
    ShieldGemma,
    guideline,
    policy_name,
)

FORMATS: dict[str, Format] = {
    fmt.name: fmt for fmt in (Qwen3Guard(), LlamaGuard3(), ShieldGemma(), JsonJudge())
}


def get(name: str) -> Format:
    """Return the format of this name.

    Raises:
        ValueError: no format has that name (a bad argument, like a bad variant).
    """
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"no guard format {name!r}: one of {', '.join(FORMATS)}") from None


def render(
    fmt: str,
    request: str,
    answer: str | None = None,
    *,
    categories: Sequence[str] | None = None,
    variant: str | None = None,
    for_raw_completion: bool = False,
) -> str:
    """Return format ``fmt``'s prompt about a request, or an answer to it (``Format.render``)."""
    return get(fmt).render(
        request,
        answer,
        categories=categories,
        variant=variant,
        for_raw_completion=for_raw_completion,
    )


def parse(
    fmt: str,
    text: str,
    *,
    categories: Sequence[str] | None = None,
    answer: bool | None = None,
    variant: str | None = None,
) -> Verdict:
    """Return the verdict in a judge's answer in format ``fmt`` (``Format.parse``)."""
    return get(fmt).parse(text, categories=categories, answer=answer, variant=variant)


def reported_categories(
    fmt: str, categories: Sequence[str] | None = None, variant: str | None = None
) -> tuple[str, ...]:
    """Return the category names a judge in format ``fmt`` can put in its verdicts.

    ``categories`` is the judge's own list (the catalog's ``guard.categories``), when it
    has one. Qwen3Guard's names are its own whatever it is given (§1.6); Llama Guard's
    are the given names for its codes, else the model card's (S1-S13 for the 1B, §2.5);
    ShieldGemma's are its policies (Google's four by default); json's the given ones,
    else ``JSON_DEFAULT_CATEGORIES``.

    Raises:
        ValueError: no format has that name.
    """
    get(fmt)
    given = tuple(categories) if categories else None
    if fmt == "qwen3guard":
        return QWEN3GUARD_CATEGORIES
    if fmt == "llamaguard3":
        count = 13 if variant == "1b" else len(LLAMA_GUARD_CATEGORIES)
        cards = tuple(card for _, _, card in LLAMA_GUARD_CATEGORIES)[:count]
        return given[:count] + cards[len(given) :] if given else cards
    if fmt == "shieldgemma":
        return given or tuple(name for name, _, _ in SHIELDGEMMA_POLICIES)
    return given or JSON_DEFAULT_CATEGORIES


def unsafe_score(fmt: str, logprobs: Any, *, controversial: str = SAFE) -> float | None:
    """Return P(unsafe) from an answer's logprobs in format ``fmt`` (``Format.unsafe_score``)."""
    return get(fmt).unsafe_score(logprobs, controversial=controversial)


__all__ = [
    "CONTROVERSIAL",
    "FORMATS",
    "JSON_DEFAULT_CATEGORIES",
    "LLAMA_GUARD_CATEGORIES",
    "QWEN3GUARD_ANSWER_CATEGORIES",
    "QWEN3GUARD_CATEGORIES",
    "SAFE",
    "SHIELDGEMMA_POLICIES",
    "UNSAFE",
    "VERDICTS",
    "Format",
    "JsonJudge",
    "LlamaGuard3",
    "Prompt",
    "Qwen3Guard",
    "ShieldGemma",
    "UnreadableAnswer",
    "Verdict",
    "get",
    "guideline",
    "json_schema",
    "merge",
    "neutralise",
    "parse",
    "policy_name",
    "render",
    "reported_categories",
    "unsafe_score",
]
