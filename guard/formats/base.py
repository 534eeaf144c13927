"""The shapes every judge format shares: the verdict, the refusal to read, the format itself.

Section numbers (§) refer to /work/shared/spec/guard-formats.md.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from guard.formats import logprobs
from guard.formats.injection import neutralise

SAFE = "safe"
UNSAFE = "unsafe"
CONTROVERSIAL = "controversial"
VERDICTS = (SAFE, UNSAFE, CONTROVERSIAL)

# How a Qwen3Guard judge's Controversial counts: the policy's judge.controversial says,
# safe by default (the guard issue); Qwen's own eval counts it unsafe ("strict", §1.6).
CONTROVERSIAL_AS = (SAFE, UNSAFE)


class UnreadableAnswer(ValueError):
    """A judge's answer that is not in its format's grammar: a judge failure, not a verdict."""

    def __init__(self, reason: str, text: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.text = text


@dataclass(frozen=True)
class Verdict:
    """What a judge said.

    ``categories`` are names: Qwen3Guard's own, Llama Guard's S-codes mapped to names,
    ShieldGemma's policy, or the json answer's. ``refusal`` is Qwen3Guard's third line
    when it judged an answer, else None. ``raw`` is the answer as the judge wrote it.
    """

    verdict: str
    categories: tuple[str, ...] = ()
    refusal: bool | None = None
    raw: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, not {self.verdict!r}")

    def is_unsafe(self, controversial: str = SAFE) -> bool:
        """Return whether the verdict blocks, counting Controversial as ``controversial`` says."""
        _check_controversial(controversial)
        return self.verdict == UNSAFE or (self.verdict == CONTROVERSIAL and controversial == UNSAFE)


@dataclass(frozen=True)
class Prompt:
    """One prompt to send a judge, and the ``categories`` to parse its answer with."""

    text: str
    categories: tuple[str, ...] | None


def merge(verdicts: Sequence[Verdict]) -> Verdict:
    """Return one verdict for several answers to the same text (ShieldGemma: one per policy).

    The worst verdict wins (unsafe, then controversial, then safe); categories are joined
    in order without repeats; a refusal anywhere is a refusal.
    """
    if not verdicts:
        raise ValueError("merge needs at least one verdict")
    found = {v.verdict for v in verdicts}
    verdict = next(v for v in (UNSAFE, CONTROVERSIAL, SAFE) if v in found)
    refusals = {v.refusal for v in verdicts} - {None}
    refusal = True if True in refusals else (False if refusals else None)
    categories = dedupe(c for v in verdicts for c in v.categories)
    return Verdict(verdict, categories, refusal, "\n".join(v.raw for v in verdicts))


def dedupe(items: Any) -> tuple[str, ...]:
    """Return the items in order, each once."""
    return tuple(dict.fromkeys(items))


_LINE_BREAKS = re.compile(r"\r\n|\r|\n")


def answer_lines(text: str) -> list[str]:
    """Return an answer's lines, the answer stripped and each line trimmed of spaces and tabs.

    Leading and trailing whitespace of the whole answer is tolerated (Llama Guard's answer
    starts with "\\n\\n", §2.6), and so are \\r\\n line ends; blank lines inside are kept, so
    a grammar that has none refuses them.

    Raises:
        UnreadableAnswer: the answer is empty.
    """
    stripped = text.strip()
    if not stripped:
        raise UnreadableAnswer("the answer is empty", text)
    return [line.strip(" \t") for line in _LINE_BREAKS.split(stripped)]


def split_list(value: str, what: str, text: str) -> tuple[str, ...]:
    """Return a comma-separated list's items, tolerating spaces around the commas.

    The spec leaves the separator unconfirmed beyond "comma" (§1.7, §2.6, §7): split on
    ``,`` and trim.

    Raises:
        UnreadableAnswer: an item is empty (",," or a trailing comma).
    """
    items = tuple(item.strip(" \t") for item in value.split(","))
    if any(not item for item in items):
        raise UnreadableAnswer(f"the {what} list has an empty item: {value!r}", text)
    return items


def as_categories(categories: Sequence[str] | None) -> tuple[str, ...] | None:
    """Return a categories argument as a tuple of strings (None stays None).

    Raises:
        TypeError: it is one string, or holds something other than strings.
    """
    if categories is None:
        return None
    if isinstance(categories, str) or not all(isinstance(c, str) for c in categories):
        raise TypeError("categories must be a list of strings")
    return tuple(categories)


def _check_controversial(controversial: str) -> None:
    if controversial not in CONTROVERSIAL_AS:
        raise ValueError(f"controversial must count as safe or unsafe, not {controversial!r}")


class Format(ABC):
    """A judge format: how its prompt is written and how its answer and logprobs are read.

    One instance per format name lives in ``guard.formats.FORMATS``; instances hold no
    state.
    """

    name: ClassVar[str]
    # Template variants (Llama Guard 3's 1B and 8B differ, §2.5); empty when there is one.
    variants: ClassVar[tuple[str, ...]] = ()
    default_variant: ClassVar[str | None] = None
    # True: render() writes a whole raw-completion prompt. False (json): there is no
    # model template, so render() writes the content of one user message for the chat
    # endpoint, whose server applies the judge model's own template.
    raw_completion: ClassVar[bool] = True
    # Scoring (§1.7, §2.7, §3.4, §4): the answer text before the verdict token, ignoring
    # whitespace, and each verdict token's spelling with the verdict it starts.
    lead: ClassVar[str] = ""
    labels: ClassVar[tuple[tuple[str, str], ...]]

    def render(
        self,
        request: str,
        answer: str | None = None,
        *,
        categories: Sequence[str] | None = None,
        variant: str | None = None,
        for_raw_completion: bool = False,
    ) -> str:
        """Return the prompt that asks the judge about a request, or about an answer to it.

        With ``for_raw_completion`` false the text is byte for byte what the model's chat
        template writes (§1.4, §1.5, §2.4, §2.5, §3.2), BOS text included, so it can be
        compared with a server's ``/apply-template``. With it true it is the text to send
        to a raw completion endpoint (§5.3): without the BOS token's text, which the
        server adds itself to a string prompt (§5.1: twice would be a double BOS), and,
        for Llama Guard, with the "\n\n" the model writes first. The json format has no
        raw form. The request and answer are neutralised first (``neutralise``), so they
        cannot leave their place in the template.

        Raises:
            TypeError: the request or answer is not a string, or categories is one string.
            ValueError: a bad argument (a variant the format lacks; for ShieldGemma, not
                exactly one policy: use ``prompts()`` for several; json with
                ``for_raw_completion``).
        """
        if not isinstance(request, str) or not (answer is None or isinstance(answer, str)):
            raise TypeError("request must be a string and answer a string or None")
        resolved = self.variant(variant)
        text = self._template(
            neutralise(request),
            None if answer is None else neutralise(answer),
            as_categories(categories),
            resolved,
        )
        return self._for_raw_completion(text, resolved) if for_raw_completion else text

    def prompts(
        self,
        request: str,
        answer: str | None = None,
        *,
        categories: Sequence[str] | None = None,
        variant: str | None = None,
        for_raw_completion: bool = False,
    ) -> tuple[Prompt, ...]:
        """Return every prompt one judgement takes: one, or ShieldGemma's one per policy.

        Parse each answer with its prompt's ``categories`` and ``merge`` the verdicts.
        """
        cats = as_categories(categories)
        text = self.render(
            request,
            answer,
            categories=cats,
            variant=variant,
            for_raw_completion=for_raw_completion,
        )
        return (Prompt(text, cats),)

    def variant(self, variant: str | None) -> str | None:
        """Return the template variant to use: the one given (any case), or the default.

        Raises:
            ValueError: the format has no such variant.
        """
        if not self.variants:
            if variant is not None:
                raise ValueError(f"{self.name} has one template; it takes no variant")
            return None
        chosen = (variant or self.default_variant or "").lower()
        if chosen not in self.variants:
            raise ValueError(
                f"{self.name} variant must be one of {', '.join(self.variants)}, not {variant!r}"
            )
        return chosen

    @abstractmethod
    def parse(
        self,
        text: str,
        *,
        categories: Sequence[str] | None = None,
        answer: bool | None = None,
        variant: str | None = None,
    ) -> Verdict:
        """Return the verdict in a judge's answer.

        ``answer`` says whether the prompt judged an answer (True) or a request (False);
        None accepts either shape. A caller that prefilled the start of the answer passes
        the prefill and the completion together.

        Raises:
            UnreadableAnswer: the answer is not in the format's grammar.
        """

    def odds(self, data: Any) -> dict[str, float] | None:
        """Return each verdict's probability from the logprobs of a judge's answer.

        ``data`` is the logprobs in any shape a server returns (see
        ``guard.formats.logprobs``). The probabilities of the verdict token's spellings
        are renormalised over the verdicts (§1.7, §2.7, §3.4); a verdict whose token is
        not among the returned alternatives gets an upper bound of its probability
        (§5.3). None when the verdict token or every verdict's spelling is absent.
        """
        positions = logprobs.positions(data)
        if positions is None:
            return None
        return logprobs.verdict_odds(positions, self.lead, self.labels)

    def unsafe_score(self, data: Any, *, controversial: str = SAFE) -> float | None:
        """Return P(unsafe) from the logprobs of a judge's answer, or None without them.

        Controversial (Qwen3Guard) adds to it when ``controversial`` is "unsafe".
        """
        _check_controversial(controversial)
        odds = self.odds(data)
        if odds is None:
            return None
        score = odds.get(UNSAFE, 0.0)
        if controversial == UNSAFE:
            score += odds.get(CONTROVERSIAL, 0.0)
        return min(1.0, max(0.0, score))

    @abstractmethod
    def _template(
        self,
        request: str,
        answer: str | None,
        categories: tuple[str, ...] | None,
        variant: str | None,
    ) -> str:
        """Return the template's text around the neutralised request and answer."""

    def _for_raw_completion(self, text: str, variant: str | None) -> str:
        """Return the template's text as a raw completion prompt: what the server adds, removed."""
        return text
