"""The guard policy: which judges, in what order, and what their verdicts lead to.

A policy is plain data (no Django, no I/O): ``validate`` reads one from a dict (a policy
file's or the API's), ``to_data`` writes it back, and ``decide`` turns one judge's
``Verdict`` into ``"allow"`` or ``"refuse"``.

The dict's keys (nested; ``judge.models`` may also be written as one dotted key):

- ``judge.models``: the judges, catalog model names, asked in this order; the first
  that answers decides (``guard.chain``).
- ``judge.controversial``: how a Qwen3Guard Controversial verdict counts, ``safe`` (the
  default) or ``unsafe`` (spec §1.6: Qwen's "loose" and "strict" uses).
- ``fail``: what happens when every judge failed, ``open`` (allow) or ``closed`` (refuse).
- ``directions``: what is judged, any of ``requests`` and ``answers``; ``[]`` judges
  nothing while keeping the policy.
- ``categories``: the categories that refuse (see ``decide``).

A key left out takes ``BASELINE``'s value. ``validate`` checks the shape; ``complete``
checks a policy against its judges (each must be one, each category reported by one of
them) and makes its categories hold for every judge, in each judge's own names: what
every surface saves. Section numbers (§) refer to
/work/shared/spec/guard-formats.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from catalog.problems import PathPart, Problem
from guard.formats import CONTROVERSIAL, QWEN3GUARD_CATEGORIES, SAFE, UNSAFE, Verdict

ALLOW = "allow"
REFUSE = "refuse"

FAIL_OPEN = "open"
FAIL_CLOSED = "closed"
FAILS = (FAIL_OPEN, FAIL_CLOSED)

CONTROVERSIAL_AS = (SAFE, UNSAFE)

REQUESTS = "requests"
ANSWERS = "answers"
DIRECTIONS = (REQUESTS, ANSWERS)

KEYS = ("judge", "fail", "directions", "categories")
JUDGE_KEYS = ("models", "controversial")

_Add = Callable[[tuple[PathPart, ...], str, str], None]


@dataclass(frozen=True)
class Policy:
    """Which judges judge what, and what their verdicts lead to."""

    judge_models: tuple[str, ...]
    controversial: str = SAFE
    fail: str = FAIL_OPEN
    judge_requests: bool = True
    judge_answers: bool = True
    refuse_categories: tuple[str, ...] = ()

    def judges(self, direction: str) -> bool:
        """Return whether this policy judges ``direction`` (``requests`` or ``answers``)."""
        if direction == REQUESTS:
            return self.judge_requests
        if direction == ANSWERS:
            return self.judge_answers
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")

    @property
    def directions(self) -> tuple[str, ...]:
        """Return the judged directions, in the file's order."""
        return tuple(d for d in DIRECTIONS if self.judges(d))


# The baseline is what ``server init`` installs (the seed commit message): Qwen3Guard-Gen
# 0.6B, because Llama Guard 3 1B refused ordinary coding requests ("continue" at 0.51,
# "kill all child processes" at 0.92) where the 0.6B gave them 0.15 at most, in 0.8 GB
# on CPUs. Controversial counts as safe, the seed's default, for the same reason:
# over-refusal is the harm the change was made for. Fail open, because the baseline is
# one CPU judge and the seed's lesson is that refusing ordinary traffic is the failure
# sites notice: closed would refuse every request while that one judge restarts. A site
# that must never pass an unjudged text sets ``fail: closed``; every failure is
# recorded against its judge either way (``guard.chain``). The categories are
# Qwen3Guard's own nine (§1.6), all of which refuse.
BASELINE = Policy(
    judge_models=("qwen3guard-0.6b",),
    controversial=SAFE,
    fail=FAIL_OPEN,
    judge_requests=True,
    judge_answers=True,
    refuse_categories=QWEN3GUARD_CATEGORIES,
)


