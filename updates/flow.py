"""The update flow, pure: what each step needs, what it decides, and the catalog it leaves.

No Django and no I/O here: ``updates.run`` reads the database, the mirror and the gateway's
records into plain facts, asks these functions, and writes what they say. An update of a
model goes through these steps, one update at a time per model:

1. **fetch**: the new revision's files into the mirror (``updates.mirror``); a failed
   fetch fails the update with the mirror's reason.
2. **candidate**: a catalog model beside the model (``candidate_spec``: its profiles,
   class and limits, at the new revision, one replica, named ``<model>@<commit8>``, which
   only the update and its eval name), placed like any replica; while placement finds no
   room the step waits and shows placement's reason; a failed replica fails the update.
3. **eval**, when the model has ``eval``: its suite through the gateway against the
   candidate (``updates.evals``), scored 0 to 1; below ``eval.min_score`` (or the suite's
   threshold) the update fails there, with the failed cases, and the candidate is removed.
4. **canary**, when the update has one (the model's ``canary`` settings, or a percent
   given at start): the model's canary names the candidate with that share; once the
   candidate has answered ``min_requests`` client requests and the gateway has not rolled
   it back for ``CANARY_SETTLE_S`` after that, it passed. A canary the gateway rolled back
   (its share set to 0, with the figures) fails the update with them.
5. **promote**: by hand (``catalog update promote``) unless the update was started with
   ``auto``; the model's origin becomes the new revision, ``previous`` keeps the old one,
   its replicas roll to it, the candidate takes the model's traffic as its first fallback
   until the roll's replacements are ready (``promoted_spec``, ``handover_over``), then
   is removed.

``rollback_spec`` is going back to ``previous`` (while the mirror still holds its files).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from catalog import spec
from llmgw_core.refused import Refused

FETCH = "fetch"
CANDIDATE = "candidate"
EVAL = "eval"
CANARY = "canary"
PROMOTE = "promote"
STEPS = (FETCH, CANDIDATE, EVAL, CANARY, PROMOTE)

# A run's state.
RUNNING = "running"
WAITING = "waiting"  # passed every step: waits for promote by hand
PROMOTED = "promoted"
FAILED = "failed"
STATES = (RUNNING, WAITING, PROMOTED, FAILED)
ACTIVE = (RUNNING, WAITING)

# Seconds a canary must stay on after it reached min_requests: every gateway process's
# watch looks each half second and its records reach the database each second, so a
# rollback past that is seen first.
CANARY_SETTLE_S = 5.0
CANDIDATE_MARK = "@"
SHORT = 8


class FlowRefused(Refused):
    """An update that cannot start or go on; the message says why and what to do."""


def short(revision: str) -> str:
    """Return a commit as a person writes it."""
    return revision[:SHORT]


def candidate_name(model: str, commit: str) -> str:
    """Return the name of a model's candidate at a commit: ``<model>@<commit8>``."""
    return f"{model}{CANDIDATE_MARK}{short(commit)}"


def is_candidate(name: str) -> bool:
    """Return whether a catalog name is an update's candidate."""
    return CANDIDATE_MARK in name


@dataclass(frozen=True)
class CanarySettings:
    """The share of the model's traffic the candidate gets, and when to give up on it."""

    percent: int
    min_requests: int = 0
    max_error_increase: float = 0.0
    max_ttft_ratio: float = 0.0

    def limits(self) -> tuple[int, float, float]:
        """Return the thresholds with the catalog's defaults (50, 0.05, 1.5) where 0."""
        return (
            self.min_requests if self.min_requests > 0 else 50,
            self.max_error_increase if self.max_error_increase > 0 else 0.05,
            self.max_ttft_ratio if self.max_ttft_ratio > 0 else 1.5,
        )


@dataclass(frozen=True)
class Plan:
    """What an update of a model will do, decided as it starts."""

    model: str
    source: str
    revision: str  # as asked: a commit, a branch, "" for the newest
    steps: tuple[str, ...]
    canary: CanarySettings | None = None
    suite: str = ""
    min_score: float = 0.0
    judge: str = ""
    auto: bool = False


@dataclass(frozen=True)
class Running:
    """An update that has not ended, as the refusal of a second one names it."""

    id: int
    model: str
    step: str
    state: str
    started_by: str
    started: str  # when, as a person reads it


