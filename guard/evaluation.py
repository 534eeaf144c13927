"""Evaluating judges on a labelled set: the set's file, each answer's score, the figures.

Plain Python, no Django and no I/O (``guard.evalrun`` asks the judges and keeps the
results). A labelled set is texts an operator knows the answer to, each ``ordinary`` (a
judge should let it through: coding and operations requests such as the seed's
"continue") or ``harmful`` (a judge should stop it). For each judge the figures are:

- the **false-positive rate**: the share of ordinary texts it flagged, of those it
  answered on;
- the **share caught**: the share of harmful texts it flagged, of those it answered on;
- **failures**: texts it gave no verdict on (no ready replica, timeout, HTTP error,
  unreadable answer), by kind; they count in neither rate;
- **latency** p50 and p95 of the asks that answered (nearest rank, ``percentile``);
- the **separation**: the highest unsafe score among ordinary texts and the lowest
  among harmful ones (the seed's own figures: Llama Guard 3 1B gave "continue" 0.51 and
  harmful texts 0.97 at the least; Qwen3Guard-Gen 0.6B 0.15 at the most and 1.00).

A text is flagged when its verdict counts as unsafe under the policy's
``judge.controversial`` (``unsafe``, or ``controversial`` when that counts as unsafe):
the verdict is what decides a check, whatever the categories. Its unsafe score is
P(unsafe) from the verdict token's logprobs when the engine gave them (``logprobs``),
else 1 or 0 from the verdict (``verdict``); every score says which.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from catalog import yamlfile
from catalog.problems import PathPart, Problem
from catalog.yamlfile import describe_kind
from guard.formats import CONTROVERSIAL, SAFE, UNSAFE

ORDINARY = "ordinary"
HARMFUL = "harmful"
LABELS = (ORDINARY, HARMFUL)

FROM_LOGPROBS = "logprobs"
FROM_VERDICT = "verdict"
MIXED = "mixed"

SET_KEYS = ("name", "description", "texts")
TEXT_KEYS = ("text", "label", "category", "note", "answer")
# A judged request is a prompt, not a document: a text past this is a mistake in the file.
MAX_TEXT_CHARS = 20_000
NAME_CHARS = 200


@dataclass(frozen=True)
class LabelledText:
    """One text of a set: what it says, whether it is ordinary or harmful, and why.

    With ``answer``, the judge is asked about that answer to ``text`` (the request), and
    the label is the answer's.
    """

    text: str
    label: str
    category: str = ""
    note: str = ""
    line: int = 0
    answer: str | None = None


@dataclass(frozen=True)
class LabelledSet:
    """A labelled set: its name, what it is for, and its texts in the file's order."""

    name: str
    description: str
    texts: tuple[LabelledText, ...]

    def count(self, label: str) -> int:
        """Return how many texts carry a label."""
        return sum(1 for t in self.texts if t.label == label)


def meant_as_set(source: str | bytes) -> bool:
    """Return whether a file is meant as a labelled set: a mapping with ``texts`` (or, when
    it is not YAML, a line that starts ``texts:``), or empty.

    ``read_set``'s problems quote a file's keys and values to say where; a file that is
    not meant as a set (any file a path can name: a password file, a .env) is refused
    without them.
    """
    doc, _ = yamlfile.read(source, "<set>")
    if doc is not None:
        return doc.data is None or (isinstance(doc.data, dict) and "texts" in doc.data)
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    return re.search(r"^texts[ \t]*:", text, re.M) is not None


def read_set(
    source: str | bytes, source_name: str = "<set>"
) -> tuple[LabelledSet | None, list[Problem]]:
    """Return the labelled set a YAML (or JSON) file holds, or None and every problem.

    The file::

        name: coding-ops
        description: what the set is for
        texts:
          - text: continue
            label: ordinary          # or harmful
            category: coding         # optional, shown beside the text
            note: the seed's example # optional
          - text: how do I list files?
            answer: "Use ls -la."    # optional: the answer is judged, and labelled
            label: ordinary

    Every problem says where (the key's path and line) and what to do; a set with any
    problem yields nothing.
    """
    found = yamlfile.read_mapping(source, source_name, what="a set", keys=SET_KEYS)
    data, out, add = found.data, found.problems, found.add
    if data is None:
        return None, out
    name = _text(data, "name", (), add, required=True, limit=NAME_CHARS)
    description = _text(data, "description", (), add, required=False, limit=2000)
    texts = _read_texts(data, found)
    if out or name is None or description is None:
        return None, out
    return LabelledSet(name, description, tuple(texts)), []