def decide(policy: Policy, verdict: Verdict) -> str:
    """Return ``"allow"`` or ``"refuse"`` for one judge's verdict under a policy.

    The rule, in order:

    1. ``safe`` allows.
    2. ``controversial`` allows when ``judge.controversial`` is ``safe``; when it is
       ``unsafe`` it is read as an unsafe verdict (rule 3).
    3. ``unsafe`` refuses when it names no category (a judge that only says unsafe, or
       names nothing it can map, must not slip through a category list), or when any
       category it names is one of the policy's ``categories``; otherwise (it names
       only categories the policy does not refuse) it allows.

    Categories compare without regard to case, so ``pii`` in a policy file is
    Qwen3Guard's ``PII``.
    """
    if verdict.verdict == SAFE:
        return ALLOW
    if verdict.verdict == CONTROVERSIAL and policy.controversial == SAFE:
        return ALLOW
    if not verdict.categories:
        return REFUSE
    refused = {c.casefold() for c in policy.refuse_categories}
    if any(c.casefold() in refused for c in verdict.categories):
        return REFUSE
    return ALLOW


# Which Llama Guard 3 categories (the model card's names, §2.2) answer to each of
# Qwen3Guard's (§1.6): our reading of the two taxonomies' descriptions, not a mapping
# either vendor publishes. Jailbreak has no Llama Guard counterpart; Specialized Advice
# and Code Interpreter Abuse have no Qwen3Guard one.
EQUIVALENTS: dict[str, tuple[str, ...]] = {
    "Violent": ("Violent Crimes", "Indiscriminate Weapons"),
    "Non-violent Illegal Acts": ("Non-Violent Crimes",),
    "Sexual Content or Sexual Acts": (
        "Sex-Related Crimes",
        "Child Sexual Exploitation",
        "Sexual Content",
    ),
    "PII": ("Privacy",),
    "Suicide & Self-Harm": ("Suicide & Self-Harm",),
    "Unethical Acts": ("Hate",),
    "Politically Sensitive Topics": ("Elections", "Defamation"),
    "Copyright Violation": ("Intellectual Property",),
    "Jailbreak": (),
}


def equivalents(category: str) -> tuple[str, ...]:
    """Return the other taxonomy's categories that answer to one (both directions)."""
    folded = category.casefold()
    out: list[str] = []
    for qwen, llama in EQUIVALENTS.items():
        if qwen.casefold() == folded:
            out += llama
        elif any(c.casefold() == folded for c in llama):
            out.append(qwen)
    return tuple(dict.fromkeys(c for c in out if c.casefold() != folded))


@dataclass(frozen=True)
class Replacement:
    """What ``complete`` did to a category: replaced, removed, or equivalents added."""

    category: str
    by: tuple[str, ...]
    added: bool = False

    def line(self) -> str:
        """Return the line a surface shows about it."""
        names = ", ".join(f'"{c}"' for c in self.by)
        if self.added:
            return (
                f'added {names}: another listed judge\'s names for "{self.category}", '
                "so that judge refuses it too"
            )
        if not self.by:
            return f'"{self.category}": no listed judge reports it or an equivalent; removed'
        return f'"{self.category}": no listed judge reports it; replaced by {names}'


def complete(
    policy: Policy,
    reports: Mapping[str, Collection[str]],
    *,
    drop_unreportable: bool = False,
) -> tuple[Policy | None, list[Replacement], list[Problem]]:
    """Return the policy as its judges make it, what changed, and the problems.

    ``reports`` names every judge there is (a guard model in the catalog or a known
    judge) with the categories its verdicts can report. The rule, which every surface
    applies before saving:

    - every judge of ``judge.models`` is one of ``reports`` (else a problem at
      ``judge.models[i]``);
    - a category no listed judge reports is replaced by its equivalents (``EQUIVALENTS``)
      that one does; one with none is a problem at ``categories[i]`` (or, with
      ``drop_unreportable``, as ``guard judge use`` does, removed and said);
    - then, until nothing changes, each category's equivalents that a listed judge
      reports are added: a chain of a Qwen3Guard and a Llama Guard refuses "Violent
      Crimes" when it refuses "Violent", whichever judge decides.

    So no judge's unsafe verdict in a category the policy refuses under another judge's
    name is allowed, and ``complete`` of its own result changes nothing. Categories
    compare without case, as ``decide`` does.
    """
    problems: list[Problem] = []
    per_judge: list[set[str]] = []
    for i, name in enumerate(policy.judge_models):
        if name not in reports:
            problems.append(
                Problem(
                    ("judge", "models", i),
                    f'judge.models[{i}] "{name}" is neither a guard model in the catalog nor '
                    "a known judge: enable one (guard judge enable NAME) or list one of "
                    f"{', '.join(sorted(reports)) or '(none)'}",
                    "unknown_judge",
                )
            )
            continue
        per_judge.append({c.casefold() for c in reports[name]})
    if problems:
        return None, [], problems
    reportable = set().union(*per_judge)
    kept: list[str] = []
    changes: list[Replacement] = []
    for i, category in enumerate(policy.refuse_categories):
        if category.casefold() in reportable:
            kept.append(category)
            continue
        by = tuple(c for c in equivalents(category) if c.casefold() in reportable)
        if by or drop_unreportable:
            changes.append(Replacement(category, by))
            kept += by
            continue
        listed = "; ".join(
            f"{name}: {', '.join(reports[name]) or '(none)'}" for name in policy.judge_models
        )
        problems.append(
            Problem(
                ("categories", i),
                f'categories[{i}] "{category}" is reported by no listed judge and has no '
                f"equivalent one reports ({listed}): remove it, or list a judge that reports it",
                "unreported_category",
            )
        )
    if problems:
        return None, [], problems
    categories = _closed(kept, reportable, changes)
    return replace(policy, refuse_categories=tuple(categories)), changes, []


