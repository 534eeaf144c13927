"""Eval suites: the file, each case's check, the score. Plain Python, no Django, no I/O.

A model's ``eval`` names a suite its new weights must pass before an update goes on
(docs/updates.md). The project carries ``arithmetic`` and ``json-format``
(``updates/evals/suites/``); an operator writes more in ``LLMGW_EVAL_DIR`` in the same
format (``updates.evals.runner`` finds them)::

    name: capitals
    description: what the suite checks
    threshold: 0.8             # the score to pass at when the model's eval.min_score is 0
    cases:
      - id: france             # optional: "case-1", "case-2", ... by position
        prompt: "What is the capital of France? One word."
        exact: Paris           # the answer, trimmed (and a final period dropped), is this
      - prompt: "What is 6 * 7? Answer with the number only."
        number: 42             # the last number in the answer is this
      - prompt: 'Reply with only a JSON object with the keys "city" and "country".'
        json_keys: [city, country]   # the answer is a JSON object with exactly these keys
      - prompt: "Explain what a mutex is."
        rubric: "Explains mutual exclusion correctly and briefly."
        max_tokens: 200        # optional: the answer's budget (default 64)

Each case has a prompt and exactly one check. ``exact``, ``number`` and ``json_keys``
are checked by code here; a ``rubric`` case is graded by a judge (the model's
``eval.judge``, through the guard's judge client): the judge is asked about the answer,
with the rubric beside the prompt, and the case passes when it calls the answer safe.

The score is the share of cases passed, 0 to 1; a case the model gave no answer to (an
error, a timeout) is failed, with why. The gate passes at ``eval.min_score``, or the
suite's ``threshold`` when that is 0.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from catalog import yamlfile
from catalog.problems import PathPart, Problem
from catalog.yamlfile import describe_kind

SUITE_KEYS = ("name", "description", "threshold", "cases")
CHECKS = ("exact", "number", "json_keys", "rubric")
CASE_KEYS = ("id", "prompt", "max_tokens", *CHECKS)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_PROMPT_CHARS = 20_000
MAX_CASES = 1000
MAX_TOKENS = 64
MAX_TOKENS_LIMIT = 4096
DEFAULT_THRESHOLD = 1.0
# What a failed case shows of the answer.
SHOWN_CHARS = 300

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")
_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?```$", re.S)


@dataclass(frozen=True)
class Case:
    """One case: what is asked, and how the answer is checked (one of ``CHECKS``)."""

    id: str
    prompt: str
    check: str
    expected: Any  # the exact text, the number, the list of keys, or the rubric
    max_tokens: int = MAX_TOKENS
    line: int = 0

    @property
    def graded(self) -> bool:
        """Whether a judge grades it (a rubric) rather than code."""
        return self.check == "rubric"


@dataclass(frozen=True)
class Suite:
    """A suite: its name, what it checks, its own threshold, its cases in order."""

    name: str
    description: str
    threshold: float
    cases: tuple[Case, ...]

    @property
    def graded(self) -> bool:
        """Whether any case needs a judge."""
        return any(c.graded for c in self.cases)


@dataclass(frozen=True)
class Result:
    """What one case came to: passed or not, the answer (cut), and why it failed."""

    case: str
    passed: bool
    answer: str = ""
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case, "passed": self.passed, "answer": self.answer, "why": self.why}


def read_suite(
    source: str | bytes, source_name: str = "<suite>"
) -> tuple[Suite | None, list[Problem]]:
    """Return the suite a YAML (or JSON) file holds, or None and every problem.

    Every problem says where (the key's path and line) and what to do; a suite with any
    problem yields nothing.
    """
    found = yamlfile.read_mapping(
        source, source_name, what="a suite", keys=SUITE_KEYS, prefix=f"{source_name}, "
    )
    data, out, add = found.data, found.problems, found.add
    if data is None:
        return None, out
    name = data.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        add(("name",) if "name" in data else (), "bad_name",
            "name is required: letters, digits, '.', '_' and '-', at most 100")  # fmt: skip
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > 2000:
        add(("description",), "bad_type", "description is text of at most 2,000 characters")
    threshold = data.get("threshold", DEFAULT_THRESHOLD)
    if not _fraction(threshold) or threshold == 0:
        add(("threshold",), "bad_value",
            f"threshold is {describe_kind(threshold)}: write the score to pass at, above 0 up to 1")  # fmt: skip
    cases: list[Case] = []
    items = data.get("cases")
    if not isinstance(items, list) or not items:
        add(("cases",) if "cases" in data else (), "missing",
            '"cases" is a list of at least one case (prompt and a check)')  # fmt: skip
        items = []
    elif len(items) > MAX_CASES:
        add(("cases",), "too_many", f"{len(items):,} cases; at most {MAX_CASES:,}")
        items = []
    ids: dict[str, int] = {}
    for i, item in enumerate(items):
        case = _case(item, i, found)
        if case is None:
            continue
        if case.id in ids:
            add(
                ("cases", i, "id"),
                "duplicate",
                f'id "{case.id}" repeats cases[{ids[case.id]}]: give each case its own',
            )
            continue
        ids[case.id] = i
        cases.append(case)
    if out:
        return None, out
    return Suite(str(name), str(description).strip(), float(threshold), tuple(cases)), []


def _case(item: Any, i: int, found: yamlfile.MappingFile) -> Case | None:
    path: tuple[PathPart, ...] = ("cases", i)
    add, line = found.add, found.line(path) or 0
    if not isinstance(item, dict):
        add(
            path,
            "bad_type",
            f"a case is a mapping with prompt and a check, not {describe_kind(item)}",
        )
        return None
    bad = not found.check_keys(item, path, CASE_KEYS, "a case")
    ident = item.get("id", f"case-{i + 1}")
    if not isinstance(ident, str) or not NAME.fullmatch(ident):
        add((*path, "id"), "bad_name", "id is letters, digits, '.', '_' and '-', at most 100")
        bad = True
    prompt = item.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        add((*path, "prompt") if "prompt" in item else path, "bad_prompt",
            f"prompt is required: text of at most {MAX_PROMPT_CHARS:,} characters")  # fmt: skip
        bad = True
    max_tokens = item.get("max_tokens", MAX_TOKENS)
    if (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= MAX_TOKENS_LIMIT
    ):
        add(
            (*path, "max_tokens"),
            "bad_value",
            f"max_tokens is a whole number from 1 to {MAX_TOKENS_LIMIT}",
        )
        bad = True
    checks = [k for k in CHECKS if k in item]
    if len(checks) != 1:
        said = "none" if not checks else ", ".join(checks)
        add(path, "checks", f"a case has exactly one of {', '.join(CHECKS)} (this one: {said})")
        return None
    check = checks[0]
    value = item[check]
    if check in ("exact", "rubric"):
        if not isinstance(value, str) or not value.strip() or len(value) > 2000:
            hint = (
                f' (quote it: "{value}")'
                if isinstance(value, int | float) and not isinstance(value, bool)
                else ""
            )
            add((*path, check), "bad_type", f"{check} is text of 1 to 2,000 characters{hint}")
            return None
        value = value.strip()
    elif check == "number":
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            add((*path, check), "bad_type", f"number is a number, not {describe_kind(value)}")
            return None
    else:
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(k, str) and k for k in value)
            or len(set(value)) != len(value)
        ):
            add(
                (*path, check),
                "bad_type",
                "json_keys is a list of different key names, at least one",
            )
            return None
    if bad:
        return None
    return Case(
        ident, prompt, check, tuple(value) if check == "json_keys" else value, max_tokens, line
    )


def _fraction(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and 0 <= value <= 1
    )


# Checks by code


def shown(answer: str) -> str:
    """Return the part of an answer a failed case shows."""
    return answer if len(answer) <= SHOWN_CHARS else answer[: SHOWN_CHARS - 1] + "…"


def check(case: Case, answer: str) -> Result:
    """Return whether ``answer`` passes ``case`` (not for a rubric: a judge grades those).

    Raises:
        ValueError: the case is a rubric.
    """
    text = answer.strip()
    if case.check == "exact":
        got = text[:-1] if text.endswith(".") and not case.expected.endswith(".") else text
        if got == case.expected:
            return Result(case.id, True, shown(answer))
        return Result(case.id, False, shown(answer), f"expected {case.expected!r}")
    if case.check == "number":
        numbers = _NUMBER.findall(_DIGIT_COMMA.sub("", text))
        if not numbers:
            return Result(
                case.id, False, shown(answer), f"expected {_num(case.expected)}, got no number"
            )
        got = float(numbers[-1])
        if math.isclose(got, float(case.expected), rel_tol=1e-9, abs_tol=1e-9):
            return Result(case.id, True, shown(answer))
        return Result(
            case.id, False, shown(answer), f"expected {_num(case.expected)}, got {numbers[-1]}"
        )
    if case.check == "json_keys":
        fenced = _FENCE.match(text)
        body = fenced.group(1).strip() if fenced else text
        try:
            data = json.loads(body)
        except ValueError:
            return Result(case.id, False, shown(answer), "not JSON")
        if not isinstance(data, dict):
            return Result(case.id, False, shown(answer), "JSON, but not an object")
        want = set(case.expected)
        if set(data) != want:
            missing, extra = sorted(want - set(data)), sorted(set(data) - want)
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unexpected {', '.join(extra)}"] if extra else []
            )
            return Result(case.id, False, shown(answer), "; ".join(parts))
        return Result(case.id, True, shown(answer))
    raise ValueError(f"case {case.id} is graded by a judge, not by code")


def failed(case: Case, why: str, answer: str = "") -> Result:
    """Return a case failed without a verdict on its answer (no answer, no judge)."""
    return Result(case.id, False, shown(answer), why)


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# The score


def score(results: list[Result] | tuple[Result, ...], total: int | None = None) -> float:
    """Return the share of cases passed, 0 to 1, over ``total`` (the results' count)."""
    count = len(results) if total is None else total
    if count <= 0:
        return 0.0
    return sum(1 for r in results if r.passed) / count


def threshold(suite: Suite, min_score: float) -> float:
    """Return the score to pass at: the model's ``eval.min_score``, else the suite's."""
    return min_score if min_score > 0 else suite.threshold


def passes(value: float, at: float) -> bool:
    """Return whether a score passes a threshold (a hair under it, by rounding, does too)."""
    return value >= at - 1e-9
