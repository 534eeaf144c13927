"""Test the judge chain: order, the first answer deciding, every failure recorded against
its judge, fail open and closed, and the counts Stats keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from guard.chain import DecisionKey, Failure, JudgeRef, Stats, run_chain
from guard.formats import UnreadableAnswer, Verdict
from guard.policy import BASELINE, Policy

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Answer:
    """The fields of guard.client.JudgeAnswer the chain reads."""

    verdict: str
    categories: tuple[str, ...] = ()
    refusal: bool | None = None
    score: float | None = 0.1
    latency_ms: float = 12.5


class Failing(Exception):
    """Shaped like guard.client.JudgeFailure: a kind and a message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def fake(script: dict[str, Any]) -> tuple[Any, list[str]]:
    """Return an ask() answering or raising per judge, and the names it was asked."""
    asked: list[str] = []

    def ask(judge: JudgeRef) -> Any:
        asked.append(judge.name)
        outcome = script[judge.name]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return ask, asked


def ticking() -> Any:
    times = iter(T0 + timedelta(seconds=i) for i in range(100))
    return lambda: next(times)


POLICY = Policy(judge_models=("a", "b", "c"), refuse_categories=("Violent",))
JUDGES = [JudgeRef("a"), JudgeRef("b"), JudgeRef("c")]


def test_first_judge_that_answers_decides() -> None:
    ask, asked = fake({"a": Answer("unsafe", ("Violent",), score=0.97), "b": Answer("safe")})
    result = run_chain(POLICY, JUDGES, ask, direction="requests")
    assert asked == ["a"]
    assert result.decision == "refuse"
    assert (result.judge, result.verdict, result.categories) == ("a", "unsafe", ("Violent",))
    assert (result.score, result.latency_ms) == (0.97, 12.5)
    assert result.failures == [] and not result.failed_open and result.judged


def test_judges_are_asked_in_the_order_given() -> None:
    ask, asked = fake(
        {"c": Failing("timeout", "slow"), "a": Failing("timeout", "slow"), "b": Answer("safe")}
    )
    result = run_chain(
        POLICY, [JudgeRef("c"), JudgeRef("a"), JudgeRef("b")], ask, direction="requests"
    )
    assert asked == ["c", "a", "b"]
    assert result.judge == "b" and result.decision == "allow"
    assert [f.judge for f in result.failures] == ["c", "a"]


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (Failing("timeout", "no answer in 2s"), "timeout", "no answer in 2s"),
        (Failing("http_error", "HTTP 503"), "http_error", "HTTP 503"),
        (Failing("unreadable", "not the grammar"), "unreadable", "not the grammar"),
        (Failing("context", "too small"), "context", "too small"),
        (
            UnreadableAnswer("the first line is not 'safe'"),
            "unreadable",
            "the first line is not 'safe'",
        ),
        (RuntimeError("boom"), "error", "RuntimeError: boom"),
    ],
)
def test_every_failure_kind_is_recorded_against_its_judge(
    error: Exception, kind: str, message: str
) -> None:
    ask, _ = fake({"a": error, "b": Answer("safe")})
    result = run_chain(POLICY, JUDGES, ask, direction="answers", now=lambda: T0)
    assert result.failures == [Failure("a", kind, message, T0)]
    assert result.judge == "b"


def test_an_answer_with_no_verdict_is_unreadable() -> None:
    ask, _ = fake({"a": Answer("maybe"), "b": Answer("safe")})
    result = run_chain(POLICY, JUDGES, ask, direction="requests", now=lambda: T0)
    assert [(f.judge, f.kind) for f in result.failures] == [("a", "unreadable")]
    assert "maybe" in result.failures[0].message


def test_a_judge_with_no_ready_replica_is_skipped_and_recorded() -> None:
    ask, asked = fake({"b": Answer("safe")})
    result = run_chain(
        POLICY,
        [JudgeRef("a", ready=False), JudgeRef("b")],
        ask,
        direction="requests",
        now=lambda: T0,
    )
    assert asked == ["b"]
    assert result.failures == [Failure("a", "no_replica", "no ready replica", T0)]


def test_a_verdict_is_accepted_as_an_answer() -> None:
    ask, _ = fake({"a": Verdict("unsafe", ("Violent",), refusal=False)})
    result = run_chain(POLICY, JUDGES, ask, direction="answers")
    assert (result.decision, result.refusal, result.score, result.latency_ms) == (
        "refuse",
        False,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("fail", "decision", "opened"), [("open", "allow", True), ("closed", "refuse", False)]
)
def test_all_failed_fail_decides(fail: str, decision: str, opened: bool) -> None:
    policy = Policy(judge_models=("a", "b", "c"), fail=fail)
    ask, asked = fake({"a": Failing("timeout", "t"), "c": Failing("http_error", "h")})
    judges = [JudgeRef("a"), JudgeRef("b", ready=False), JudgeRef("c")]
    result = run_chain(policy, judges, ask, direction="requests", now=ticking())
    assert asked == ["a", "c"]
    assert (result.decision, result.failed_open) == (decision, opened)
    assert (result.verdict, result.judge, result.categories) == (None, None, ())
    assert [(f.judge, f.kind, f.at) for f in result.failures] == [
        ("a", "timeout", T0),
        ("b", "no_replica", T0 + timedelta(seconds=1)),
        ("c", "http_error", T0 + timedelta(seconds=2)),
    ]