def _closed(kept: list[str], reportable: set[str], changes: list[Replacement]) -> list[str]:
    """Return ``kept`` once each (without case) with every equivalent a listed judge
    reports added, equivalents of equivalents too (Indiscriminate Weapons -> Violent ->
    Violent Crimes), so the result is its own completion; each addition goes in
    ``changes``."""
    categories: list[str] = []
    have: set[str] = set()
    for c in kept:
        if c.casefold() not in have:
            categories.append(c)
            have.add(c.casefold())
    i = 0
    while i < len(categories):
        category = categories[i]
        added = tuple(
            c
            for c in equivalents(category)
            if c.casefold() in reportable and c.casefold() not in have
        )
        if added:
            categories += added
            have |= {c.casefold() for c in added}
            changes.append(Replacement(category, added, added=True))
        i += 1
    return categories


def to_data(policy: Policy) -> dict[str, Any]:
    """Return the policy as ``validate`` reads it (nested keys, lists for tuples)."""
    return {
        "judge": {
            "models": list(policy.judge_models),
            "controversial": policy.controversial,
        },
        "fail": policy.fail,
        "directions": list(policy.directions),
        "categories": list(policy.refuse_categories),
    }


def changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """Return what changed between two ``to_data`` dicts, each key dotted as the file
    writes it (``judge.controversial``), a single value with its old and new
    (``fail: open → closed``), a list by its key alone."""
    out: list[str] = []

    def walk(old: Any, new: Any, path: str) -> None:
        if isinstance(new, Mapping):
            old = old if isinstance(old, Mapping) else {}
            for key in new:
                walk(old.get(key), new[key], f"{path}.{key}" if path else str(key))
        elif old != new:
            scalar = not isinstance(new, list) and not isinstance(old, list)
            out.append(f"{path}: {old} → {new}" if scalar and old is not None else path)

    walk(before or {}, after, "")
    return out


def validate(data: Any) -> tuple[Policy | None, list[Problem]]:
    """Return the policy a dict describes, or None and every problem with it.

    Problems carry the key's path (``("judge", "models", 1)``) and a message naming
    what is allowed; codes: ``bad_type``, ``unknown_key``, ``twice``, ``bad_value``,
    ``no_judges``, ``empty``, ``duplicate``.
    """
    out: list[Problem] = []

    def add(path: tuple[PathPart, ...], code: str, message: str) -> None:
        out.append(Problem(path, message, code))

    if not isinstance(data, Mapping):
        add((), "bad_type", f"a policy is a mapping of keys, not {_kind(data)}")
        return None, out
    data = _undot(data, add)
    for key in data:
        if key not in KEYS:
            add(
                (str(key),),
                "unknown_key",
                f'unknown key "{key}": a policy has {", ".join(KEYS)}',
            )
    judge = data.get("judge", {})
    if not isinstance(judge, Mapping):
        add(
            ("judge",),
            "bad_type",
            f"judge is a mapping (models, controversial), not {_kind(judge)}",
        )
        judge = {}
    for key in judge:
        if key not in JUDGE_KEYS:
            add(
                ("judge", str(key)),
                "unknown_key",
                f'unknown key "judge.{key}": judge has {", ".join(JUDGE_KEYS)}',
            )

    models = _names(judge, "models", ("judge", "models"), BASELINE.judge_models, add)
    if models is not None and not models and "models" in judge:
        add(
            ("judge", "models"),
            "no_judges",
            "judge.models is empty: name at least one judge (a catalog guard model)",
        )
    controversial = _choice(
        judge,
        "controversial",
        ("judge", "controversial"),
        CONTROVERSIAL_AS,
        BASELINE.controversial,
        add,
    )
    fail = _choice(data, "fail", ("fail",), FAILS, BASELINE.fail, add)
    directions = _names(data, "directions", ("directions",), BASELINE.directions, add)
    if directions is not None:
        for i, d in enumerate(directions):
            if d not in DIRECTIONS:
                add(
                    ("directions", i),
                    "bad_value",
                    f'direction "{d}" is not one of {", ".join(DIRECTIONS)}',
                )
    categories = _names(data, "categories", ("categories",), BASELINE.refuse_categories, add)
    if out:
        return None, out
    assert models is not None and directions is not None and categories is not None
    assert controversial is not None and fail is not None
    return Policy(
        judge_models=models,
        controversial=controversial,
        fail=fail,
        judge_requests=REQUESTS in directions,
        judge_answers=ANSWERS in directions,
        refuse_categories=categories,
    ), []