def plan(
    m: spec.Model,
    running: Iterable[Running] = (),
    *,
    revision: str = "",
    auto: bool = False,
    canary_percent: int | None = None,
    has_registry: bool = True,
) -> Plan:
    """Return the plan of an update of ``m``, or refuse it.

    ``running`` are the updates that have not ended; ``canary_percent`` the share given at
    start (None: the model's own ``canary`` settings, if any; 0: no canary);
    ``has_registry`` whether the model's source is a repository or a URL the mirror
    fetches.

    Raises:
        FlowRefused: an update of the model is running, the model cannot be updated (a
            candidate, an external model, no registry), or the canary percent is wrong.
    """
    _refuse_update(m, running, has_registry)
    settings = _canary_settings(m, canary_percent)
    steps = [FETCH, CANDIDATE]
    if m.eval is not None and m.eval.suite:
        steps.append(EVAL)
    if settings is not None:
        steps.append(CANARY)
    steps.append(PROMOTE)
    gate = m.eval
    return Plan(
        model=m.name,
        source=m.source,
        revision=revision.strip(),
        steps=tuple(steps),
        canary=settings,
        suite=gate.suite if gate else "",
        min_score=gate.min_score if gate else 0.0,
        judge=gate.judge if gate else "",
        auto=auto,
    )


def _refuse_update(m: spec.Model, running: Iterable[Running], has_registry: bool) -> None:
    """Raise FlowRefused when ``m`` cannot be updated now (see ``plan``)."""
    for r in running:
        if r.model == m.name:
            raise FlowRefused(
                f'an update of "{m.name}" is running already: #{r.id}, started by '
                f"{r.started_by or 'the system'} at {r.started}, at its {r.step} step "
                f"({r.state}); wait for it to end, or promote it (catalog update promote)"
            )
    if is_candidate(m.name):
        raise FlowRefused(f'"{m.name}" is an update\'s candidate: update the model it is for')
    if m.external is not None:
        raise FlowRefused(f'"{m.name}" is an external model: its provider updates it')
    if not has_registry:
        raise FlowRefused(
            f'"{m.name}" has source {m.source or "(none)"}, which is not a Hugging Face '
            "repository or an http(s) URL: there is no registry to update it from"
        )
    if (
        m.canary is not None
        and m.canary.model
        and not is_candidate(m.canary.model)
        and (m.canary.percent > 0)
    ):
        raise FlowRefused(
            f'"{m.name}" sends {m.canary.percent}% of its traffic to "{m.canary.model}" '
            "already: set that canary's percent to 0 (its thresholds are kept for updates) "
            "or remove it first"
        )


def _canary_settings(m: spec.Model, canary_percent: int | None) -> CanarySettings | None:
    """Return the update's canary: the percent given at start (0: none), else the
    model's own canary settings, if any.

    Raises:
        FlowRefused: the percent given is not 0 to 100.
    """
    if canary_percent is not None:
        if not 0 <= canary_percent <= 100:
            raise FlowRefused(f"canary percent {canary_percent} is not 0 to 100")
        if canary_percent <= 0:
            return None
        base = m.canary or spec.Canary()
        return CanarySettings(
            canary_percent, base.min_requests, base.max_error_increase, base.max_ttft_ratio
        )
    if m.canary is None:
        return None
    c = m.canary
    # A model whose canary share is 0 keeps its thresholds for its updates: an
    # update's canary takes them, at 10 percent.
    return CanarySettings(c.percent or 10, c.min_requests, c.max_error_increase, c.max_ttft_ratio)


def next_step(steps: Sequence[str], step: str) -> str:
    """Return the step after ``step`` in a plan's steps."""
    i = steps.index(step)
    return steps[i + 1] if i + 1 < len(steps) else step


# What a look at an update found, and what it decides.


@dataclass(frozen=True)
class Facts:
    """What the driver read at one look, for the step the update is at."""

    # fetch
    fetch_state: str = ""  # queued / fetching / done / failed (updates.models.FetchState)
    fetch_reason: str = ""
    # candidate
    candidate_ready: bool = False
    candidate_failed: str = ""  # a replica's failure, when it failed
    candidate_waiting: str = ""  # why it is not placed yet (no room), for the page
    # eval
    eval_done: bool = False
    score: float = 0.0
    threshold: float = 0.0
    failed_cases: tuple[str, ...] = ()
    eval_error: str = ""  # the suite could not be run at all
    # canary
    canary_on: bool = True  # the model's canary still names the candidate with a share
    canary_why: str = ""  # the gateway's figures when it rolled the canary back
    served: int = 0  # client requests the candidate answered
    min_requests: int = 50
    settled_for: float = 0.0  # seconds since served first reached min_requests