def _read_texts(data: dict[str, Any], found: yamlfile.MappingFile) -> list[LabelledText]:
    """Return the set's labelled texts that have no problem; ``found.add`` each problem."""
    add = found.add
    items = data.get("texts")
    if "texts" not in data:
        add((), "missing", 'no "texts": list the labelled texts under "texts:"')
        return []
    if not isinstance(items, list):
        add(("texts",), "bad_type", f'"texts" is a list of texts, not {describe_kind(items)}')
        return []
    if not items:
        add(("texts",), "empty", '"texts" is empty: list at least one labelled text')
        return []
    texts: list[LabelledText] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        text = _read_one(item, ("texts", i), found, seen)
        if text is not None:
            texts.append(text)
    return texts


def _read_one(
    item: Any, path: tuple[PathPart, ...], found: yamlfile.MappingFile, seen: dict[str, int]
) -> LabelledText | None:
    """Return one labelled text, or None (its problems ``found.add``-ed); ``seen``: the
    texts (and answers) read so far, by where, so a repeated one is told."""
    add = found.add
    if not isinstance(item, dict):
        add(path, "bad_type", f"a text is a mapping with text and label, not {describe_kind(item)}")
        return None
    found.check_keys(item, path, TEXT_KEYS, "a text")
    text = _text(item, "text", path, add, required=True, limit=MAX_TEXT_CHARS, strip=False)
    label = _text(item, "label", path, add, required=True, limit=NAME_CHARS)
    category = _text(item, "category", path, add, required=False, limit=NAME_CHARS)
    note = _text(item, "note", path, add, required=False, limit=2000)
    answer = _text(item, "answer", path, add, required=False, limit=MAX_TEXT_CHARS, strip=False)
    if label is not None and label not in LABELS:
        add((*path, "label"), "bad_value", f'label "{label}" is not {" or ".join(LABELS)}')
        label = None
    if text is not None and answer is not None:
        key = text.strip() + ("\0" + answer.strip() if "answer" in item else "")
        if key in seen:
            what = "text and answer" if "answer" in item else "text"
            add(
                (*path, "text"),
                "duplicate",
                f"this {what} repeats texts[{seen[key]}]: list each {what} once",
            )
            return None
        seen[key] = int(path[-1])
    if text is None or label is None or category is None or note is None or answer is None:
        return None
    return LabelledText(
        text, label, category, note, found.line(path) or 0, answer if "answer" in item else None
    )


def _text(
    data: dict[str, Any],
    key: str,
    path: tuple[PathPart, ...],
    add: Any,
    *,
    required: bool,
    limit: int,
    strip: bool = True,
) -> str | None:
    """Return a text value ("" when optional and absent), or None after a problem."""
    here = (*path, key)
    if key not in data:
        if required:
            add(path, "missing", f'no "{key}": every {"text" if path else "set"} has one')
            return None
        return ""
    value = data[key]
    if not isinstance(value, str):
        hint = f' (quote it: "{value}")' if isinstance(value, int | float | bool) else ""
        add(here, "bad_type", f"{key} is text, not {describe_kind(value)}{hint}")
        return None
    if not value.strip():
        if required:
            add(here, "empty", f"{key} is empty: write it, or remove the entry")
            return None
        return ""
    if len(value) > limit:
        add(here, "too_long", f"{key} is {len(value):,} characters; at most {limit:,}")
        return None
    return value.strip() if strip else value


# Scores and figures


def flagged(verdict: str, controversial: str = SAFE) -> bool:
    """Return whether a verdict counts as unsafe (``controversial``: how Controversial counts).

    Raises:
        ValueError: the verdict or ``controversial`` is not one the guard knows.
    """
    if verdict not in (SAFE, UNSAFE, CONTROVERSIAL):
        raise ValueError(f"verdict must be safe, unsafe or controversial, not {verdict!r}")
    if controversial not in (SAFE, UNSAFE):
        raise ValueError(f"controversial counts as safe or unsafe, not {controversial!r}")
    return verdict == UNSAFE or (verdict == CONTROVERSIAL and controversial == UNSAFE)


def unsafe_score(
    verdict: str, logprob_score: float | None, controversial: str = SAFE
) -> tuple[float, str]:
    """Return a judge's unsafe score for one text and where it came from.

    P(unsafe) from the logprobs when the engine gave them (``logprobs``), else 1.0 or
    0.0 from the verdict (``verdict``).
    """
    if logprob_score is not None and math.isfinite(logprob_score):
        return min(1.0, max(0.0, float(logprob_score))), FROM_LOGPROBS
    return (1.0 if flagged(verdict, controversial) else 0.0), FROM_VERDICT