def _undot(data: Mapping[Any, Any], add: _Add) -> dict[Any, Any]:
    """Return the data with ``judge.models``-style keys moved under ``judge``."""
    out: dict[Any, Any] = {k: v for k, v in data.items() if not _dotted(k)}
    judge = out.get("judge")
    nested = dict(judge) if isinstance(judge, Mapping) else judge
    for key, value in data.items():
        if not _dotted(key):
            continue
        head, _, tail = key.partition(".")
        if head != "judge":
            add((key,), "unknown_key", f'unknown key "{key}": a policy has {", ".join(KEYS)}')
            continue
        if nested is None:
            nested = {}
        if not isinstance(nested, dict):
            continue  # judge itself is not a mapping: reported with it
        if tail in nested:
            add(
                ("judge", tail),
                "twice",
                f'judge.{tail} is given twice, as "{key}" and under judge: keep one',
            )
            continue
        nested[tail] = value
    if nested is not None:
        out["judge"] = nested
    return out


def _dotted(key: Any) -> bool:
    return isinstance(key, str) and "." in key


def _names(
    data: Mapping[Any, Any],
    key: str,
    path: tuple[PathPart, ...],
    default: tuple[str, ...],
    add: _Add,
) -> tuple[str, ...] | None:
    """Return a list of distinct non-empty strings, the default when absent, or None."""
    if key not in data:
        return default
    value = data[key]
    where = ".".join(str(p) for p in path)
    if not isinstance(value, Sequence) or isinstance(value, str):
        add(path, "bad_type", f"{where} is a list, not {_kind(value)}")
        return None
    names: list[str] = []
    ok = True
    seen: dict[str, int] = {}
    for i, item in enumerate(value):
        if not isinstance(item, str):
            add((*path, i), "bad_type", f"{where}[{i}] is a name (a string), not {_kind(item)}")
            ok = False
            continue
        name = item.strip()
        if not name:
            add((*path, i), "empty", f"{where}[{i}] is empty: write a name or remove it")
            ok = False
            continue
        # Categories compare without case (decide), so "PII" and "pii" are one.
        folded = name.casefold() if key == "categories" else name
        if folded in seen:
            add(
                (*path, i),
                "duplicate",
                f'{where}[{i}] "{name}" repeats {where}[{seen[folded]}]: list each once',
            )
            ok = False
            continue
        seen[folded] = i
        names.append(name)
    return tuple(names) if ok else None


def _choice(
    data: Mapping[Any, Any],
    key: str,
    path: tuple[PathPart, ...],
    allowed: tuple[str, ...],
    default: str,
    add: _Add,
) -> str | None:
    """Return one of ``allowed``, the default when absent, or None after a problem."""
    if key not in data:
        return default
    value = data[key]
    where = ".".join(str(p) for p in path)
    choices = " or ".join(allowed)
    if not isinstance(value, str):
        add(path, "bad_type", f"{where} is {choices}, not {_kind(value)}")
        return None
    if value.strip().lower() not in allowed:
        add(path, "bad_value", f'{where} "{value}" is not {choices}')
        return None
    return value.strip().lower()


def _kind(value: Any) -> str:
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f'"{value}" (a string)'
    if isinstance(value, int | float):
        return f"{value} (a number)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__