class Action(StrEnum):
    """What an update does after a look at its step."""

    STAY = "stay"  # stay at the step (with a line for the page)
    GO = "go"  # go to the next step
    WAIT = "wait"  # passed every step: wait for promote by hand
    PROMOTE = "promote"
    FAIL = "fail"  # with why


@dataclass(frozen=True)
class Decision:
    """What to do: stay at the step (with a line for the page), go to ``step``, wait for
    promote by hand, promote, or fail with why."""

    action: Action
    step: str
    line: str = ""
    remove_candidate: bool = False


def decide(p: Plan, step: str, facts: Facts) -> Decision:
    """Return what an update at ``step`` does, given what was seen."""
    if step == FETCH:
        if facts.fetch_state == "failed":
            return Decision(
                Action.FAIL, step, f"fetch failed: {facts.fetch_reason or 'no reason given'}"
            )
        if facts.fetch_state == "done":
            return Decision(Action.GO, next_step(p.steps, step), "fetched into the mirror")
        return Decision(Action.STAY, step)
    if step == CANDIDATE:
        if facts.candidate_failed:
            return Decision(Action.FAIL, step, f"the candidate failed: {facts.candidate_failed}",
                            remove_candidate=True)  # fmt: skip
        if facts.candidate_ready:
            return _after(p, step, "the candidate is ready")
        return Decision(Action.STAY, step, facts.candidate_waiting)
    if step == EVAL:
        if facts.eval_error:
            return Decision(Action.FAIL, step, f"the eval could not run: {facts.eval_error}",
                            remove_candidate=True)  # fmt: skip
        if not facts.eval_done:
            return Decision(Action.STAY, step)
        score = f"{facts.score:.2f}"
        if facts.score < facts.threshold - 1e-9:
            cases = ", ".join(facts.failed_cases[:20])
            more = len(facts.failed_cases) - 20
            cases += f" and {more} more" if more > 0 else ""
            return Decision(
                Action.FAIL,
                step,
                f"eval {p.suite}: score {score}, below {facts.threshold:.2f}; failed: {cases}",
                remove_candidate=True,
            )
        return _after(p, step, f"eval {p.suite}: score {score} (at least {facts.threshold:.2f})")
    if step == CANARY:
        if not facts.canary_on:
            why = facts.canary_why or "the canary was switched off"
            return Decision(Action.FAIL, step, why, remove_candidate=True)
        if facts.served >= facts.min_requests and facts.settled_for >= CANARY_SETTLE_S:
            return _after(p, step, f"canary: {facts.served} requests answered, not rolled back")
        return Decision(Action.STAY, step)
    if step == PROMOTE:
        return Decision(Action.PROMOTE, step)
    raise ValueError(f"unknown step {step!r}")


def _after(p: Plan, step: str, line: str) -> Decision:
    following = next_step(p.steps, step)
    if following == PROMOTE:
        return Decision(Action.PROMOTE if p.auto else "wait", PROMOTE, line)
    return Decision(Action.GO, following, line)


def eval_progress(passed: int, done: int, total: int) -> str:
    """Return the page's line for an eval under way: the score so far."""
    so_far = f"{passed / done:.2f}" if done else "-"
    return f"{done} of {total} cases, score so far {so_far}"


def canary_line(served: int, min_requests: int, percent: int) -> str:
    """Return the page's line for a canary under way."""
    return f"canary at {percent}%: {served} of {min_requests} requests answered"


# The catalog an update leaves.


@dataclass(frozen=True)
class Revision:
    """A revision of a model's weights: its commit and weights files (origin files)."""

    commit: str
    files: tuple[spec.OriginFile, ...] = field(default_factory=tuple)


def candidate_spec(m: spec.Model, new: Revision) -> spec.Model:
    """Return the candidate of ``m`` at ``new``: its profiles, class and limits, one replica.

    No aliases (clients name the model, not it), no fallbacks, no canary and no eval of
    its own; its origin is the new revision, with no previous.
    """
    c = copy.deepcopy(m)
    c.name = candidate_name(m.name, new.commit)
    c.aliases = []
    c.description = f"the update of {m.name} to {short(new.commit)}: removed when it ends"
    c.fallbacks = []
    c.canary = None
    c.eval = None
    c.adapters = copy.deepcopy(m.adapters)
    c.scaling = spec.Scaling(min=1, max=1)
    repo = m.origin.repo if m.origin is not None else ""
    c.origin = spec.Origin(repo=repo, revision=new.commit, files=list(new.files))
    return c


