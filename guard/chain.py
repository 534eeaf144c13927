"""The judge chain: judges asked in turn, the first that answers deciding.

Plain Python, no Django and no I/O of its own: ``run_chain`` is given the judges (in
the policy's order, each saying whether it has a ready replica) and an ``ask``
callable that asks one judge (the lead passes ``guard.client.ask_judge`` bound to the
judge's endpoint; tests pass fakes). ``Stats`` counts what chains did, for the lead to
persist.

A failure is anything that gives no verdict: a judge with no ready replica
(``no_replica``, it is not asked), or ``ask`` raising. The kind is the exception's own
``kind`` when it has one (``guard.client.JudgeFailure``: ``timeout``, ``http_error``,
``unreadable``, ``context``), ``unreadable`` for ``guard.formats.UnreadableAnswer`` or
an answer whose verdict is not safe, unsafe or controversial, and ``error`` for
anything else (a bug must not take the request path down: ``fail`` decides, and the
failure says what it was). A judge whose circuit breaker is open (``guard.breaker``) is
skipped by ``ask`` raising ``guard.breaker.Skipped``: a failure of kind ``breaker_open``,
counting as failed for ``fail`` like any other, but not against the judge's health (it
was not asked).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from guard.breaker import SKIPPED
from guard.breaker import State as BreakerState
from guard.formats import UnreadableAnswer, Verdict
from guard.policy import ALLOW, DIRECTIONS, FAIL_OPEN, REFUSE, Policy, decide

NO_REPLICA = "no_replica"
UNREADABLE = "unreadable"
ERROR = "error"

# What Stats files a chain under when no judge answered (judge and verdict).
NO_JUDGE = ""
FAILED = "failed"
# The category of a verdict that names none.
NO_CATEGORY = ""


@dataclass(frozen=True)
class JudgeRef:
    """One judge in the chain: its catalog name and whether a replica is ready for it
    (``reason`` says why not, in the failure recorded)."""

    name: str
    ready: bool = True
    reason: str = "no ready replica"


@dataclass(frozen=True)
class Failure:
    """A judge that gave no verdict: which, why (``kind``), and when."""

    judge: str
    kind: str
    message: str
    at: datetime


@dataclass(frozen=True)
class ChainResult:
    """What the chain decided, and who decided it.

    ``judge``, ``verdict`` and the answer's fields are None when no judge answered:
    then ``fail`` decided, and ``failed_open`` says whether it allowed. ``judged`` is
    False when the policy does not judge the direction (nothing was asked).
    """

    decision: str
    verdict: str | None
    categories: tuple[str, ...]
    judge: str | None
    score: float | None
    latency_ms: float | None
    failures: list[Failure] = field(default_factory=list)
    failed_open: bool = False
    refusal: bool | None = None
    judged: bool = True
    # The deciding judge read the request's, the answer's start and end only (too long
    # for its context): the middle was not judged, and a caller acting on the verdict
    # has it judged in parts first (gateway.path.app).
    request_cut: bool = False
    answer_cut: bool = False


def run_chain(
    policy: Policy,
    judges: Sequence[JudgeRef],
    ask: Callable[[JudgeRef], Any],
    *,
    direction: str,
    now: Callable[[], datetime] | None = None,
) -> ChainResult:
    """Ask the judges in turn; return the first answer's decision, or ``fail``'s.

    ``judges`` are asked in the order given (the lead passes them in
    ``policy.judge_models`` order, with the ones the catalog lacks as not ready).
    ``ask(judge)`` returns an answer with ``verdict`` (a string or a ``Verdict``) and
    ``categories``, and optionally ``refusal``, ``score`` and ``latency_ms``
    (``guard.client.JudgeAnswer`` has them all). ``now`` stamps failures (UTC by
    default).

    Raises:
        ValueError: ``direction`` is not ``requests`` or ``answers``.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
    clock = now or _utc_now
    if not policy.judges(direction):
        return ChainResult(ALLOW, None, (), None, None, None, judged=False)
    failures: list[Failure] = []
    for judge in judges:
        if not judge.ready:
            failures.append(Failure(judge.name, NO_REPLICA, judge.reason, clock()))
            continue
        # Any exception, a bug's too, is recorded against the judge and fail decides,
        # rather than the request being taken down with it.
        try:
            answer = ask(judge)
            verdict = _verdict(answer)
        except Exception as e:
            failures.append(Failure(judge.name, _kind(e), _message(e), clock()))
            continue
        return ChainResult(
            decision=decide(policy, verdict),
            verdict=verdict.verdict,
            categories=verdict.categories,
            judge=judge.name,
            score=getattr(answer, "score", None),
            latency_ms=getattr(answer, "latency_ms", None),
            failures=failures,
            refusal=verdict.refusal,
            request_cut=bool(getattr(answer, "request_cut", False)),
            answer_cut=bool(getattr(answer, "answer_cut", False)),
        )
    opened = policy.fail == FAIL_OPEN
    return ChainResult(
        decision=ALLOW if opened else REFUSE,
        verdict=None,
        categories=(),
        judge=None,
        score=None,
        latency_ms=None,
        failures=failures,
        failed_open=opened,
    )


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _verdict(answer: Any) -> Verdict:
    """Return an answer as a Verdict; UnreadableAnswer when its verdict is no verdict."""
    if isinstance(answer, Verdict):
        return answer
    verdict = getattr(answer, "verdict", None)
    if isinstance(verdict, Verdict):
        return verdict
    try:
        return Verdict(
            verdict,
            tuple(getattr(answer, "categories", ()) or ()),
            getattr(answer, "refusal", None),
            getattr(answer, "raw", "") or "",
        )
    except (ValueError, TypeError) as e:
        raise UnreadableAnswer(f"the answer's verdict is unreadable: {e}") from e