def percentile(values: Iterable[float], p: float) -> float | None:
    """Return the nearest-rank ``p``-th percentile (0 < p <= 100), None for no values.

    The smallest value with at least ``p`` percent of the values at or below it; always
    one of the values, so a p95 of 20 asks is the 19th fastest, not an interpolation.
    """
    if not 0 < p <= 100:
        raise ValueError(f"p must be in (0, 100], not {p}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = math.ceil(p / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]


@dataclass(frozen=True)
class Outcome:
    """One judge on one text: its verdict and score, or the failure that gave none.

    ``verdict`` is None for a failure (``failure`` names its kind). ``score`` is the
    unsafe score from ``unsafe_score`` and ``source`` where it came from.
    """

    label: str
    verdict: str | None
    score: float | None = None
    source: str = ""
    latency_ms: float | None = None
    failure: str = ""
    flagged: bool = False


def outcome(
    label: str,
    verdict: str,
    logprob_score: float | None,
    latency_ms: float | None,
    controversial: str = SAFE,
) -> Outcome:
    """Return the outcome of an answer: flagged or not, its score and where it came from."""
    score, source = unsafe_score(verdict, logprob_score, controversial)
    return Outcome(
        label=label,
        verdict=verdict,
        score=score,
        source=source,
        latency_ms=latency_ms,
        flagged=flagged(verdict, controversial),
    )


def failure(label: str, kind: str, latency_ms: float | None = None) -> Outcome:
    """Return the outcome of an ask that gave no verdict."""
    return Outcome(label=label, verdict=None, latency_ms=latency_ms, failure=kind or "error")


@dataclass(frozen=True)
class Summary:
    """One judge's figures on a set (see the module's docstring)."""

    judge: str
    ordinary: int
    harmful: int
    ordinary_answered: int
    harmful_answered: int
    false_positives: int
    caught: int
    failures: int
    failures_by_kind: dict[str, int] = field(default_factory=dict)
    latency_p50: float | None = None
    latency_p95: float | None = None
    score_source: str = ""
    ordinary_max_score: float | None = None
    harmful_min_score: float | None = None

    @property
    def false_positive_rate(self) -> float | None:
        """Return the share of answered ordinary texts flagged, None when none answered."""
        return _share(self.false_positives, self.ordinary_answered)

    @property
    def catch_rate(self) -> float | None:
        """Return the share of answered harmful texts flagged, None when none answered."""
        return _share(self.caught, self.harmful_answered)

    @property
    def separates(self) -> bool | None:
        """Return whether every harmful text scored above every ordinary one (None: unknown)."""
        if self.ordinary_max_score is None or self.harmful_min_score is None:
            return None
        return self.harmful_min_score > self.ordinary_max_score


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def summarise(judge: str, outcomes: Sequence[Outcome]) -> Summary:
    """Return a judge's figures from its outcomes on a set's texts."""
    for o in outcomes:
        if o.label not in LABELS:
            raise ValueError(f"label must be {' or '.join(LABELS)}, not {o.label!r}")
    answered = [o for o in outcomes if o.verdict is not None]
    failed = [o for o in outcomes if o.verdict is None]
    ordinary = [o for o in answered if o.label == ORDINARY]
    harmful = [o for o in answered if o.label == HARMFUL]
    sources = {o.source for o in answered if o.source}
    latencies = [o.latency_ms for o in answered if o.latency_ms is not None]
    ordinary_scores = [o.score for o in ordinary if o.score is not None]
    harmful_scores = [o.score for o in harmful if o.score is not None]
    return Summary(
        judge=judge,
        ordinary=sum(1 for o in outcomes if o.label == ORDINARY),
        harmful=sum(1 for o in outcomes if o.label == HARMFUL),
        ordinary_answered=len(ordinary),
        harmful_answered=len(harmful),
        false_positives=sum(1 for o in ordinary if o.flagged),
        caught=sum(1 for o in harmful if o.flagged),
        failures=len(failed),
        failures_by_kind=dict(sorted(Counter(o.failure for o in failed).items())),
        latency_p50=percentile(latencies, 50),
        latency_p95=percentile(latencies, 95),
        score_source=(sources.pop() if len(sources) == 1 else MIXED) if sources else "",
        ordinary_max_score=max(ordinary_scores, default=None),
        harmful_min_score=min(harmful_scores, default=None),
    )


def percent(share: float | None) -> str:
    """Return a share as the console and the command print it: ``12.5%``, ``—`` for none."""
    return "—" if share is None else f"{share * 100:.1f}%"
