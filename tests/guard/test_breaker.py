"""The judges' circuit breaker (guard.breaker): pure transitions, over any sequence of
outcomes and clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guard import breaker as b
from guard.chain import JudgeRef, Stats, run_chain
from guard.client import JudgeFailure
from guard.policy import Policy

CONFIG = b.Config(failures=3, backoff=5.0, max_backoff=40.0)
LEASE = 2.0

# An event: what happened, and how far the clock moved before it (a few go back).
events = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "ok", "fail"]),
        st.one_of(st.floats(0, 20), st.just(0.0), st.floats(-30, 0)),
    ),
    max_size=80,
)


def run(seq: list[tuple[str, float]], config: b.Config = CONFIG) -> list[tuple]:
    """Play events; return (event, now, before, decision, after) for each."""
    s, now, out = b.State(), 1000.0, []
    for what, dt in seq:
        now += dt
        decision = None
        if what == "admit":
            decision, after = b.admit(s, now, LEASE)
        elif what == "ok":
            after = b.succeeded(s, now)
        else:
            after = b.failed(s, now, "timeout", config)
        out.append((what, now, s, decision, after))
        s = after
    return out


@given(events)
@settings(max_examples=400, deadline=None)
def test_every_sequence_keeps_the_breakers_rules(seq: list[tuple[str, float]]) -> None:
    streak = 0  # consecutive failures since the last success
    last_probe: float | None = None
    for what, now, before, decision, after in run(seq):
        assert after.state in b.STATES
        if what == "ok":
            # An answer closes it, whatever it was.
            assert after.state == b.CLOSED and after.failures == 0
            streak, last_probe = 0, None
            continue
        if what == "fail":
            streak += 1
            last_probe = None
            assert after.failures == streak
            if before.state == b.CLOSED:
                # Open exactly at the configured count of failures in a row.
                assert (after.state == b.OPEN) == (streak >= CONFIG.failures)
                if after.state == b.OPEN:
                    assert after.backoff == CONFIG.backoff
                    assert after.next_probe == now + CONFIG.backoff
            elif before.state == b.HALF_OPEN:
                # A failed probe: open again, for longer, never past the most.
                assert after.state == b.OPEN
                assert after.backoff == min(before.backoff * CONFIG.factor, CONFIG.max_backoff)
                assert after.next_probe == now + after.backoff
                assert after.opened_at == before.opened_at
            else:
                assert after.state == b.OPEN and after.next_probe == before.next_probe
            assert after.backoff <= CONFIG.max_backoff
            continue
        # admit
        if before.state == b.CLOSED:
            assert decision == b.ASK and after == before
        elif before.state == b.OPEN:
            clock_back = before.since is not None and now < before.since
            if before.next_probe is not None and now < before.next_probe and not clock_back:
                assert decision == b.SKIP and after == before
            else:
                # The back-off is over: this check probes it.
                assert decision == b.PROBE and after.state == b.HALF_OPEN
        else:
            assert decision in (b.PROBE, b.SKIP)
            if decision == b.PROBE and last_probe is not None and now >= last_probe:
                # One probe at a time: another only once the lease ran out.
                assert now >= last_probe + LEASE
        if decision == b.PROBE:
            last_probe = now
        if decision == b.SKIP:
            assert before.state != b.CLOSED


@given(st.integers(1, 6), st.lists(st.booleans(), max_size=60))
@settings(deadline=None)
def test_a_judge_is_skipped_only_after_n_failures_in_a_row(n: int, outcomes: list[bool]) -> None:
    """With checks asking between outcomes and no time passing: the first skip comes
    right after the n-th failure in a row, never before."""
    config = b.Config(failures=n, backoff=10.0, max_backoff=300.0)
    s, now, streak = b.State(), 0.0, 0
    for ok in outcomes:
        decision, s = b.admit(s, now, LEASE)
        if streak >= n:
            assert decision == b.SKIP
            return
        assert decision == b.ASK
        s = b.succeeded(s, now) if ok else b.failed(s, now, "refused", config)
        streak = 0 if ok else streak + 1


def test_a_failing_judge_is_probed_again_after_a_growing_back_off() -> None:
    config = b.Config(failures=2, backoff=5.0, max_backoff=12.0)
    s = b.failed(b.failed(b.State(), 0.0, "timeout", config), 1.0, "timeout", config)
    assert (s.state, s.since, s.next_probe) == (b.OPEN, 1.0, 6.0)
    assert b.admit(s, 5.9, LEASE)[0] == b.SKIP
    decision, s = b.admit(s, 6.0, LEASE)
    assert decision == b.PROBE and s.state == b.HALF_OPEN
    # Others skip it while the probe runs.
    assert b.admit(s, 6.5, LEASE)[0] == b.SKIP
    s = b.failed(s, 7.0, "timeout", config)
    assert (s.state, s.backoff, s.next_probe, s.opened_at) == (b.OPEN, 10.0, 17.0, 1.0)
    s = b.failed(b.admit(s, 17.0, LEASE)[1], 17.5, "timeout", config)
    assert s.backoff == 12.0  # at most max_backoff
    s = b.succeeded(b.admit(s, 29.5, LEASE)[1], 30.0)
    assert s == b.State(b.CLOSED, 0, 30.0, None, 0.0, None, None, "")


def test_a_probe_whose_check_went_away_lets_another_probe_after_its_lease() -> None:
    s = b.State(b.OPEN, 5, 0.0, 0.0, 5.0, 5.0)
    _, s = b.admit(s, 5.0, LEASE)
    assert b.admit(s, 5.0 + LEASE - 0.01, LEASE)[0] == b.SKIP
    assert b.admit(s, 5.0 + LEASE, LEASE)[0] == b.PROBE
    # Released (asked on another path): the next check probes at once.
    assert b.admit(b.release(s), 5.1, LEASE)[0] == b.PROBE


def test_breakers_tell_listeners_of_each_change_and_forget_a_judge_that_answers() -> None:
    now = [0.0]
    breakers = b.Breakers(
        lambda: b.Config(failures=2, backoff=5.0, max_backoff=300.0), clock=lambda: now[0]
    )
    heard: list[tuple[str, str]] = []
    breakers.listen(lambda judge, s: heard.append((judge, s.state)))
    breakers.failed("j", "timeout")
    assert heard == [] and breakers.admit("j", LEASE) == b.ASK
    breakers.failed("j", "timeout")
    assert heard == [("j", b.OPEN)]
    assert breakers.admit("j", LEASE) == b.SKIP
    assert breakers.peek("other", LEASE) == b.ASK
    now[0] = 5.0
    assert breakers.peek("j", LEASE) == b.PROBE
    assert breakers.admit("j", LEASE) == b.PROBE
    assert breakers.admit("j", LEASE) == b.SKIP
    breakers.succeeded("j")
    assert heard == [("j", b.OPEN), ("j", b.HALF_OPEN), ("j", b.CLOSED)]
    breakers.succeeded("j")
    assert breakers.states() == {}


def test_breakers_under_threads_open_once() -> None:
    breakers = b.Breakers(lambda: b.Config(failures=50, backoff=60.0, max_backoff=300.0))
    opened: list[str] = []
    breakers.listen(lambda judge, s: opened.append(s.state))

    def fail() -> None:
        for _ in range(100):
            breakers.failed("j", "timeout")

    threads = [threading.Thread(target=fail) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert breakers.state("j").failures == 800
    assert opened == [b.OPEN]


# Skipped judges in the chain (guard.chain): failed for the policy's fail, never a verdict.


class Said:
    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.categories = ("Violent",) if verdict == "unsafe" else ()


@given(
    st.lists(st.sampled_from(["skip", "safe", "unsafe", "timeout"]), min_size=1, max_size=4),
    st.sampled_from(["open", "closed"]),
)
@settings(deadline=None)
def test_a_skipped_judge_counts_as_failed_and_fail_closed_still_refuses(
    outcomes: list[str], fail: str
) -> None:
    names = [f"j{i}" for i in range(len(outcomes))]
    policy = Policy(judge_models=tuple(names), refuse_categories=("Violent",), fail=fail)
    script = dict(zip(names, outcomes, strict=True))

    def ask(ref: JudgeRef) -> Any:
        what = script[ref.name]
        if what == "skip":
            raise b.Skipped("its breaker is open")
        if what == "timeout":
            raise JudgeFailure("timeout", "no answer in time")
        return Said(what)

    result = run_chain(policy, [JudgeRef(n) for n in names], ask, direction="requests",
                       now=lambda: datetime(2026, 1, 1, tzinfo=UTC))  # fmt: skip
    first = next((o for o in outcomes if o in ("safe", "unsafe")), None)
    failed = outcomes[: outcomes.index(first)] if first else outcomes
    assert [f.kind for f in result.failures] == [
        b.SKIPPED if o == "skip" else "timeout" for o in failed
    ]
    if first is None:
        # No judge answered: the policy's fail decides; closed refuses, skipped or not.
        assert result.judge is None and result.verdict is None
        assert result.decision == ("allow" if fail == "open" else "refuse")
    else:
        assert result.verdict == first
        assert result.decision == ("refuse" if first == "unsafe" else "allow")
    # A skipped judge was not asked: nothing is counted against its health.
    stats = Stats()
    stats.record(result)
    assert set(stats.health) == {f.judge for f in result.failures if f.kind != b.SKIPPED}


def test_the_breakers_numbers_come_from_the_settings_alone() -> None:
    """LLMGW_GUARD_BREAKER_* are written once, in settings.py: the breaker has no defaults
    of its own to drift from them, and takes at least one failure and a moment's back-off."""
    with pytest.raises(TypeError):
        b.Config()  # type: ignore[call-arg]
    given_ = SimpleNamespace(
        LLMGW_GUARD_BREAKER_FAILURES=7,
        LLMGW_GUARD_BREAKER_BACKOFF=9,
        LLMGW_GUARD_BREAKER_MAX_BACKOFF=90,
    )
    assert b.Config.from_settings(given_) == b.Config(failures=7, backoff=9.0, max_backoff=90.0)
    given_.LLMGW_GUARD_BREAKER_FAILURES = 0
    assert b.Config.from_settings(given_).failures == 1