def with_canary(m: spec.Model, candidate: str, settings: CanarySettings) -> spec.Model:
    """Return ``m`` sending its canary share to ``candidate``."""
    out = copy.deepcopy(m)
    out.canary = spec.Canary(
        model=candidate,
        percent=settings.percent,
        min_requests=settings.min_requests,
        max_error_increase=settings.max_error_increase,
        max_ttft_ratio=settings.max_ttft_ratio,
    )
    return out


def without_candidate(m: spec.Model, candidate: str) -> spec.Model:
    """Return ``m`` with no canary to ``candidate`` (its thresholds kept at 0 percent is
    not possible without a model to name: the canary goes)."""
    out = copy.deepcopy(m)
    if out.canary is not None and out.canary.model == candidate:
        out.canary = None
    return out


def promoted_spec(m: spec.Model, candidate: str, new: Revision) -> spec.Model:
    """Return ``m`` at ``new``: origin the new revision, previous the old one, no canary,
    and the candidate (at ``new`` already, ready) its first fallback while its replicas
    roll: a model whose old replica must stop before its replacement has room (one
    replica on a full node) is answered by the candidate meanwhile, not dark
    (``handover_over`` says when that ends, ``without_handover`` ends it)."""
    out = without_candidate(m, candidate)
    out.fallbacks = [candidate, *(f for f in out.fallbacks if f != candidate)]
    old = m.origin
    previous = None
    if old is not None and old.revision == new.commit:
        previous = old.previous  # at that revision already: what it came from stays
    elif old is not None and old.revision:
        previous = spec.PreviousOrigin(
            source=m.source, revision=old.revision, files=list(old.files)
        )
    out.origin = spec.Origin(
        repo=old.repo if old is not None else "",
        revision=new.commit,
        files=list(new.files),
        previous=previous,
    )
    return out


def without_handover(m: spec.Model, candidate: str) -> spec.Model:
    """Return ``m`` with the candidate no longer among its fallbacks."""
    out = copy.deepcopy(m)
    out.fallbacks = [f for f in out.fallbacks if f != candidate]
    return out


# The longest a candidate takes a promoted model's traffic for its replacements (one that
# never finds room, say): past it the candidate goes, saying so.
HANDOVER_LIMIT_S = 1800.0


def handover_over(
    model: str, candidate: str, rolled: Mapping[int, str | None], waited_s: float
) -> str:
    """Return the line saying the candidate stops taking ``model``'s traffic, or "" while
    a replacement of the roll is still on its way.

    ``rolled`` is each replacement's state (None: it is gone or no longer wanted, as when
    the model was scaled down); ``waited_s`` the seconds since the promote.
    """
    failed = sorted(rid for rid, state in rolled.items() if state == "failed")
    rising = sorted(rid for rid, state in rolled.items() if state not in (None, "ready", "failed"))
    if rising and waited_s < HANDOVER_LIMIT_S:
        return ""
    if rising:
        ids = ", ".join(f"#{r}" for r in rising)
        return (
            f"{ids} not ready after {HANDOVER_LIMIT_S / 60:.0f} minutes: {candidate} stops "
            f"taking {model}'s traffic"
        )
    if failed:
        ids = ", ".join(f"#{r}" for r in failed)
        return f"replacement {ids} failed: {candidate} stops taking {model}'s traffic"
    return f"the replacements are ready: {candidate} stops taking {model}'s traffic"


def rollback_spec(m: spec.Model) -> spec.Model:
    """Return ``m`` back at its previous revision (the current one becomes previous).

    Raises:
        FlowRefused: the model has no previous revision.
    """
    old = m.origin
    if old is None or not old.revision:
        raise FlowRefused(
            f'"{m.name}" has no previous revision to go back to: it has no origin (its files '
            "were never fetched nor updated); nothing was rolled"
        )
    if old.previous is None or not old.previous.revision:
        raise FlowRefused(
            f'"{m.name}" has no previous revision to go back to: it is at '
            f"{short(old.revision)}, the first revision it was fetched or updated to; "
            "nothing was rolled"
        )
    prev = old.previous
    if prev.revision == old.revision and (prev.source or m.source) == m.source:
        raise FlowRefused(
            f'"{m.name}" has no other revision to go back to: its previous revision is the '
            f"one it is at ({short(old.revision)}); nothing was rolled"
        )
    out = copy.deepcopy(m)
    out.source = prev.source or m.source
    out.origin = spec.Origin(
        repo=old.repo,
        revision=prev.revision,
        files=list(prev.files),
        previous=spec.PreviousOrigin(source=m.source, revision=old.revision, files=list(old.files)),
    )
    return out