def test_no_judges_at_all_is_fail() -> None:
    result = run_chain(
        Policy(judge_models=("a",), fail="closed"), [], lambda j: None, direction="requests"
    )
    assert result.decision == "refuse" and result.failures == []


@pytest.mark.parametrize(("controversial", "decision"), [("safe", "allow"), ("unsafe", "refuse")])
def test_controversial_counts_as_the_policy_says(controversial: str, decision: str) -> None:
    policy = Policy(
        judge_models=("a",), controversial=controversial, refuse_categories=("Violent",)
    )
    ask, _ = fake({"a": Answer("controversial", ("Violent",))})
    result = run_chain(policy, JUDGES[:1], ask, direction="requests")
    assert (result.verdict, result.decision) == ("controversial", decision)


def test_unjudged_direction_asks_nobody() -> None:
    policy = Policy(judge_models=("a",), judge_answers=False)
    ask, asked = fake({})
    result = run_chain(policy, JUDGES, ask, direction="answers")
    assert asked == [] and result.decision == "allow" and not result.judged


def test_unknown_direction() -> None:
    with pytest.raises(ValueError, match="requests, answers"):
        run_chain(BASELINE, JUDGES, lambda j: None, direction="both")


def test_stats_count_failures_per_judge() -> None:
    stats = Stats()
    ask, _ = fake({"a": Failing("timeout", "t1"), "b": Answer("safe")})
    stats.record(run_chain(POLICY, JUDGES, ask, direction="requests", now=lambda: T0))
    later = T0 + timedelta(minutes=1)
    ask, _ = fake({"a": Failing("http_error", "HTTP 500"), "b": Answer("safe")})
    stats.record(run_chain(POLICY, JUDGES, ask, direction="requests", now=lambda: later))
    # Recorded out of order: the last error stays the latest one.
    stats.record_failure(Failure("a", "timeout", "old", T0 - timedelta(hours=1)))
    health = stats.health["a"]
    assert health.failures == 3
    assert health.by_kind == {"timeout": 2, "http_error": 1}
    assert (health.last_kind, health.last_error, health.last_failed_at) == (
        "http_error",
        "HTTP 500",
        later,
    )
    assert "b" not in stats.health


def test_stats_count_decisions_per_judge_verdict_and_category() -> None:
    stats = Stats()
    answers = [
        Answer("unsafe", ("Violent", "PII")),
        Answer("unsafe", ("Violent",)),
        Answer("safe"),
        Answer("unsafe", ("PII",)),
    ]
    for answer in answers:
        ask, _ = fake({"a": answer})
        stats.record(run_chain(POLICY, JUDGES, ask, direction="requests"))
    ask, _ = fake(
        {"a": Failing("timeout", "t"), "b": Failing("timeout", "t"), "c": Failing("timeout", "t")}
    )
    stats.record(run_chain(POLICY, JUDGES, ask, direction="requests"))
    stats.record(run_chain(Policy(("a",), judge_requests=False), JUDGES, ask, direction="requests"))
    assert stats.decisions == {
        DecisionKey("a", "unsafe", "Violent", "refuse"): 2,
        DecisionKey("a", "unsafe", "PII", "refuse"): 1,
        DecisionKey("a", "unsafe", "PII", "allow"): 1,
        DecisionKey("a", "safe", "", "allow"): 1,
        DecisionKey("", "failed", "", "allow"): 1,
    }


def test_stats_take_resets() -> None:
    stats = Stats()
    stats.record_failure(Failure("a", "timeout", "t", T0))
    taken = stats.take()
    assert taken.health["a"].failures == 1
    assert stats.health == {} and not stats.decisions


def test_stats_count_answers_and_keep_the_latest_good_one() -> None:
    stats = Stats()
    ask, _ = fake({"a": Answer("safe", latency_ms=4.0)})
    stats.record(run_chain(POLICY, JUDGES, ask, direction="requests"), at=T0)
    ask, _ = fake({"a": Answer("unsafe", ("Violent",), latency_ms=9.0)})
    stats.record(run_chain(POLICY, JUDGES, ask, direction="requests"), at=T0 - timedelta(1))
    assert stats.answers == {"a": 2}
    # Recorded out of order: the latest answer stays the last good one.
    assert stats.last_good == {"a": (T0, 4.0)}


def test_stats_merge_adds_counts_and_keeps_the_latest() -> None:
    older, newer = Stats(), Stats()
    older.record_failure(Failure("a", "timeout", "old", T0))
    newer.record_failure(Failure("a", "http_error", "new", T0 + timedelta(seconds=1)))
    ask, _ = fake({"a": Answer("safe")})
    older.record(run_chain(POLICY, JUDGES[:1], ask, direction="requests"), at=T0)
    newer.record(run_chain(POLICY, JUDGES[:1], ask, direction="requests"), at=T0)
    newer.merge(older)
    h = newer.health["a"]
    assert h.failures == 2 and h.by_kind == {"timeout": 1, "http_error": 1}
    assert (h.last_kind, h.last_error) == ("http_error", "new")
    assert newer.answers == {"a": 2}
    assert newer.decisions == {DecisionKey("a", "safe", "", "allow"): 2}


def test_stats_empty_until_something_is_counted() -> None:
    stats = Stats()
    assert stats.empty()
    stats.record(run_chain(Policy(("a",), judge_requests=False), JUDGES, lambda j: None,
                           direction="requests"))  # fmt: skip
    assert stats.empty()  # nothing was judged
    stats.record_failure(Failure("a", "timeout", "t", T0))
    assert not stats.empty()
    stats.take()
    assert stats.empty()