def _kind(e: Exception) -> str:
    kind = getattr(e, "kind", None)
    if isinstance(kind, str) and kind:
        return kind
    if isinstance(e, UnreadableAnswer):
        return UNREADABLE
    return ERROR


def _message(e: Exception) -> str:
    text = str(e)
    if _kind(e) == ERROR:
        return f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text or _kind(e)


class DecisionKey(NamedTuple):
    """What a decision is counted by: the judge, its verdict, one category, the outcome.

    A verdict naming several categories counts once under each; one naming none under
    ``""``. A chain whose judges all failed counts under judge ``""`` and verdict
    ``failed``.
    """

    judge: str
    verdict: str
    category: str
    decision: str


@dataclass
class JudgeHealth:
    """One judge's failures: how many (by kind), the last error and when."""

    failures: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    last_kind: str = ""
    last_error: str = ""
    last_failed_at: datetime | None = None


@dataclass
class Stats:
    """Counts of what chains did, in memory; the lead persists and resets them (``take``).

    ``answers`` counts each judge's verdicts and ``last_good`` keeps when its latest came
    and how long it took; ``health`` its failures; ``decisions`` the verdicts by key;
    ``breakers`` each judge's circuit breaker as it last changed (``guard.breaker``).
    """

    health: dict[str, JudgeHealth] = field(default_factory=dict)
    decisions: Counter[DecisionKey] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    last_good: dict[str, tuple[datetime, float | None]] = field(default_factory=dict)
    breakers: dict[str, BreakerState] = field(default_factory=dict)

    def record(self, result: ChainResult, at: datetime | None = None) -> None:
        """Count a chain's failures against their judges and its decision.

        ``at`` is when the deciding judge answered (now, UTC, by default).
        """
        for f in result.failures:
            self.record_failure(f)
        if not result.judged:
            return
        if result.judge is None:
            self.decisions[DecisionKey(NO_JUDGE, FAILED, NO_CATEGORY, result.decision)] += 1
            return
        assert result.verdict is not None  # a judge answered
        self.answers[result.judge] += 1
        self._good(result.judge, at or _utc_now(), result.latency_ms)
        for category in result.categories or (NO_CATEGORY,):
            key = DecisionKey(result.judge, result.verdict, category, result.decision)
            self.decisions[key] += 1

    def record_failure(self, failure: Failure) -> None:
        """Count one failure against its judge, keeping the latest error and time.

        A judge skipped by its breaker was not asked: nothing is counted against it.
        """
        if failure.kind == SKIPPED:
            return
        h = self.health.setdefault(failure.judge, JudgeHealth())
        h.failures += 1
        h.by_kind[failure.kind] += 1
        self._last_error(h, failure.kind, failure.message, failure.at)

    def merge(self, other: Stats) -> None:
        """Add another's counts to these (the latest error and answer win; ``other``'s
        breakers, the later ones, replace these)."""
        for judge, theirs in other.health.items():
            h = self.health.setdefault(judge, JudgeHealth())
            h.failures += theirs.failures
            h.by_kind.update(theirs.by_kind)
            if theirs.last_failed_at is not None:
                self._last_error(h, theirs.last_kind, theirs.last_error, theirs.last_failed_at)
        self.decisions.update(other.decisions)
        self.answers.update(other.answers)
        for judge, (at, latency) in other.last_good.items():
            self._good(judge, at, latency)
        self.breakers.update(other.breakers)

    def empty(self) -> bool:
        """Return whether nothing has been counted."""
        return not (
            self.health or self.decisions or self.answers or self.last_good or self.breakers
        )

    def take(self) -> Stats:
        """Return the counts so far and start again from zero."""
        taken = Stats(self.health, self.decisions, self.answers, self.last_good, self.breakers)
        self.health = {}
        self.decisions = Counter()
        self.answers = Counter()
        self.last_good = {}
        self.breakers = {}
        return taken

    @staticmethod
    def _last_error(h: JudgeHealth, kind: str, message: str, at: datetime) -> None:
        # Chains run concurrently and may be recorded out of order: the last error is
        # the latest one, not the last recorded.
        if h.last_failed_at is None or at >= h.last_failed_at:
            h.last_kind = kind
            h.last_error = message
            h.last_failed_at = at

    def _good(self, judge: str, at: datetime, latency_ms: float | None) -> None:
        held = self.last_good.get(judge)
        if held is None or at >= held[0]:
            self.last_good[judge] = (at, latency_ms)
