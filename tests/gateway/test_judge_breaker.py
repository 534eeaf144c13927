"""A judge that hangs, through the real gateway: a real sim judge process behind a TCP
proxy the test hangs (tests/faultproxy.py), the real guard (gateway.path.guarding.Guard), the
official openai client.

Under ``fail: open`` a request is answered once the judge's timeout runs out, and the
judge is recorded as timed out; after ``LLMGW_GUARD_BREAKER_FAILURES`` failures the judge
is skipped (the proxy sees no new connection from the gateway) and probed again after
the back-off; it closes once the judge answers again. Under ``fail: closed`` the client
gets 400 and the refusal record says no judge answered, which judge failed and how.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.models import Refusal
from gateway.path.guarding import Guard
from gateway.records.observe import Fanout
from gateway.records.refusals import RefusalRecorder
from gateway.records.state import State
from guard import breaker, records
from guard import checks as guard_checks
from guard import services as guard_services
from guard import snapshots as guard_snapshots
from guard.models import JudgeHealth
from tests.catalog.samples import sim_model, store
from tests.faultproxy import FaultProxy
from tests.gateway.harness import Harness
from tests.gateway.test_metrics import value
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAILURES = 3
# The openai client's own timeout: well past the judge's (1 s) on a loaded machine, well
# under the 10 s every judge had before it had its own.
CLIENT_TIMEOUT = 8


class Setup:
    def __init__(self, h: Harness, proxy: FaultProxy, secret: str, refusals: RefusalRecorder):
        self.h, self.proxy, self.refusals = h, proxy, refusals
        self.api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0,
                                 timeout=CLIENT_TIMEOUT)  # fmt: skip

    def ask(self, say: str = "hello") -> Any:
        return self.api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": say}]
        )

    def policy(self, fail: str) -> None:
        guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"],
                                   "fail": fail}, surface="cli")  # fmt: skip
        guard_snapshots.forget()
        wait_until(lambda: (p := guard_snapshots.policy_in_memory()) is None or p.fail == fail,
                   what="the policy in memory")  # fmt: skip


@pytest.fixture
def setup(settings: Any) -> Iterator[Setup]:
    settings.LLMGW_GUARD_JUDGE_TIMEOUT = 1
    settings.LLMGW_GUARD_BREAKER_FAILURES = FAILURES
    settings.LLMGW_GUARD_BREAKER_BACKOFF = 2
    settings.LLMGW_GUARD_BREAKER_MAX_BACKOFF = 4
    # The checks' own probes alone (a test below turns the probe off the path on).
    settings.LLMGW_GUARD_BREAKER_PROBE_EVERY = 0
    guard_checks.BREAKERS.clear()
    judge, judge_url = launch("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "0",
                              "--tps", "100000")  # fmt: skip
    where = urllib.parse.urlsplit(judge_url)
    proxy = FaultProxy((where.hostname or "127.0.0.1", where.port or 80)).start()
    h = Harness(state=State(), guard=Guard())
    refusals = RefusalRecorder(interval=0.05)
    try:
        engine_url = h.engine("e", say="fine words").url
        guard_model("judge", endpoint=f"http://{proxy.address}")
        store(sim_model("chat", tp=None))
        Replica.objects.create(model_name="chat", state="ready", endpoint=engine_url, profile="sim")
        _, secret = keys.create_key("k")
        guard_snapshots.forget()
        records.start()
        h.serve([], [])
        h.gateway.observer = Fanout(refusals)
        refusals.start()
        yield Setup(h, proxy, secret, refusals)
    finally:
        h.close()
        refusals.stop()
        records.RECORDER.stop()
        proxy.stop()
        stop(judge)
        guard_checks.BREAKERS.clear()


def health() -> JudgeHealth | None:
    return JudgeHealth.objects.filter(judge="judge").first()


def test_a_hung_judge_under_fail_open_delays_requests_by_its_timeout_then_is_skipped(
    setup: Setup, settings: Any
) -> None:
    s = setup
    s.policy("open")
    assert s.ask().choices[0].message.content == "fine words"
    wait_until(lambda: (h := health()) and h.answers >= 1, what="the judge's answer recorded")

    s.proxy.hang()
    # Answered once the judge's timeout ran out (the client's own timeout is far longer
    # than the judge's and far shorter than before), and the judge is recorded as timed out.
    for i in range(FAILURES):
        started = time.monotonic()
        assert s.ask().choices[0].message.content == "fine words"
        took = time.monotonic() - started
        # Delayed by the judge's timeout (1 s), not more: 1.5 s more for a loaded machine.
        assert took < settings.LLMGW_GUARD_JUDGE_TIMEOUT + 1.5, took
        assert guard_checks.BREAKERS.state("judge").failures == i + 1
    h = wait_until(lambda: (h := health()) and h.failures >= FAILURES and h, what="failures")
    assert h.last_error_kind == "timeout", h.last_error

    # Open: the judge is skipped, the gateway does not connect to it at all.
    state = guard_checks.BREAKERS.state("judge")
    assert state.state == breaker.OPEN and state.last_kind == "timeout"
    wait_until(lambda: value("llmgw_guard_judge_breaker", judge="judge", state="open") == 1,
               what="the gauge to say open")  # fmt: skip
    assert value("llmgw_guard_judge_breaker", judge="judge", state="closed") == 0
    held, skipped = s.proxy.held, 0
    for _ in range(5):
        assert s.ask().choices[0].message.content == "fine words"
        if guard_checks.BREAKERS.state("judge").since != state.since:
            break  # the back-off ended meanwhile: a request probed it
        assert s.proxy.held == held, "a judge whose breaker is open was asked"
        skipped += 1
    assert skipped, "no request was made while the breaker was open"
    # After the back-off one request probes it (a new connection reaches the proxy); still
    # hung, so it opens again for longer.
    wait_until(lambda: s.ask() and s.proxy.held > held, timeout=30, what="a probe of the judge")
    wait_until(lambda: guard_checks.BREAKERS.state("judge").backoff == 4, what="a longer back-off")
    # Back: the next probe finds it answering, and it closes.
    s.proxy.heal()
    wait_until(lambda: s.ask() and guard_checks.BREAKERS.state("judge").state == breaker.CLOSED,
               timeout=30, what="the breaker closed")  # fmt: skip
    # The gauge is written off the request's path: it follows within moments.
    wait_until(lambda: value("llmgw_guard_judge_breaker", judge="judge", state="closed") == 1,
               what="the gauge to say closed")  # fmt: skip
    assert value("llmgw_guard_judge_breaker", judge="judge", state="open") == 0
    answers = health().answers  # type: ignore[union-attr]
    s.ask()
    wait_until(lambda: health().answers > answers, what="the judge asked again")  # type: ignore[union-attr]


def test_a_hung_judge_under_fail_closed_refuses_and_the_record_says_no_judge_answered(
    setup: Setup,
) -> None:
    s = setup
    s.policy("closed")
    assert s.ask().choices[0].message.content == "fine words"
    s.proxy.hang()
    ids = []
    for _ in range(FAILURES + 2):
        with pytest.raises(openai.BadRequestError) as refused:
            s.ask()
        assert refused.value.code == "content_filter"
        assert "every judge failed" in refused.value.message
        ids.append(refused.value.response.headers["x-request-id"])
    rows = wait_until(lambda: (r := {x.request_id: x for x in Refusal.objects.all()})
                      and len(r) == len(ids) and r, what="the refusal records")  # fmt: skip
    timed_out, skipped = ids[:FAILURES], ids[FAILURES:]
    for rid in timed_out:
        r = rows[rid]
        assert (r.judged, r.judge, r.verdict) == (False, "", "")
        assert r.failures == [{"judge": "judge", "kind": "timeout"}]
    for rid in skipped:
        # Skipped: its breaker is open; still refused (safety first), at once.
        assert rows[rid].judged is False
        assert rows[rid].failures == [{"judge": "judge", "kind": "breaker_open"}]


def test_a_request_judged_in_and_out_waits_one_judge_timeout_in_all_when_the_judge_hangs(
    setup: Setup, settings: Any
) -> None:
    """Judged on the way in and on the way out under ``fail: open``: with the judge hung,
    the request waited its timeout twice (once per check). The bound is the request's:
    the judge that failed on its request is not asked again for its answer, which fails
    open at once (one connection to the judge, not two)."""
    s = setup
    settings.LLMGW_GUARD_BREAKER_FAILURES = 100  # the breaker stays closed throughout
    timeout = 2.0
    settings.LLMGW_GUARD_JUDGE_TIMEOUT = timeout
    guard_services.set_policy({"judge": {"models": ["judge"]},
                               "directions": ["requests", "answers"], "fail": "open"},
                              surface="cli")  # fmt: skip
    guard_snapshots.forget()
    wait_until(lambda: (p := guard_snapshots.policy_in_memory()) is not None
               and p.judges("answers"), what="the policy in memory")  # fmt: skip
    assert s.ask().choices[0].message.content == "fine words"
    s.proxy.hang()
    for i in range(3):
        held = s.proxy.held
        started = time.monotonic()
        assert s.ask().choices[0].message.content == "fine words"
        took = time.monotonic() - started
        assert took < 2 * timeout, took  # one timeout and the rest, never two
        if i:  # (the first also meets the kept-alive connection the hang stalled)
            assert s.proxy.held == held + 1, "the hung judge was asked again for the answer"
    assert guard_checks.BREAKERS.state("judge").state == breaker.CLOSED


def test_a_judge_back_from_a_hang_closes_its_open_breaker_at_once_under_fail_closed(
    setup: Setup, settings: Any
) -> None:
    """Under ``fail: closed`` an open breaker refuses every request until a probe finds
    the judge answering; the probe came only at the back-off's end (5 s, then longer),
    refusing all the while after the judge was back. Each process now asks an open judge
    itself, off the path, and its first answer closes the breaker: with a back-off of a
    minute, the judge back is used again within the probe's interval."""
    s = setup
    settings.LLMGW_GUARD_BREAKER_BACKOFF = 60
    settings.LLMGW_GUARD_BREAKER_MAX_BACKOFF = 120
    settings.LLMGW_GUARD_BREAKER_PROBE_EVERY = 0.5
    s.policy("closed")
    assert s.ask().choices[0].message.content == "fine words"
    s.proxy.hang()
    for _ in range(FAILURES):
        with pytest.raises(openai.BadRequestError):
            s.ask()
    state = guard_checks.BREAKERS.state("judge")
    assert state.state == breaker.OPEN and state.next_probe is not None
    # Still hung: the probes off the path fail and change nothing, and requests are
    # refused at once (skipped), never waiting on the judge.
    held = s.proxy.held
    wait_until(lambda: s.proxy.held > held, what="a probe off the path")
    with pytest.raises(openai.BadRequestError):
        s.ask()
    assert guard_checks.BREAKERS.state("judge").state == breaker.OPEN
    # Back: closed by the next probe, with no request asking and long before the
    # back-off's end (a minute away).
    s.proxy.heal()
    wait_until(lambda: guard_checks.BREAKERS.state("judge").state == breaker.CLOSED,
               timeout=10, what="the breaker closed by a probe off the path")  # fmt: skip
    assert time.time() < state.next_probe
    assert s.ask().choices[0].message.content == "fine words"
    wait_until(lambda: guard_checks.REPROBER.running() == set(), what="the probing to end")
